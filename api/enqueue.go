package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/message"
)

// IdempotencyHeader carries a notification's idempotency key, as the
// body's idempotency_key does.
const IdempotencyHeader = "Idempotency-Key"

// ReplayedHeader is "true" on the 200 of a notification whose idempotency
// key was used before with the same notification: nothing was enqueued.
const ReplayedHeader = "Idempotent-Replayed"

// enqueueOne serves POST /v1/notifications.
func (s *Server) enqueueOne(w http.ResponseWriter, r *http.Request, c *client) (logged, error) {
	if err := s.limit(w, r, c, 1); err != nil {
		return logged{}, err
	}
	body, err := readJSON(w, r, MaxBody)
	if err != nil {
		return logged{}, err
	}
	e, err := intake.ParseLine(body)
	if err != nil {
		return logged{}, invalid(err, "")
	}
	keyField := "/idempotency_key"
	if h := r.Header.Get(IdempotencyHeader); h != "" {
		if err := intake.CheckKey(h, IdempotencyHeader); err != nil {
			return logged{}, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: IdempotencyHeader, Message: err.Error()}
		}
		if e.IdempotencyKey != "" && e.IdempotencyKey != h {
			return logged{}, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: "/idempotency_key",
				Message: "differs from the " + IdempotencyHeader + " header: give one, or the same in both"}
		}
		if e.IdempotencyKey == "" {
			keyField = IdempotencyHeader // a 409 names where the key came from
		}
		e.IdempotencyKey = h
	}
	res := s.submit(r.Context(), c, e, "", keyField)
	if res.err != nil {
		return logged{recipient: e.Recipient}, res.err
	}
	if res.status == http.StatusOK {
		w.Header().Set(ReplayedHeader, "true")
	}
	writeJSON(w, res.status, res.view)
	return logged{id: res.view.ID, recipient: e.Recipient}, nil
}

// batchRequest is the body of POST /v1/notifications/batch.
type batchRequest struct {
	Notifications []json.RawMessage `json:"notifications"`
}

// batchResult is one notification's outcome in a batch's response: the
// status and body it would have had alone.
type batchResult struct {
	Status       int    `json:"status"`
	Notification *View  `json:"notification,omitempty"`
	Error        *Error `json:"error,omitempty"`
}

// enqueueBatch serves POST /v1/notifications/batch: each notification is
// enqueued or refused on its own, each result in its place.
func (s *Server) enqueueBatch(w http.ResponseWriter, r *http.Request, c *client) (logged, error) {
	req, err := readBatch(w, r)
	if err != nil {
		s.peek(w, r, c) // refused before it was counted
		return logged{}, err
	}
	if err := s.limit(w, r, c, len(req.Notifications)); err != nil {
		return logged{}, err
	}
	results := make([]batchResult, len(req.Notifications))
	for i, raw := range req.Notifications {
		base := fmt.Sprintf("/notifications/%d", i)
		e, err := intake.ParseLine(raw)
		var res result
		if err != nil {
			res = result{err: invalid(err, base)}
		} else {
			res = s.submit(r.Context(), c, e, base, base+"/idempotency_key")
		}
		if res.err != nil {
			results[i] = batchResult{Status: res.err.Status, Error: res.err}
		} else {
			results[i] = batchResult{Status: res.status, Notification: res.view}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
	return logged{count: len(results)}, nil
}

// readBatch reads a batch's body, or returns why it is refused whole.
func readBatch(w http.ResponseWriter, r *http.Request) (batchRequest, error) {
	var req batchRequest
	body, err := readJSON(w, r, MaxBatchBody)
	if err != nil {
		return req, err
	}
	if r.Header.Get(IdempotencyHeader) != "" {
		return req, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: IdempotencyHeader,
			Message: "not for a batch: give each notification its idempotency_key"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || dec.More() {
		why := "data after it"
		if err != nil {
			why = err.Error()
		}
		return req, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Message: `must be {"notifications": [...]}, one JSON object: ` + why}
	}
	switch n := len(req.Notifications); {
	case n == 0:
		return req, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: "/notifications", Message: "no notifications"}
	case n > MaxBatch:
		return req, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: "/notifications",
			Message: fmt.Sprintf("%d notifications, more than %d in one batch", n, MaxBatch)}
	}
	return req, nil
}

// readJSON is readBody of a body declared application/json.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if err := requireJSON(r); err != nil {
		return nil, err
	}
	return readBody(w, r, limit)
}

// readBody reads a request's body up to limit bytes: more is a 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge,
			Message: fmt.Sprintf("the body is over %d bytes", limit)}
	case err != nil:
		return nil, &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Message: "reading the body: " + err.Error()}
	}
	return body, nil
}

// result is the outcome of submitting one notification.
type result struct {
	status int // 202 new, 200 the original of its idempotency key
	view   *View
	err    *Error
}

