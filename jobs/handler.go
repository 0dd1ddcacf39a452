package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/throttle"
)

// Route is a provider as the throttle needs it: its bucket and its sender.
type Route struct {
	Bucket   *throttle.Bucket
	Provider Provider
	// Shadow puts the bucket in shadow mode: it is not taken, and what it
	// would have done is logged and counted (Metrics.Shadow).
	Shadow bool
}

// Throttle is the asynq handler of notification and digest tasks (see
// ProcessTask). It admits each job through its recipient's policy and its
// provider's bucket in one script call and then either sends it, sleeps
// until a reserved provider token is due (short waits), or defers it by
// exactly the delay the script returned. After the send it gives back what
// an undelivered message took, and marks a delivered one sent so that a
// redelivery of it completes without sending. Its fields are set once,
// before use.
type Throttle struct {
	Limiter   *throttle.Limiter
	Policies  map[string]*throttle.Quota
	Providers map[string]Route
	// Settings are, by policy, what the policy says beyond its windows; a
	// policy without an entry defers with no max delay.
	Settings map[string]PolicySettings
	// Weights are tenants' weights (throttle.Request.Weight) by tenant
	// (Notification.Tenant); a tenant without an entry weighs 1.
	Weights map[string]int
	// InlineWait is the longest wait slept in the worker rather than
	// deferred. Zero defers every wait. With Book, a booked job is woken
	// early by up to InlineWait - 1s (at most 1.5s), so that it claims its
	// moment before it comes and sleeps the rest: asynq wakes a task up to
	// a second either side of the moment asked for. 2.5s or more lets it.
	InlineWait time.Duration
	// Book makes a job that may not go within InlineWait book the earliest
	// moment its recipient's policy and its provider allow (see
	// throttle.Request.Book) and wait for it: one deferral per job, in
	// order, instead of waking with every other waiting job to find the
	// next slot taken.
	Book bool
	// BookAhead, with Book, is how far ahead a job may hold its provider's
	// slot (throttle.Request.BookAhead): a job further back is given a place
	// in its tenant's line, noted in its asynq task hash, and books when it
	// comes back at that place. Zero books as far ahead as needed.
	BookAhead time.Duration
	// PriorityQueues names the queues whose jobs skip the providers' lines
	// and may take their reserve (throttle.Bucket.WithReserve).
	PriorityQueues map[string]bool
	// OnBooked, if set, is called with every booking a job makes (the demo
	// prints them); the log has one line per rule every 10s.
	OnBooked func(Notification, throttle.Decision)
	// Stopping is closed when the worker starts to shut down: jobs still
	// waiting for their moment give their admission back and are deferred.
	Stopping <-chan struct{}
	// Sent holds the sent markers (NewSentMarks on the limiter's client and
	// prefix). Nil turns them off, and with them the protection against
	// sending a redelivered job twice; ProcessTask warns about it.
	Sent *SentMarks
	// Digests folds the messages of digest policies (PolicySettings.Digest)
	// over their cap. Nil defers them.
	Digests *Digests
	// Holder, if set, is asked just before each send whether this worker
	// still holds the task (recovery.Recovery.Holds): one taken for dead
	// after a long silence has had its tasks handed to another worker,
	// which sends them. Nil sends without asking.
	Holder Holder
	// Screen keeps scoped pauses and suppressed addresses for the providers
	// that are Scopers (see settle.go). Nil: a scoped pause defers only the
	// job that met it, and nothing is suppressed.
	Screen  *Screen
	Metrics *Metrics
	Log     *slog.Logger

	defaults sync.Once
	bookings bookingLog
	swapped  atomic.Pointer[Rules] // set by Swap
	zones    zones
}

// Rules are what a Throttle routes notifications by: Throttle's fields of
// the same names at first, all of them replaced at once by Swap.
type Rules struct {
	Policies  map[string]*throttle.Quota
	Providers map[string]Route
	Settings  map[string]PolicySettings
	Weights   map[string]int
}

// Swap makes r the rules of every job routed from now on (a config
// reload): jobs already routed keep theirs. Safe while jobs run.
func (t *Throttle) Swap(r Rules) { t.swapped.Store(&r) }

