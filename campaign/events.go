package campaign

import (
	"context"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// recordWithin bounds the recording of a batch's accepted events.
const recordWithin = 5 * time.Second

// accepted records the accepted event of each notification ids that a
// batch enqueued (enqueue.lua), in one round trip; one that was already
// there (a line repeated, a fan-out resumed) has its event already.
// Recorded after the batch: a worker that dies
// between the two leaves those notifications without it (their other
// events come), where one recorded before would name notifications never
// enqueued. A failure is logged: the notifications are enqueued.
func (b *batchRun) accepted(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	events := make([]lifecycle.Event, len(ids))
	for i, id := range ids {
		events[i] = lifecycle.Event{Type: lifecycle.Accepted, Message: id, Tenant: b.c.Tenant,
			Via: lifecycle.ViaCampaign, Campaign: b.tick.String()}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWithin)
	defer cancel()
	if err := b.r.opts.Events.Record(ctx, events...); err != nil {
		b.r.log.Warn("campaign: accepted events not recorded", "campaign", b.tick.Campaign, "tick", b.tick.Time(), "err", err)
	}
}
