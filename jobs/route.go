package jobs

// A job is a decoded notification routed to its rules: its policy's quota
// and settings, its provider's bucket and sender, and the request that
// admits it through all of them.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/throttle"
)

// job is a decoded, routed notification.
type job struct {
	id     string
	n      message.Notification
	quota  *throttle.Quota // nil if the policy has calendar windows only
	local  []throttle.Take // calendar windows, then quiet hours, in the recipient's zone
	policy PolicySettings
	route  Route
	book   bool // it books its moment (Throttle.Book)
	// bookAhead is Throttle.BookAhead for a job that books.
	bookAhead time.Duration
	// bumps counts the slots this run of the job lost to priority traffic
	// while it slept (see stillHolds).
	bumps    int
	priority bool   // it came from a priority queue
	weight   int    // its tenant's weight, at least 1
	queue    string // the queue it came from
	// tried says a send of it was tried before (it failed, or its worker
	// died in it): the provider may have taken it, so it is never folded
	// into a digest, only sent under its own ID (the provider's
	// Idempotency-Key).
	tried bool
	// once, when not 0, says its admission looks for its sent marker
	// (Throttle.Sent), which lasts once.
	once time.Duration
	// headers are its task's headers, where it keeps that it is in its
	// tenant's line (see inLine); nil for a task enqueued without any.
	headers map[string]string
	// asked is when, on this process's monotonic clock, its last
	// admission call was sent.
	asked time.Time
	// due is the earliest moment its admission can have let it go, on the
	// same clock: asked plus the wait it was told. The reply comes later;
	// counted from the reply, a stall between the script's run and the
	// reply's reading (a stopped or starved process) would go unseen, and
	// the send would leave that much later than its moment. A slow round
	// trip makes a send look later than it is, never earlier (see onTime).
	due time.Time
	// req is its request, built once by request.
	req *throttle.Request
}

// route finds a notification's policy and provider.
func (t *Throttle) route(ctx context.Context, id string, n message.Notification) (job, error) {
	rs := t.rules()
	j := job{id: id, n: n, quota: rs.Policies[n.Policy], policy: rs.Settings[n.Policy], weight: max(1, rs.Weights[n.Tenant]), once: t.Sent.ttl()}
	if j.quota == nil && len(j.policy.Calendars) == 0 {
		return job{}, fmt.Errorf("policy %q is not defined: %w", n.Policy, message.ErrBadPayload)
	}
	var err error
	if j.local, err = t.zones.takes(j.policy, n.Policy, n.TZ, n.Recipient, time.Now()); err != nil {
		return job{}, err
	}
	var ok bool
	if j.route, ok = rs.Providers[n.Provider]; !ok {
		return job{}, fmt.Errorf("provider %q is not defined: %w", n.Provider, message.ErrBadPayload)
	}
	// A recipient its provider refuses (providers.Addresser) is archived
	// as malformed, unsent.
	if a, ok := j.route.Provider.(providers.Addresser); ok {
		if err := a.CheckRecipient(n.Recipient); err != nil {
			return job{}, fmt.Errorf("recipient: %v: %w", err, message.ErrBadPayload)
		}
	}
	j.queue, _ = asynq.GetQueueName(ctx)
	// A message that may fold into a digest does not book:
	// docs/booking.md, "Digests and windows".
	j.book = t.Book && !(j.policy.Digest && t.Digests != nil)
	j.priority, j.bookAhead = t.PriorityQueues[asynqdb.BaseQueue(j.queue)], t.BookAhead
	retried, _ := asynq.GetRetryCount(ctx) // failures only: deferrals do not count
	j.tried = retried > 0
	return j, nil
}

// request is the job's admission: its recipient's policy and its provider's
// bucket, in its tenant's share, unless its sent marker exists (see admit).
// A rule in shadow mode holds nothing: the policy only counts, the bucket
// is not taken (see shadow). It is built at the first call, once the job is
// routed; each call returns a copy whose takes the caller must not change
// in place.
func (j *job) request() throttle.Request {
	if j.req == nil {
		r := j.build()
		j.req = &r
	}
	return *j.req
}

// build makes the job's request (see request).
func (j *job) build() throttle.Request {
	r := throttle.Request{ID: j.id, CheckDone: j.once != 0, DoneIfHeld: j.quota != nil && j.quota.Longest() >= j.once}
	if j.quota != nil {
		r.Takes = append(r.Takes, throttle.Take{Rule: j.quota, Subject: j.n.Recipient, Shadow: j.policy.Shadow})
	}
	for _, t := range j.local {
		t.Shadow = j.policy.Shadow
		r.Takes = append(r.Takes, t)
	}
	if !j.route.Shadow {
		r.Takes = append(r.Takes, throttle.Take{Rule: j.route.Bucket, Subject: j.n.Provider})
	}
	for _, q := range j.policy.CountsToward {
		r.Takes = append(r.Takes, throttle.Take{Rule: q, Subject: j.n.Recipient, CountOnly: true})
	}
	return r
}

// booking is what the job's reservation says beyond its request (see
// throttle.Booking): its share, horizon and deadline, whether work waits
// unseen behind it (backlog), and whether it is back from a place in line.
func (j *job) booking(backlog bool) throttle.Booking {
	b := throttle.Booking{Priority: j.priority, Tenant: j.n.Tenant, Weight: j.weight, Horizon: j.bookAhead,
		Backlog: backlog, Back: j.back()}
	b.Deadline, _ = j.deadline()
	return b
}

// back reports whether the job is back from a place in its tenant's line.
func (j *job) back() bool { return j.headers == nil || j.headers[message.LineHeader] == "1" }

// inLine notes in the job's task that it holds a place in its tenant's
// line; asynq keeps the note with the deferral the job returns.
func (j *job) inLine() {
	if j.headers != nil {
		j.headers[message.LineHeader] = "1"
	}
}

// deadline returns the latest moment j may go, if it has one (else the
// zero time), and what sets it: its send-by, or its policy's max delay
// after it was queued (a scheduled one: after its moment, SendAt),
// whichever comes first.
func (j *job) deadline() (time.Time, string) {
	var at time.Time
	var what string
	if j.n.SendBy != nil {
		at, what = *j.n.SendBy, "send-by "+j.n.SendBy.UTC().Format(time.RFC3339)
	}
	if j.policy.MaxDelay > 0 && j.n.Queued != nil {
		from := *j.n.Queued
		if j.n.SendAt != nil && j.n.SendAt.After(from) {
			from = *j.n.SendAt
		}
		if m := from.Add(j.policy.MaxDelay); at.IsZero() || m.Before(at) {
			at, what = m, fmt.Sprintf("max_delay %s of policy %s (until %s)",
				timefmt.Duration(j.policy.MaxDelay), j.n.Policy, m.UTC().Format(time.RFC3339))
		}
	}
	return at, what
}

// recipientOnly is the part of the request to give back when the provider
// was reached: the recipient got nothing, but the provider did the work.
func (j *job) recipientOnly() throttle.Request {
	r := j.request()
	r.Takes = slices.DeleteFunc(slices.Clone(r.Takes), func(t throttle.Take) bool { return t.Rule == throttle.Rule(j.route.Bucket) })
	return r
}

// overCap reports whether take i of j's request is one of its policy's
// windows (rolling or calendar): quiet hours and the provider hold a
// message, but are no cap to be over.
func (j *job) overCap(i int) bool {
	if i < 0 {
		return false
	}
	if j.quota != nil {
		if i == 0 {
			return true
		}
		i--
	}
	return i < len(j.policy.Calendars)
}