// rules returns the rules in effect.
func (t *Throttle) rules() *Rules {
	if r := t.swapped.Load(); r != nil {
		return r
	}
	return &Rules{Policies: t.Policies, Providers: t.Providers, Settings: t.Settings, Weights: t.Weights}
}

// PolicySettings are what a policy says beyond its windows (see
// config.Policy).
type PolicySettings struct {
	// Drop archives a message that its policy's windows hold back ("over
	// the cap") at once, instead of deferring it.
	Drop bool
	// MaxDelay, if set, is the longest a message may wait after it was
	// queued (Notification.Queued): one whose moment would be later
	// expires, as one past its send-by does.
	MaxDelay time.Duration
	// Digest folds a message that its policy's windows hold back into the
	// recipient's next digest (see Digests) instead of deferring it; with
	// Throttle.Digests nil, it is deferred.
	Digest bool
	// Shadow puts the policy in shadow mode: its windows count every
	// message but hold none back; what they would have done is logged and
	// counted (Metrics.Shadow).
	Shadow bool
	// CountsToward are other policies' quotas that each message counts
	// toward without being held back by them (throttle.Take.CountOnly),
	// in the same admission.
	CountsToward []*throttle.Quota
	// Calendars are the policy's calendar windows and Quiet its quiet hours
	// (nil: none), in the recipient's time zone: the notification's
	// (Notification.TZ), else Zone (nil: UTC). A message in quiet hours is
	// held until they end, never dropped.
	Calendars []*throttle.Calendar
	Quiet     *throttle.QuietHours
	Zone      *time.Location
}

// job is a decoded, routed notification.
type job struct {
	id     string
	n      Notification
	quota  *throttle.Quota // nil if the policy has calendar windows only
	local  []throttle.Take // calendar windows, then quiet hours, in the recipient's zone
	policy PolicySettings
	route  Route
	sent   string // the key of its sent marker, "" when markers are off
	book   bool   // it books its moment (Throttle.Book)
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
}

// Holder reports whether this worker still holds the task of an asynq
// handler's context: nil if it does, an error if it does not or cannot
// tell.
type Holder interface {
	Holds(ctx context.Context) error
}

// handedOverDelay defers a job whose task this worker no longer holds: the
// retry its error makes asynq schedule must not run before the other
// worker's run of the task has ended, for its sent marker to stop it.
// asynq's lease (30 s) bounds a run that worker's own silence could cut
// short; a minute covers that and a send's timeout.
const handedOverDelay = time.Minute

// ProcessTask runs a task of the throttle's own types: a notification
// (TypeNotify), which it decodes, admits, sends through its provider and
// settles, or a digest (TypeDigest, see Digests). Register it for both:
//
//	mux.Handle(jobs.TypeNotify, th)
//	mux.Handle(jobs.TypeDigest, th)
//
// A task of another type is archived. A nil Metrics or Log is replaced by a
// private registry and slog.Default before the first task runs. Safe for
// concurrent use, as asynq's workers call it.
func (t *Throttle) ProcessTask(ctx context.Context, task *asynq.Task) error {
	t.defaults.Do(t.setDefaults)
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return errors.New("jobs: no task ID in the context: Throttle runs inside an asynq server")
	}
	switch task.Type() {
	case TypeNotify:
		return t.notify(ctx, id, task)
	case TypeDigest:
		return t.sendDigest(ctx, id, task)
	}
	return fmt.Errorf("jobs: Throttle runs %s and %s tasks, not %q: %w", TypeNotify, TypeDigest, task.Type(), asynq.SkipRetry)
}

// notify runs a notification task: decode, route, admit, send, settle.
func (t *Throttle) notify(ctx context.Context, id string, task *asynq.Task) error {
	j, err := t.load(ctx, id, task)
	if err != nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		t.Log.Warn("archiving malformed notification", "task", id, "err", err)
		return fmt.Errorf("malformed notification: %v: %w", err, asynq.SkipRetry)
	}
	if j.policy.Shadow || j.route.Shadow {
		t.shadow(ctx, j)
	}
	digest := j.policy.Digest && t.Digests != nil
	if digest {
		if err := t.foldedBefore(ctx, j); err != nil {
			return ignoreDone(err)
		}
	}
	if err := t.admit(ctx, j); err != nil {
		return ignoreDone(err)
	}
	if err := t.holds(ctx, j); err != nil {
		return err
	}
	if err := t.screen(ctx, j); err != nil {
		return err
	}
	if digest && !j.tried {
		// From here the provider may take it: never fold it after.
		if err := t.Digests.attempt(ctx, j.id); err != nil {
			t.release(j.request())
			return &Deferral{Delay: 5 * time.Second, Reason: "digest unavailable: " + err.Error()}
		}
	}
	return t.deliver(ctx, j)
}

