// Package jobs is the worker's asynq handler (Throttle): it admits each
// notification and digest through the throttle, sends what may go through
// its provider and settles the outcome. docs/design.md (The worker) tells
// how; the payload is package message, the providers package providers.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/providers"
	"github.com/notify-throttle/throttler/screen"
	"github.com/notify-throttle/throttler/throttle"
)

// Route is a provider as the throttle needs it: its bucket and its sender.
type Route struct {
	Bucket   *throttle.Bucket
	Provider providers.Provider
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
	Limiter *throttle.Limiter
	// Rules are the rules jobs are routed by until Swap replaces them.
	Rules
	Pacing
	// Fleet, if set (and running), is this worker's part in the fleet
	// (package fleet): it wakes jobs deferred to a moment at that moment,
	// at the head of their queue; it says whether jobs wait in the queues
	// unseen (a job that books then takes its place rather than a slot it
	// would sleep for); and before each send it says whether this worker
	// still holds the task (one taken for dead after a long silence has
	// had its tasks handed to another worker, which sends them). Nil:
	// asynq wakes a booked job, to the second, wakeEarly before its moment;
	// no backlog is seen; every task is sent.
	Fleet Fleet
	// OnBooked, if set, is called with every booking a job makes (the demo
	// prints them); the log has a line per booking (jobs/outcome.go).
	OnBooked func(message.Notification, throttle.Decision)
	// Stopping is closed when the worker starts to shut down: jobs still
	// waiting for their moment give their admission back and are deferred.
	Stopping <-chan struct{}
	// Sent holds the sent markers (NewSentMarks on Limiter). Nil turns them
	// off, and with them the protection against sending a redelivered job
	// twice; ProcessTask warns about it.
	Sent *SentMarks
	// Digests folds the messages of digest policies (PolicySettings.Digest)
	// over their cap. Nil defers them.
	Digests *digest.Store
	// Screen keeps scoped pauses and suppressed addresses for the providers
	// that are providers.Scopers (see settle.go). Nil: a scoped pause defers
	// only the job that met it, and nothing is suppressed.
	Screen *screen.Screen
	// Events, if set, records each message's outcomes as its events
	// (events.go), each just after it is decided. Nil records none.
	Events  Events
	Metrics *Metrics
	Log     *slog.Logger

	defaults sync.Once
	swapped  atomic.Pointer[Rules] // set by Swap
	zones    zones
}

// Rules are what a Throttle routes notifications by, replaced all at once
// by Swap.
type Rules struct {
	Policies  map[string]*throttle.Quota
	Providers map[string]Route
	// Settings are, by policy, what the policy says beyond its windows; a
	// policy without an entry defers with no max delay.
	Settings map[string]PolicySettings
	// Weights are tenants' weights (throttle.Request.Weight) by tenant
	// (message.Notification.Tenant); a tenant without an entry weighs 1.
	Weights map[string]int
}

// Pacing is how a Throttle lets what may go leave: waits slept inline,
// late sends, bookings and the queues that skip the lines.
type Pacing struct {
	// InlineWait is the longest wait slept in the worker rather than
	// deferred. Zero defers every wait. A booked job is woken before its
	// moment (see Fleet) whatever InlineWait says, and claims it then.
	InlineWait time.Duration
	// LateAfter is how long after the moment it was admitted for a job's
	// send may leave before its recipient's entries are moved to the send
	// (see onTime): a late job costs one more call, one on time nothing.
	// cmd/worker sets half of worker.window_margin, the lateness that
	// margin absorbs. Zero never moves them.
	LateAfter time.Duration
	// Book makes a job that may not go within InlineWait book the earliest
	// moment its recipient's policy and its provider allow (see
	// throttle.Limiter.Book) and wait for it: one deferral per job, in
	// order, instead of waking with every other waiting job to find the
	// next slot taken.
	Book bool
	// BookAhead, with Book, is how far ahead a job may hold its provider's
	// slot (throttle.Request.BookAhead): a job further back is given a place
	// in its tenant's line, and books when it comes back at that place.
	// Zero books as far ahead as needed.
	BookAhead time.Duration
	// PriorityQueues names the queues whose jobs skip the providers' lines
	// and may take their reserve (throttle.Bucket.WithReserve).
	PriorityQueues map[string]bool
}

