package feedback

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/screen"
)

// DefaultRemember is how long an applied report is remembered: SendGrid
// retries an event for up to 24 hours; SNS for an hour.
const DefaultRemember = 24 * time.Hour

// claimTTL bounds a request's claim on its reports: longer than any
// request takes (the API's FeedbackTimeout).
const claimTTL = time.Minute

type applier struct {
	rdb      redis.UniversalClient
	prefix   string
	remember time.Duration
	events   *lifecycle.Recorder
	screen   *screen.Screen
	metrics  *Metrics
	log      *slog.Logger
}

type claimed struct {
	Report
	id string
}

// id returns the ID of the event r records or, for a report of an address
// alone, of its provider and the vendor's ID; "" if it has neither.
func (r Report) id(provider string) string {
	switch {
	case r.Message != "":
		return lifecycle.IDOf(r.event(provider, ""))
	case r.Vendor != "":
		return lifecycle.NewID(provider, r.Type, r.Vendor)
	}
	return ""
}

func (r Report) event(provider, tenant string) lifecycle.Event {
	return lifecycle.Event{Type: r.Type, Message: r.Message, Tenant: tenant, Provider: provider,
		ProviderMessageID: r.ProviderMessageID, Reason: r.Reason, Detail: r.Detail}
}

// reason is the suppression's reason: which feedback, in the provider's words.
func (r Report) reason() string {
	what := "feedback: " + string(r.Type)
	if r.Detail != "" {
		what += ": " + r.Detail
	}
	return what
}

// apply applies reports of provider that were not before, and returns
// what they did; ErrReplayed (wrapped) if every one with an ID was.
func (a *applier) apply(ctx context.Context, provider string, reports []Report) (Result, error) {
	var res Result
	var todo []claimed
	for _, r := range reports {
		if id := r.id(provider); id != "" {
			todo = append(todo, claimed{r, id})
		} else {
			res.Unknown++
			a.metrics.Reports.WithLabelValues(provider, resultUnknown).Inc()
		}
	}
	mine, err := a.claim(ctx, todo)
	if err != nil {
		return res, err
	}
	res.Replayed = len(todo) - len(mine)
	a.metrics.Reports.WithLabelValues(provider, resultReplayed).Add(float64(res.Replayed))
	if len(mine) == 0 && res.Replayed > 0 {
		return res, fmt.Errorf("%w: %d reports, each applied before", ErrReplayed, res.Replayed)
	}
	applied, unknown, err := a.applyClaimed(ctx, provider, mine)
	if err != nil {
		a.drop(ctx, mine)
		return res, err
	}
	res.Applied, res.Unknown = applied, res.Unknown+unknown
	a.mark(ctx, mine)
	return res, nil
}

// claim marks each report as being applied, in one round trip, and
// returns those it could: another request applies (or applied) the others.
func (a *applier) claim(ctx context.Context, todo []claimed) ([]claimed, error) {
	if len(todo) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.BoolCmd, len(todo))
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range todo {
			cmds[i] = p.SetNX(ctx, markKey(a.prefix, c.id), applying, claimTTL)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("feedback: claim %d reports: %w", len(todo), err)
	}
	var mine []claimed
	for i, c := range todo {
		if cmds[i].Val() {
			mine = append(mine, c)
		}
	}
	return mine, nil
}

// applyClaimed suppresses the addresses and records the events of reports,
// and returns how many were applied and how many named a message without a
// history.
func (a *applier) applyClaimed(ctx context.Context, provider string, reports []claimed) (applied, unknown int, err error) {
	var messages []string
	for _, r := range reports {
		if r.Message != "" {
			messages = append(messages, r.Message)
		}
	}
	tenants, err := a.events.Tenants(ctx, messages...)
	if err != nil {
		return 0, 0, err
	}
	var events []lifecycle.Event
	var types []lifecycle.Type // of the reports applied
	for _, r := range reports {
		tenant, known := tenants[r.Message]
		if r.Message != "" && !known {
			unknown++
			a.metrics.Reports.WithLabelValues(provider, resultUnknown).Inc()
			continue
		}
		if r.suppresses() {
			if err := a.screen.Suppress(ctx, provider, r.Address, r.reason(), time.Now()); err != nil {
				return 0, 0, err
			}
		}
		if r.Message != "" {
			events = append(events, r.event(provider, tenant))
		}
		types = append(types, r.Type)
	}
	if err := a.events.Record(ctx, events...); err != nil {
		return 0, 0, err
	}
	for _, t := range types {
		a.metrics.Reports.WithLabelValues(provider, string(t)).Inc()
	}
	return len(types), unknown, nil
}

// mark makes the reports' claims "applied". A mark not written leaves a
// claim that expires: a replay then applies the report again, to the same
// effect (same event ID, same suppression).
func (a *applier) mark(ctx context.Context, reports []claimed) {
	ctx = context.WithoutCancel(ctx) // applied: the marks go, whatever the request's deadline
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range reports {
			p.Set(ctx, markKey(a.prefix, r.id), applied, a.remember)
		}
		return nil
	})
	if err != nil {
		a.log.Warn("feedback: reports applied, but not marked so", "reports", len(reports), "err", err)
	}
}

// drop takes back the claims of reports not applied, for the vendor's retry.
func (a *applier) drop(ctx context.Context, reports []claimed) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range reports {
			p.Del(ctx, markKey(a.prefix, r.id)) // one by one: on a cluster, each in its own slot
		}
		return nil
	})
	if err != nil {
		a.log.Warn("feedback: claims not dropped: the provider's retry finds them replayed until they expire",
			"reports", len(reports), "expire_in", claimTTL, "err", err)
	}
}
