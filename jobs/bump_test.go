package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// A job that slept until its moment and lost its slot to a priority job
// meanwhile is admitted again before it sends: it never goes on a slot that
// is not its own. Not parallel: the priority job must come within the
// 100 ms before the victim's slot.
func TestSleepingJobLosesItsSlotToPriority(t *testing.T) {
	rdb := shared.Server.ClientOn(t, shared.DB(t))
	lim, err := throttle.New(rdb, throttle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := throttle.NewQuota("mkt", throttle.Window{Limit: 10, Per: time.Hour})
	b, _ := throttle.NewBucket("gw", 10, 1) // a slot every 100 ms
	th := &Throttle{
		Limiter: lim,
		Rules:   Rules{Policies: map[string]*throttle.Quota{"mkt": q}, Providers: map[string]Route{"gw": {Bucket: b}}},
		Metrics: NewMetrics(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pacing:  Pacing{InlineWait: 2 * time.Second, Book: true},
	}
	ctx := context.Background()
	route := func(id string) job {
		j, err := th.route(ctx, id, message.Notification{Recipient: "r-" + id, Policy: "mkt", Provider: "gw", Template: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		j.book = true
		return j
	}
	admit := func(j job) throttle.Decision {
		r := j.request()
		r.MaxWait = th.InlineWait
		d, err := lim.Book(ctx, r, j.booking(false))
		if err != nil || !d.Allowed() {
			t.Fatalf("%s: %+v, %v", j.id, d, err)
		}
		return d
	}
	admit(route("first")) // goes now
	victim := route("victim")
	before := admit(victim) // claims the slot 100 ms ahead and would sleep
	for i := range 5 {
		admit(route(fmt.Sprint("bulk", i)))
	}
	otp := route("otp")
	otp.priority = true
	if d := admit(otp); !d.At().Equal(before.At()) {
		t.Fatalf("the priority job: %+v; want the victim's slot at %s", d, before.At())
	}
	if err := th.stillHolds(ctx, &victim); err != nil {
		t.Fatalf("the victim, admitted again: %v", err)
	}
	if n := counterValue(t, th.Metrics.Bookings, "bumped"); n != 1 {
		t.Errorf("bumped %v times, want 1", n)
	}
	if n := counterValue(t, th.Metrics.Bookings, "released"); n != 1 {
		t.Errorf("released %v times, want 1 (the victim gave back its quota entry)", n)
	}
	r := victim.request()
	if held, err := lim.HasSlot(ctx, r); err != nil || !held {
		t.Errorf("the victim holds no slot after its second admission: %v %v", held, err)
	}
}
