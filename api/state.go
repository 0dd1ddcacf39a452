package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// A notification's states, as GET tells them.
const (
	stateScheduled = "scheduled" // held until its moment, SendAt (Until)
	stateQueued    = "queued"    // waiting for a worker
	stateWaiting   = "waiting"   // deferred until Until, for Reason (a rule, a booking, a retry)
	stateSending   = "sending"   // a worker has it now
	stateSent      = "sent"      // its provider accepted it
	stateCompleted = "completed" // done without a send of its own (folded into a digest)
	stateArchived  = "archived"  // never to be sent, for Reason (expired, dropped, rejected)
	stateCanceled  = "canceled"  // archived by DELETE
)

// states are the states, as openapi.yaml lists them.
var states = []string{stateScheduled, stateQueued, stateWaiting, stateSending, stateSent, stateCompleted, stateArchived, stateCanceled}

// View is a notification as the API shows it.
type View struct {
	ID        string     `json:"id"`
	State     string     `json:"state"`
	Until     *time.Time `json:"until,omitempty"`  // scheduled, waiting: when it is tried next
	Reason    string     `json:"reason,omitempty"` // waiting, archived: why
	SentAt    *time.Time `json:"sent_at,omitempty"`
	Recipient string     `json:"recipient,omitempty"`
	Template  string     `json:"template,omitempty"`
	Policy    string     `json:"policy,omitempty"`
	Provider  string     `json:"provider,omitempty"`
	Queue     string     `json:"queue,omitempty"`
	Tenant    string     `json:"tenant,omitempty"`
	QueuedAt  *time.Time `json:"queued_at,omitempty"`
	SendAt    *time.Time `json:"send_at,omitempty"` // the moment it was scheduled for, in any state
	// Events are its history, GET's alone (see events.go).
	Events []lifecycle.Event `json:"events,omitempty"`
}

func newView(id, queue string, n message.Notification, state string) *View {
	v := &View{ID: id, State: state, Recipient: n.Recipient, Template: n.Template, Policy: n.Policy,
		Provider: n.Provider, Queue: queue, Tenant: n.Tenant, QueuedAt: n.Queued, SendAt: n.SendAt}
	if state == stateScheduled {
		v.Until = n.SendAt
	}
	return v
}

// get serves GET /v1/notifications/{id}.
func (s *Server) get(w http.ResponseWriter, r *http.Request, c *client) (logged, error) {
	if err := s.limit(w, r, c, 1); err != nil {
		return logged{}, err
	}
	v, err := s.find(r.Context(), r.PathValue("id"), c)
	if err == nil {
		v.Events, err = s.history(r.Context(), v.ID, c)
	}
	if err != nil {
		return logged{}, err
	}
	writeJSON(w, http.StatusOK, v)
	return logged{id: v.ID}, nil
}

// find returns the view of the notification id names: a task ID, else an
// idempotency key of c's tenant.
func (s *Server) find(ctx context.Context, id string, c *client) (*View, error) {
	v, err := s.view(ctx, id, c.setup.queues, c)
	if isNotFound(err) {
		v, err = s.view(ctx, intake.TaskID(c.key.Tenant, id), c.setup.queues, c)
	}
	return v, err
}

func isNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// view returns where task id, in one of queues, stands, from asynq's task
// and the worker's sent marker. Another tenant's notification is not found.
func (s *Server) view(ctx context.Context, id string, queues []string, c *client) (*View, error) {
	info, err := s.task(id, queues)
	if err != nil {
		return nil, err
	}
	sentAt, err := s.sentAt(ctx, id)
	if err != nil {
		return nil, err
	}
	if info == nil {
		if sentAt == nil { // never, or forgotten: a task without a key is dropped once done
			return s.ended(ctx, id, c)
		}
		return &View{ID: id, State: stateSent, SentAt: sentAt}, nil
	}
	n, err := message.Decode(info.Payload)
	if err != nil || n.Tenant != c.key.Tenant {
		return nil, notFound(id) // not a notification this key may see
	}
	v := newView(id, info.Queue, n, "")
	switch info.State {
	case asynq.TaskStatePending:
		v.State = stateQueued
	case asynq.TaskStateScheduled, asynq.TaskStateRetry:
		// asynq's schedule holds what was enqueued for a moment (send_at);
		// the throttle's deferrals wait in its retry set (jobs.Deferral).
		v.State, v.Reason = stateWaiting, info.LastErr
		if info.State == asynq.TaskStateScheduled {
			v.State, v.Reason = stateScheduled, ""
		}
		if !info.NextProcessAt.IsZero() {
			at := info.NextProcessAt.UTC()
			v.Until = &at
		}
	case asynq.TaskStateActive:
		v.State = stateSending
	case asynq.TaskStateCompleted:
		v.State = stateCompleted
		if sentAt != nil {
			v.State, v.SentAt = stateSent, sentAt
		}
	case asynq.TaskStateArchived:
		v.State, v.Reason = stateArchived, info.LastErr
		canceled, err := s.rdb.Exists(ctx, canceledKey(s.cfg.Redis.Prefix, id)).Result()
		if err != nil {
			return nil, unavailable(err)
		}
		if canceled > 0 {
			v.State, v.Reason = stateCanceled, canceledReason
		}
	default:
		v.State = info.State.String()
	}
	return v, nil
}