// Swap makes r the rules of every job routed from now on (a config
// reload): jobs already routed keep theirs. Safe while jobs run.
func (t *Throttle) Swap(r Rules) { t.swapped.Store(&r) }

// rules returns the rules in effect.
func (t *Throttle) rules() *Rules {
	if r := t.swapped.Load(); r != nil {
		return r
	}
	return &t.Rules
}

// PolicySettings are what a policy says beyond its windows (see
// config.Policy).
type PolicySettings struct {
	// Drop archives a message that its policy's windows hold back ("over
	// the cap") at once, instead of deferring it.
	Drop bool
	// MaxDelay, if set, is the longest a message may wait after it was
	// queued, or after its send_at if later (jobs/route.go, deadline): one
	// whose moment would be later expires, as one past its send-by does.
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
	// (message.Notification.TZ), else Zone (nil: UTC). A message in quiet hours is
	// held until they end, never dropped.
	Calendars []*throttle.Calendar
	Quiet     *throttle.QuietHours
	Zone      *time.Location
}

// Fleet is what a Throttle asks of this worker's part in the fleet (see
// Throttle.Fleet; *fleet.Member is one).
type Fleet interface {
	// Holds reports whether this worker still holds the task of an asynq
	// handler's context: nil if it does, an error if it does not or cannot
	// tell.
	Holds(ctx context.Context) error
	// Wake has the task woken in d, at the head of queue.
	Wake(queue, id string, d time.Duration)
	// Lead is how long before its moment a booked job asks to be woken
	// (it claims its moment early and sleeps for it).
	Lead() time.Duration
	// Waiting reports whether work waits in the queues unseen.
	Waiting() bool
}

// handedOverDelay defers a job whose task this worker no longer holds: the
// retry its error makes asynq schedule must not run before the other
// worker's run of the task has ended, for its sent marker to stop it.
// asynq's lease (30 s) bounds a run that worker's own silence could cut
// short; a minute covers that and a send's timeout.
const handedOverDelay = time.Minute

// ProcessTask runs a task of the throttle's own types: a notification
// (message.TaskType), which it decodes, admits, sends through its provider
// and settles, or a digest (digest.TaskType). Register it for both:
//
//	mux.Handle(message.TaskType, th)
//	mux.Handle(digest.TaskType, th)
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
	case message.TaskType:
		return t.notify(ctx, id, task)
	case digest.TaskType:
		return t.ended(ctx, id, payloadOf(task), t.sendDigest(ctx, id, task))
	}
	return t.logArchived(id, "unknown task type", fmt.Errorf("jobs: Throttle runs %s and %s tasks, not %q: %w", message.TaskType, digest.TaskType, task.Type(), asynq.SkipRetry))
}

// notify runs a notification task: decode, route, admit, send, settle.
func (t *Throttle) notify(ctx context.Context, id string, task *asynq.Task) error {
	j, err := t.load(ctx, id, task)
	if err != nil {
		t.Metrics.inc(t.Metrics.Archived, "malformed")
		return t.ended(ctx, id, payloadOf(task), t.logArchived(id, "malformed", fmt.Errorf("malformed notification: %v: %w", err, asynq.SkipRetry)))
	}
	err = t.run(ctx, j)
	return t.ended(ctx, id, j.n, err)
}

// run runs a routed notification: admit, send, settle.
func (t *Throttle) run(ctx context.Context, j *job) error {
	t.shadowBucket(ctx, j)
	digests := j.policy.Digest && t.Digests != nil
	if digests {
		if err := t.foldedBefore(ctx, j); err != nil {
			if errors.Is(err, errFolded) {
				t.refolded(ctx, j)
			}
			return ignoreDone(err)
		}
	}
	if err := t.admit(ctx, j); err != nil {
		if errors.Is(err, errSentBefore) {
			t.sentBefore(j)
		}
		return ignoreDone(err)
	}
	if err := t.holds(ctx, j); err != nil {
		return err
	}
	if err := t.screen(ctx, j); err != nil {
		return err
	}
	if digests && !j.tried {
		// From here the provider may take it: never fold it after.
		if err := t.Digests.Attempt(ctx, j.id); err != nil {
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
	n, err := message.Decode(task.Payload())
	if err != nil {
		return nil, err
	}
	j, err := t.route(ctx, id, n)
	if err != nil {
		return nil, err
	}
	j.headers = task.Headers()
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
