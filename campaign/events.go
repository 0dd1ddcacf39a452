package campaign

import (
	"context"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// recordWithin bounds the recording of a batch's accepted events.
const recordWithin = 5 * time.Second

// accepted records the accepted event of each notification a batch
// enqueued, in one round trip: after the batch, not before, which would
// name notifications never enqueued. A failure is logged.
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