// task returns asynq's task id from whichever of queues holds it, or nil,
// looking first in the shards that id goes to.
func (s *Server) task(id string, queues []string) (*asynq.TaskInfo, error) {
	byShard := func(q string) int {
		if q == asynqdb.ShardOf(asynqdb.BaseQueue(q), id, s.cfg.Redis.Shards) {
			return 0
		}
		return 1
	}
	for _, q := range slices.SortedStableFunc(slices.Values(queues), func(a, b string) int { return byShard(a) - byShard(b) }) {
		info, err := s.insp.GetTaskInfo(q, id)
		switch {
		case err == nil:
			return info, nil
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		default:
			return nil, unavailable(err)
		}
	}
	return nil, nil
}

// sentAt returns when the worker's sent marker says task id was sent, or nil.
func (s *Server) sentAt(ctx context.Context, id string) (*time.Time, error) {
	at, ok, err := s.sent.SentAt(ctx, id)
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		return nil, nil
	}
	at = at.UTC()
	return &at, nil
}

func notFound(id string) *Error {
	return &Error{Status: http.StatusNotFound, Code: CodeNotFound,
		Message: "no notification " + intake.Quote(id) + " (by ID or idempotency key) for this key's tenant; one is found while its events are kept (events.history), its task (24h with an idempotency key) or its sent marker (worker.sent_marks)"}
}

// cancel serves DELETE /v1/notifications/{id}.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request, c *client) (logged, error) {
	if err := s.limit(w, r, c, 1); err != nil {
		return logged{}, err
	}
	ctx := r.Context()
	v, err := s.find(ctx, r.PathValue("id"), c)
	if err != nil {
		return logged{}, err
	}
	what := logged{id: v.ID}
	if unsent(v.State) {
		if v, err = s.archive(ctx, v, c); err != nil {
			return what, err
		}
	}
	if v.State != stateCanceled {
		return what, notCancelable(v)
	}
	writeJSON(w, http.StatusOK, v)
	return what, nil
}

// unsent reports whether a notification in state waits in one of asynq's
// sets, where DELETE can archive it before a worker takes it.
func unsent(state string) bool {
	return state == stateScheduled || state == stateQueued || state == stateWaiting
}

// archive archives a scheduled, queued or waiting notification and marks
// it canceled, and returns where it stands then: canceled, or taken by a
// worker meanwhile.
func (s *Server) archive(ctx context.Context, v *View, c *client) (*View, error) {
	if err := s.insp.ArchiveTask(v.Queue, v.ID); err != nil {
		now, err2 := s.view(ctx, v.ID, c.setup.queues, c)
		if err2 != nil || unsent(now.State) {
			return nil, unavailable(err) // not taken: the archive failed for another reason
		}
		return now, nil
	}
	// Marked after the archive: a failed archive leaves no mark.
	if err := s.rdb.Set(ctx, canceledKey(s.cfg.Redis.Prefix, v.ID), 1, intake.KeyRetention).Err(); err != nil {
		return nil, unavailable(err)
	}
	v.State, v.Reason, v.Until = stateCanceled, canceledReason, nil
	s.record(ctx, lifecycle.Event{Type: lifecycle.Canceled, Message: v.ID, Tenant: v.Tenant})
	return v, nil
}

// canceledReason is a canceled notification's reason.
const canceledReason = "canceled through the API"

// notCancelable is the 409 of a notification past being canceled.
func notCancelable(v *View) *Error {
	e := &Error{Status: http.StatusConflict, Code: CodeNotPending}
	switch v.State {
	case stateSent:
		e.Code, e.Message = CodeAlreadySent, "already sent"
		if v.SentAt != nil {
			e.Message += " at " + v.SentAt.Format(time.RFC3339Nano)
		}
	case stateSending:
		e.Message = "a worker is sending it now: ask for its state to see whether it went"
	default:
		e.Message = "it is " + v.State
		if v.Reason != "" {
			e.Message += ": " + v.Reason
		}
	}
	return e
}
