package intake

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/address"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// Job is a checked notification, ready to enqueue.
type Job struct {
	ID    string // the task ID
	Queue string // the asynq queue it goes to (asynqdb.ShardOf)
	Task  *asynq.Task
	Keyed bool   // the ID comes from an idempotency key: enqueueing it again is a duplicate
	Key   string // that key, as the entry gave it
	// Notification is the task's payload, the config's defaults applied.
	Notification message.Notification
}

// Checker checks entries against a config and makes them jobs.
type Checker struct {
	Config *config.Config
	Name   string // the config file, as messages name it
	// KeyPerTenant derives a keyed task's ID from its tenant and its key
	// (TaskID), as the API does; false, from the key alone, as enqueue -key.
	KeyPerTenant bool
}

// TaskID is the task ID of a notification enqueued with an idempotency
// key: derived from the tenant and the key. A tenant has no control
// characters, so the NUL keeps tenant and key apart.
func TaskID(tenant, key string) string { return message.TaskID(tenant + "\x00" + key) }

// Check applies the config's defaults to e, checks the result as the
// worker will and returns its job. The error, an *Error, says what is
// wrong in one line. A deadline before now is an error: the worker would
// only expire it; so is a send_at more than SendAtGrace before now.
func (c Checker) Check(e Entry, now time.Time) (Job, error) {
	r := c.Config.Route(config.Route{Policy: e.Policy, Provider: e.Provider, Queue: e.Queue})
	n := message.Notification{
		Recipient: e.Recipient,
		Policy:    r.Policy,
		Provider:  r.Provider,
		Template:  e.Template,
		Data:      e.Data,
		SendBy:    e.SendBy,
		TZ:        e.TZ,
		Tenant:    e.Tenant,
	}
	queue := r.Queue // the config's name; enqueued in one of its shards (asynqdb.ShardOf)
	if err := CheckKey(e.IdempotencyKey, "idempotency_key"); err != nil {
		return Job{}, err
	}
	if err := n.Check(); err != nil {
		return Job{}, reason(err)
	}
	if _, ok := c.Config.Policies[n.Policy]; !ok {
		return Job{}, c.undefined("policy", n.Policy, suggestion(n.Policy, c.Config.Policies))
	}
	p, ok := c.Config.Providers[n.Provider]
	if !ok {
		return Job{}, c.undefined("provider", n.Provider, suggestion(n.Provider, c.Config.Providers))
	}
	if err := address.Check(p.Type, n.Recipient); err != nil {
		return Job{}, fieldErr("recipient", "%v, as provider %s (%s) needs", err, n.Provider, p.Type)
	}
	if _, ok := c.Config.Worker.Queues[queue]; !ok {
		return Job{}, c.undefined("queue", queue, suggestion(queue, c.Config.Worker.Queues))
	}
	if n.SendBy != nil && !n.SendBy.After(now) {
		return Job{}, fieldErr("send_by", "%s is in the past", n.SendBy.Format(time.RFC3339Nano))
	}
	at, err := c.sendAt(e, n.Policy, now) // rounded as NewTask holds it: the job's events tell that moment
	if err != nil {
		return Job{}, err
	}
	n.SendAt = at
	id := message.TaskID(e.IdempotencyKey)
	if c.KeyPerTenant && e.IdempotencyKey != "" {
		id = TaskID(n.Tenant, e.IdempotencyKey)
	}
	shard := asynqdb.ShardOf(queue, id, c.Config.Redis.Shards)
	opts := []asynq.Option{asynq.Queue(shard)}
	if e.IdempotencyKey != "" {
		// asynq forgets a completed task at once, and with it the ID's
		// conflict: keep keyed tasks so that the key dedupes after delivery.
		opts = append(opts, asynq.Retention(KeyRetention))
	}
	task, err := message.NewTask(n, id, opts...)
	var fe *message.FieldError
	if errors.As(err, &fe) && fe.Field == "" {
		// n and id were checked: the one check of the payload as a whole
		// left is its size, which the data makes.
		return Job{}, &Error{Field: "data", TooLarge: true,
			Msg: fmt.Sprintf("%d bytes, too much: the task's %s (message.MaxPayloadLen)", len(n.Data), fe.Problem)}
	}
	if err != nil {
		return Job{}, reason(err)
	}
	return Job{ID: id, Queue: shard, Task: task, Keyed: e.IdempotencyKey != "", Key: e.IdempotencyKey, Notification: n}, nil
}

// KeyRetention is how long a notification enqueued with an idempotency key
// is kept after it completed, so that the same key again is a duplicate.
const KeyRetention = 24 * time.Hour

func (c Checker) undefined(kind, name, hint string) error {
	return &Error{Field: kind, Msg: fmt.Sprintf("%s %s is not defined in %s%s", kind, Quote(name), c.Name, hint), bare: true}
}

// reason is what is wrong with a notification as an *Error, without the
// "bad notification" jobs wraps it with: the caller says where it came from.
func reason(err error) error {
	var fe *message.FieldError
	if errors.As(err, &fe) {
		if fe.Field == "task ID" { // not a field of the object
			return wholeErr("%s", fe.Error())
		}
		return &Error{Field: fe.Field, Msg: fe.Problem}
	}
	return err
}

// Accepted returns the events of j's enqueueing by via (a lifecycle.Via*):
// accepted, and scheduled at its moment if it has one (send_at).
func (j Job) Accepted(via string) []lifecycle.Event {
	events := []lifecycle.Event{{Type: lifecycle.Accepted, Message: j.ID, Tenant: j.Notification.Tenant,
		IdempotencyKey: j.Key, Via: via}}
	if at := j.Notification.SendAt; at != nil {
		events = append(events, lifecycle.Event{Type: lifecycle.Scheduled, Message: j.ID, Tenant: j.Notification.Tenant,
			Moment: lifecycle.Moment(*at)})
	}
	return events
}