// submit checks e as enqueue does, with the key's tenant and what it may
// use, and enqueues it unless its idempotency key was used already. base
// is the JSON pointer of e in the request body, keyField where its
// idempotency key came from (a pointer, or the header).
func (s *Server) submit(ctx context.Context, c *client, e intake.Entry, base, keyField string) result {
	switch {
	case e.Tenant == "":
		e.Tenant = c.key.Tenant
	case e.Tenant != c.key.Tenant:
		return result{err: &Error{Status: http.StatusForbidden, Code: CodeForbidden, Field: base + "/tenant",
			Message: fmt.Sprintf("this key sends as tenant %s, not %s", intake.Quote(c.key.Tenant), intake.Quote(e.Tenant))}}
	}
	key := e.IdempotencyKey
	accepted := time.Now()
	j, err := c.setup.check.Check(e, accepted)
	if err != nil {
		return result{err: invalid(err, base)}
	}
	n := j.Notification
	policyOK, providerOK := c.key.Allows(n.Policy, n.Provider)
	switch {
	case !policyOK:
		return result{err: forbidden(base+"/policy", "policy", n.Policy, c)}
	case !providerOK:
		return result{err: forbidden(base+"/provider", "provider", n.Provider, c)}
	}
	if key != "" {
		if err := s.claimKey(ctx, j, key, keyField); err != nil {
			return result{err: err}
		}
	}
	info, err := s.client.EnqueueContext(ctx, j.Task)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return s.replay(ctx, c, j, key, keyField)
	case err != nil:
		if key != "" { // so that a retry is not a 409
			s.rdb.Del(context.WithoutCancel(ctx), keyRecord(s.cfg.Redis.Prefix, j.ID))
		}
		return result{err: unavailable(err)}
	}
	if stamped, err := message.Decode(j.Task.Payload()); err == nil {
		n.Queued = stamped.Queued // the time NewTask stamped on the task
	}
	s.listed(ctx, c, j.ID, j.Queue, accepted)
	s.record(ctx, j.Accepted(lifecycle.ViaAPI)...)
	state := stateQueued
	if info.State == asynq.TaskStateScheduled { // asynq holds it: its moment is to come
		state = stateScheduled
	}
	return result{status: http.StatusAccepted, view: newView(j.ID, j.Queue, n, state)}
}

// forbidden is the 403 of a policy or provider the key may not use.
func forbidden(field, kind, name string, c *client) *Error {
	return &Error{Status: http.StatusForbidden, Code: CodeForbidden, Field: field,
		Message: fmt.Sprintf("API key %s may not use %s %s", c.name, kind, intake.Quote(name))}
}

// claimKey records the first use of an idempotency key, a hash of its
// notification, so that a later use with another is a 409 at once, across
// queues too (docs/operations.md#the-http-api, "Idempotency").
func (s *Server) claimKey(ctx context.Context, j intake.Job, key, field string) *Error {
	sum := bodyHash(j.Notification, j.Queue)
	k := keyRecord(s.cfg.Redis.Prefix, j.ID)
	set, err := s.rdb.SetNX(ctx, k, sum[:], intake.KeyRetention).Result()
	if err != nil {
		return unavailable(err)
	}
	if set {
		return nil
	}
	first, err := s.rdb.Get(ctx, k).Result()
	if err != nil {
		return unavailable(err)
	}
	if first != string(sum[:]) {
		return reused(key, j.ID, field)
	}
	return nil
}

// reused is the 409 of an idempotency key, from field, used with another
// notification.
func reused(key, id, field string) *Error {
	return &Error{Status: http.StatusConflict, Code: CodeConflict, Field: field,
		Message: fmt.Sprintf("idempotency key %s was used with another notification (%s): use a new key for a new one", intake.Quote(key), id)}
}

// replay answers a notification whose idempotency key's task exists: 200
// and the original when it is the same notification, else 409. The task is
// compared, as the key's record may have expired while it waited.
func (s *Server) replay(ctx context.Context, c *client, j intake.Job, key, field string) result {
	info, err := s.task(j.ID, c.setup.queues)
	if err != nil {
		return result{err: asError(err)}
	}
	if info == nil { // gone since the conflict (a moment's race with its deletion)
		return result{err: unavailable(nil)}
	}
	first, err := message.Decode(info.Payload)
	if err != nil {
		return result{err: unavailable(err)}
	}
	if bodyHash(first, info.Queue) != bodyHash(j.Notification, j.Queue) {
		return result{err: reused(key, j.ID, field)}
	}
	v, err := s.view(ctx, j.ID, c.setup.queues, c)
	if err != nil {
		return result{err: asError(err)}
	}
	return result{status: http.StatusOK, view: v}
}

// bodyHash is a hash of what a task sends (its notification without the
// time it was queued, and its queue), whatever the spacing of its data.
func bodyHash(n message.Notification, queue string) [sha256.Size]byte {
	n.Queued = nil
	var data bytes.Buffer
	if json.Compact(&data, n.Data) == nil {
		n.Data = data.Bytes()
	}
	b, _ := json.Marshal(struct {
		N     message.Notification
		Queue string
	}{n, queue}) // of strings, times and valid JSON: cannot fail
	return sha256.Sum256(b)
}