// load decodes and routes a notification task. The job lives on the heap
// and goes by pointer, and the admission's outcome is handled in a function
// of its own (decided), so that the frames on the stack during the
// admission's round trip stay small: asynq runs each task in a new
// goroutine, whose stack is copied when it outgrows its first size, and
// that copy, made once per task inside the admission, cost about 6 µs of
// CPU per task (BenchmarkThroughputVsPlain's profile: runtime.newstack).
func (t *Throttle) load(ctx context.Context, id string, task *asynq.Task) (*job, error) {
	n, err := Decode(task.Payload())
	if err != nil {
		return nil, err
	}
	j, err := t.route(ctx, id, n)
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// setDefaults fills in what ProcessTask documents, once.
func (t *Throttle) setDefaults() {
	if t.Metrics == nil {
		t.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if t.Log == nil {
		t.Log = slog.Default()
	}
	if t.Sent == nil {
		t.Log.Warn("sent markers are off (Throttle.Sent is nil): a job redelivered after its send succeeded is sent again")
	}
}

// route finds a notification's policy and provider.
func (t *Throttle) route(ctx context.Context, id string, n Notification) (job, error) {
	rs := t.rules()
	j := job{id: id, n: n, quota: rs.Policies[n.Policy], policy: rs.Settings[n.Policy], weight: max(1, rs.Weights[n.Tenant])}
	if t.Sent != nil {
		j.sent = t.Sent.Key(id)
	}
	if j.quota == nil && len(j.policy.Calendars) == 0 {
		return job{}, fmt.Errorf("policy %q is not defined: %w", n.Policy, ErrBadPayload)
	}
	var err error
	if j.local, err = t.zones.takes(j.policy, n.Policy, n.TZ, n.Recipient, time.Now()); err != nil {
		return job{}, err
	}
	var ok bool
	if j.route, ok = rs.Providers[n.Provider]; !ok {
		return job{}, fmt.Errorf("provider %q is not defined: %w", n.Provider, ErrBadPayload)
	}
	j.queue, _ = asynq.GetQueueName(ctx)
	j.book, j.priority, j.bookAhead = t.Book, t.PriorityQueues[j.queue], t.BookAhead
	retried, _ := asynq.GetRetryCount(ctx) // failures only: deferrals do not count
	j.tried = retried > 0
	return j, nil
}

// request is the job's admission: its recipient's policy and its provider's
// bucket, in its tenant's share, unless its sent marker exists (see admit).
// A rule in shadow mode holds nothing: the policy only counts, the bucket
// is not taken (see shadow).
func (j *job) request() throttle.Request {
	r := throttle.Request{ID: j.id, Done: j.sent, Book: j.book, Priority: j.priority, Tenant: j.n.Tenant, Weight: j.weight}
	if j.quota != nil {
		r.Takes = append(r.Takes, throttle.Take{Rule: j.quota, Subject: j.n.Recipient, CountOnly: j.policy.Shadow})
	}
	for _, t := range j.local {
		if _, quiet := t.Rule.(*throttle.Quiet); quiet && j.policy.Shadow {
			continue // holds, and counts nothing: in shadow mode, only reported
		}
		t.CountOnly = j.policy.Shadow
		r.Takes = append(r.Takes, t)
	}
	if !j.route.Shadow {
		r.Takes = append(r.Takes, throttle.Take{Rule: j.route.Bucket, Subject: j.n.Provider})
	}
	for _, q := range j.policy.CountsToward {
		r.Takes = append(r.Takes, throttle.Take{Rule: q, Subject: j.n.Recipient, CountOnly: true})
	}
	if j.book {
		r.Deadline, _ = j.deadline()
		if j.bookAhead > 0 {
			r.BookAhead, r.TaskKey = j.bookAhead, asynqdb.TaskKey(j.queue, j.id)
		}
	}
	return r
}

// deadline returns the latest moment j may go, if it has one (else the
// zero time), and what sets it: its send-by, or its policy's max delay
// after it was queued, whichever comes first.
func (j *job) deadline() (time.Time, string) {
	var at time.Time
	var what string
	if j.n.SendBy != nil {
		at, what = *j.n.SendBy, "send-by "+j.n.SendBy.UTC().Format(time.RFC3339)
	}
	if j.policy.MaxDelay > 0 && j.n.Queued != nil {
		if m := j.n.Queued.Add(j.policy.MaxDelay); at.IsZero() || m.Before(at) {
			at, what = m, fmt.Sprintf("max_delay %s of policy %s (until %s)",
				throttle.FormatDuration(j.policy.MaxDelay), j.n.Policy, m.UTC().Format(time.RFC3339))
		}
	}
	return at, what
}

// recipientOnly is the part of the request to give back when the provider
// was reached: the recipient got nothing, but the provider did the work.
func (j *job) recipientOnly() throttle.Request {
	r := j.request()
	r.Takes = slices.DeleteFunc(r.Takes, func(t throttle.Take) bool { return t.Rule == throttle.Rule(j.route.Bucket) })
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

// errSentBefore is admit's answer for a job an earlier delivery of its task
// sent, and errFolded for one folded into a digest: the task completes
// without being sent (again).
var (
	errSentBefore = errors.New("sent before")
	errFolded     = errors.New("folded into a digest")
)

// ignoreDone turns errSentBefore and errFolded into nil: the task is done.
func ignoreDone(err error) error {
	if errors.Is(err, errSentBefore) || errors.Is(err, errFolded) {
		return nil
	}
	return err
}

// admit returns nil when j may be sent now (after sleeping for a reserved
// token if need be), errSentBefore when an earlier delivery of its task was
// sent, and otherwise the error that defers or archives it.
//
// The sent marker is checked by the admission itself (throttle.Request.Done):
// a redelivery whose first delivery was sent takes nothing, since its quota
// entries would be found its own but a bucket forgets its holders after
// throttle.Options.Remember, and what the first delivery took stays taken.
// On a single node that costs no round trip of its own.
func (t *Throttle) admit(ctx context.Context, j *job) error {
	var d throttle.Decision
	if err := untilAnswered(ctx, t.Stopping, func() error { return t.decide(ctx, j, &d) }); err != nil {
		// Redis trouble is not the job's fault: defer without using a retry.
		t.Log.Warn("admission failed", "task", j.id, "err", err)
		return &Deferral{Delay: 5 * time.Second, Reason: "throttle unavailable: " + err.Error()}
	}
	return t.decided(ctx, j, &d)
}

// decide is one admission call of j, timed.
func (t *Throttle) decide(ctx context.Context, j *job, d *throttle.Decision) error {
	start := time.Now()
	r := j.request()
	r.MaxWait = t.InlineWait
	var err error
	*d, err = t.Limiter.Admit(ctx, r)
	t.Metrics.observe(time.Since(start).Seconds())
	return err
}

// decided acts on j's decision d: send (after a wait within InlineWait),
// defer, book, fold, drop or expire.
func (t *Throttle) decided(ctx context.Context, j *job, d *throttle.Decision) error {
	if d.Done {
		t.Metrics.inc(t.Metrics.Duplicates, j.n.Provider)
		t.Log.Info("already sent: completing without sending again", "task", j.id, "recipient", Redact(j.n.Recipient))
		return errSentBefore
	}
	if j.policy.Digest && t.Digests != nil && !j.tried && !d.Allowed && j.overCap(d.TakeIndex) {
		if d.Holds() {
			t.release(j.request())
		}
		return t.fold(ctx, *j, d.At())
	}
	if j.policy.Drop && !d.Allowed && j.overCap(d.TakeIndex) {
		if d.Holds() {
			t.release(j.request())
		}
		t.Metrics.inc(t.Metrics.Dropped, j.n.Policy)
		t.Log.Info("dropped", "task", j.id, "recipient", Redact(j.n.Recipient), "policy", j.n.Policy, "earliest", d.At())
		return fmt.Errorf("dropped: over %s: %w", t.denier(j, d), asynq.SkipRetry)
	}
	if dl, what := j.deadline(); d.Expired || !dl.IsZero() && d.At().After(dl) {
		if d.Holds() {
			t.release(j.request())
		}
		t.Metrics.inc(t.Metrics.Expired, j.n.Policy)
		t.Log.Info("expired", "task", j.id, "recipient", Redact(j.n.Recipient), "deadline", what, "earliest", d.At())
		return fmt.Errorf("expired: %s passed before %s would allow it (earliest %s): %w",
			what, t.denier(j, d), d.At().UTC().Format(time.RFC3339), asynq.SkipRetry)
	}
	if d.Booked {
		return t.booked(j, d)
	}
	if !d.Allowed {
		t.Metrics.inc(t.Metrics.Deferred, t.denier(j, d))
		return &Deferral{Delay: d.Delay, Reason: "throttled by " + t.denier(j, d)}
	}
	t.Metrics.inc(t.Metrics.Admitted, j.n.Policy, j.n.Provider)
	if !d.Claimed.IsZero() {
		t.Metrics.inc(t.Metrics.Bookings, "claimed")
		t.Metrics.Lateness.Observe(max(0, d.At().Sub(d.Claimed)).Seconds())
	}
	if d.Delay <= 0 {
		return nil
	}
	timer := time.NewTimer(d.Delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return t.stillHolds(ctx, j)
	case <-ctx.Done():
	case <-t.Stopping:
	}
	t.release(j.request())
	return &Deferral{Delay: d.Delay, Reason: "worker stopped before the provider token was due"}
}

// holdsWithin bounds the check of a job's slot before it sends.
const holdsWithin = 100 * time.Millisecond

// maxBumps is how many times a job that lost its slot while it slept is
// admitted again at once before it is deferred instead.
const maxBumps = 3

// stillHolds, after a job slept until its moment, checks that its provider
// slot is still its own: a priority job may have taken it (see
// throttle.Request.Priority). If it was, what the job still holds is given
// back and it is admitted again (its recipient's windows are checked
// again at its new moment).
func (t *Throttle) stillHolds(ctx context.Context, j *job) error {
	// An answer that comes late (Redis slow or restarting) would send late,
	// after the moments of the jobs behind it: past holdsWithin, the job
	// gives its slot back and is admitted again, from now.
	hctx, cancel := context.WithTimeout(ctx, holdsWithin)
	held, err := t.Limiter.Holds(hctx, j.request())
	cancel()
	if err == nil && held {
		return nil
	}
	t.release(j.request())
	if err != nil {
		t.Log.Warn("could not check the job's slot in time before sending: admitting it again", "task", j.id, "err", err)
	} else {
		t.Metrics.inc(t.Metrics.Bookings, "bumped")
	}
	if j.bumps++; j.bumps > maxBumps {
		return &Deferral{Delay: time.Second, Reason: "its provider slot was lost " + fmt.Sprint(maxBumps) + " times before it sent (to priority traffic, or a check that did not answer in time)"}
	}
	return t.admit(ctx, j)
}

// wakeEarly is how much earlier than its moment a booked job asks to be
// woken (when InlineWait allows): asynq wakes a task between a second before
// and a second after the moment asked for (whole-second scores, a forwarder
// that looks every second), so the job wakes 2.5 s to 0.5 s before its
// moment, claims it, and sleeps the rest.
const wakeEarly = 1500 * time.Millisecond

// booked defers a job to the moment it booked, woken early (wakeEarly, at
// most InlineWait - 1s) so that its claim, within InlineWait of the moment,
// finds the moment not yet come. A claim that comes late still goes (or
// books again where going late would break a rule), but a job held back by
// its recipient's windows is booked right behind the one before it, and
// going late would put the two in one window.
func (t *Throttle) booked(j *job, d *throttle.Decision) error {
	rule := t.denier(j, d)
	t.Metrics.inc(t.Metrics.Deferred, rule)
	event, what := "made", "booked"
	switch {
	case d.Queued:
		event, what = "queued", "in line"
	case d.Rebooked:
		event = "rebooked"
	}
	t.Metrics.inc(t.Metrics.Bookings, event)
	t.Metrics.BookedAhead.WithLabelValues(rule).Set(d.Delay.Seconds())
	t.bookings.note(t.Log, rule, *d)
	if t.OnBooked != nil {
		t.OnBooked(j.n, *d)
	}
	early := min(max(t.InlineWait-time.Second, 0), wakeEarly)
	return &Deferral{
		Delay:  d.Delay,
		Wake:   max(d.Delay-early, 0),
		Booked: true,
		Reason: fmt.Sprintf("%s for %s by %s: %d ahead", what, clockTime(d.At(), d.Now), rule, d.Ahead),
	}
}

// holds returns nil if j may be sent here, and otherwise the deferral that
// leaves it to the worker it was handed to. What j's admission took stays:
// it belongs to the task ID, which that worker's admission found its own.
// The error makes asynq retry the task rather than delete it, should the
// other worker still be running it (see internal/asynqdb, item 5).
func (t *Throttle) holds(ctx context.Context, j *job) error {
	if t.Holder == nil {
		return nil
	}
	err := t.Holder.Holds(ctx)
	if err == nil {
		return nil
	}
	t.Log.Warn("not sending: the task may have been handed to another worker while this one was silent",
		"task", j.id, "recipient", j.n.Recipient, "err", err)
	return &Deferral{Delay: handedOverDelay, Reason: "handed over: " + err.Error()}
}

// denier names the rule that set a decision's delay, with its limit:
// "policy marketing (3 per 168h)" or "provider sms (100/s burst 20)".
func (t *Throttle) denier(j *job, d *throttle.Decision) string {
	switch d.Rule.(type) {
	case nil:
		return "throttle"
	case *throttle.Bucket:
		return fmt.Sprintf("provider %s (%s)", j.n.Provider, d.Limit)
	}
	// A window, a calendar window or quiet hours ("quiet 21:00-08:00").
	return fmt.Sprintf("policy %s (%s)", j.n.Policy, d.Limit)
}

// shadow reports what the rules of j in shadow mode would have done with
// it, logged and counted when one would have held it back. A policy is
// asked without writing (Limiter.Check: its real take counted j already,
// or will); a bucket, which must count j to know about the next, is taken
// on a subject of its own, "shadow:" and the provider, never the one real
// sends take. Nothing changes for j; a failure is only logged.
func (t *Throttle) shadow(ctx context.Context, j *job) {
	if j.policy.Shadow {
		r := throttle.Request{ID: j.id, Takes: j.local}
		if j.quota != nil {
			r.Takes = append([]throttle.Take{{Rule: j.quota, Subject: j.n.Recipient}}, j.local...)
		}
		d, err := t.Limiter.Check(ctx, r)
		t.shadowed(j, &d, err, j.policy.Drop && j.overCap(d.TakeIndex)) // quiet hours never drop
	}
	if j.route.Shadow {
		r := throttle.Request{ID: j.id, MaxWait: t.InlineWait, Tenant: j.n.Tenant, Weight: j.weight,
			Takes: []throttle.Take{{Rule: j.route.Bucket, Subject: "shadow:" + j.n.Provider}}}
		d, err := t.Limiter.Admit(ctx, r)
		t.shadowed(j, &d, err, false)
	}
}

// shadowed reports a shadow decision d about j.
func (t *Throttle) shadowed(j *job, d *throttle.Decision, err error, drop bool) {
	if err != nil {
		t.Log.Warn("shadow check failed", "task", j.id, "err", err)
		return
	}
	if d.Allowed {
		return
	}
	would := "deferred"
	if dl, _ := j.deadline(); drop {
		would = "dropped"
	} else if !dl.IsZero() && d.At().After(dl) {
		would = "expired"
	}
	rule := t.denier(j, d)
	t.Metrics.inc(t.Metrics.Shadow, rule, would)
	t.Log.Info("shadow: would have "+would, "task", j.id, "recipient", Redact(j.n.Recipient), "rule", rule, "for", shortDuration(d.Delay))
}

// deliver sends j's message through its provider and settles the
// admission by the outcome.
func (t *Throttle) deliver(ctx context.Context, j *job) error {
	err := j.route.Provider.Send(ctx, Message{ID: j.id, Recipient: j.n.Recipient, Template: j.n.Template, Data: j.n.Data})
	if err == nil {
		t.Metrics.inc(t.Metrics.Sent, j.n.Provider)
		t.Metrics.inc(t.Metrics.TenantSent, j.n.Provider, t.tenantLabel(j.n.Tenant))
		t.markSent(ctx, j)
		return nil
	}
	t.Metrics.inc(t.Metrics.Failed, j.n.Provider)
	// The recipient received nothing: its quota goes back in every case.
	t.release(j.recipientOnly())
	o, after := outcome(err)
	if o != Reject {
		// The provider's token was spent on this attempt (it took the
		// request, or may have): a retry takes a token of its own, so that
		// retries are paced like any other send rather than passing the
		// bucket as already admitted.
		t.forget(j.request())
	}
	if handled, err := t.settle(ctx, j, err); handled {
		return err
	}
	switch o {
	case Pause:
		t.Metrics.inc(t.Metrics.Paused, j.n.Provider)
		if _, perr := t.Limiter.Pause(context.WithoutCancel(ctx), j.route.Bucket, j.n.Provider, after); perr != nil {
			t.Log.Warn("pausing provider failed", "provider", j.n.Provider, "err", perr)
		}
		t.Log.Warn("provider asked to pause", "provider", j.n.Provider, "for", after, "task", j.id)
		return &Deferral{Delay: after, Reason: fmt.Sprintf("provider %s paused: %v", j.n.Provider, err)}
	case Reject:
		t.Metrics.inc(t.Metrics.Archived, "rejected")
		t.Log.Warn("provider rejected notification", "task", j.id, "err", err)
		return fmt.Errorf("rejected: %v: %w", err, asynq.SkipRetry)
	default:
		t.Log.Warn("send failed; will retry", "task", j.id, "err", err)
		return err
	}
}

// markPatience bounds how long markSent keeps trying to write a marker
// while Redis is unreachable.
const markPatience = 10 * time.Minute

// markSent records that j was sent. A failure is logged and counted, not
// returned: the send succeeded, and an error would have asynq retry it.
// While Redis is unreachable it keeps trying (see outage.go) until Redis
// answers, the worker stops, or markPatience passes, even after the task's
// context ends: a task whose lease expired meanwhile is redelivered a
// minute or more after Redis is back, and the marker, written as soon as
// Redis answers, is there first.
func (t *Throttle) markSent(ctx context.Context, j *job) {
	if t.Sent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markPatience)
	defer cancel()
	tries := 0
	err := untilAnswered(ctx, t.Stopping, func() error {
		tries++
		return t.Sent.Mark(ctx, j.id, time.Now())
	})
	switch {
	case err != nil:
		t.Metrics.inc(t.Metrics.Unmarked, j.n.Provider)
		t.Log.Warn("sent, but the sent marker failed: a redelivery would send it again", "task", j.id, "err", err)
	case tries > 1:
		t.Log.Info("sent marker written once Redis answered", "task", j.id, "tries", tries)
	}
}

// release gives back an admission; failures are logged, since the entries
// then expire on their own and a retry of the task finds them its own.
func (t *Throttle) release(r throttle.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := t.Limiter.Release(ctx, r)
	if err != nil {
		t.Log.Warn("release failed", "task", r.ID, "err", err)
	}
	if n > 0 {
		t.Metrics.inc(t.Metrics.Bookings, "released")
	}
}

// forget drops the task's provider token without giving it back (see
// throttle.Limiter.Forget). A failure is logged: the retry then passes the
// bucket as already admitted, and the holding lapses after
// throttle.Options.Remember.
func (t *Throttle) forget(r throttle.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := t.Limiter.Forget(ctx, r); err != nil {
		t.Log.Warn("forgetting the provider token failed", "task", r.ID, "err", err)
	}
}

// tenantLabel is a tenant's label in the metrics: its name if the weights
// name it, "default" for none, else "other" (a bounded set of series).
func (t *Throttle) tenantLabel(tenant string) string {
	if tenant == "" {
		return "default"
	}
	if _, ok := t.rules().Weights[tenant]; ok {
		return tenant
	}
	return "other"
}
