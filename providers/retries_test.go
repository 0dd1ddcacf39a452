package providers

import (
	"context"
	"errors"
	"testing"
	"time"
)

// scoperFunc is a Scoper answering with err, or as sent with the ID "sent-1".
type scoperFunc struct{ err error }

func (s scoperFunc) Send(context.Context, Message) (string, error) {
	if s.err != nil {
		return "", s.err
	}
	return "sent-1", nil
}

func (scoperFunc) Scopes(Message) []string { return []string{"device:x"} }

func TestRetriesApplyToTemporaryFailuresOnly(t *testing.T) {
	t.Parallel()
	temp := errors.New("503 Service Unavailable")
	classified := &SendError{Outcome: Dead, Err: errors.New("410")}
	for name, c := range map[string]struct {
		err     error
		retried int
		check   func(error) bool
	}{
		"sent":               {nil, 0, func(err error) bool { return err == nil }},
		"classified as is":   {classified, 0, func(err error) bool { return err == classified }},
		"first backoff":      {temp, 0, func(err error) bool { d, ok := backoffOf(err); return ok && d == 2*time.Second }},
		"its own budget":     {temp, 1, func(err error) bool { n, ok := RetryBudget(err); return ok && n == 3 && errors.Is(err, temp) }},
		"doubled":            {temp, 2, func(err error) bool { d, ok := backoffOf(err); return ok && d == 8*time.Second }},
		"gave up at the max": {temp, 3, func(err error) bool { var se *SendError; return errors.As(err, &se) && se.Outcome == Reject }},
	} {
		r := WithRetries(scoperFunc{c.err}, 3, 2*time.Second).(*Retries)
		r.retried = func(context.Context) int { return c.retried }
		id, err := r.Send(context.Background(), Message{})
		if !c.check(err) {
			t.Errorf("%s: %v", name, err)
		}
		if (id == "sent-1") != (err == nil) {
			t.Errorf("%s: ID %q with error %v: the provider's ID lost or made up", name, id, err)
		}
		if got := r.Scopes(Message{}); len(got) != 1 {
			t.Errorf("%s: the wrapper lost the scopes: %v", name, got)
		}
	}
	if p := WithRetries(scoperFunc{}, 0, 0); p != (scoperFunc{}) {
		t.Errorf("no settings: %T, want the provider itself", p)
	}
}

func backoffOf(err error) (time.Duration, bool) {
	var b *Backoff
	if errors.As(err, &b) {
		return b.Delay, true
	}
	return 0, false
}
