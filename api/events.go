package api

import (
	"context"
	"time"

	"github.com/notify-throttle/throttler/lifecycle"
)

// recordWithin bounds the recording of an event: the request does not
// wait longer, nor fail for it.
const recordWithin = 2 * time.Second

// record records the accepted and canceled events (package lifecycle); a
// failure is logged, the request goes on.
func (s *Server) record(ctx context.Context, events ...lifecycle.Event) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWithin)
	defer cancel()
	if err := s.events.Record(ctx, events...); err != nil && s.log != nil {
		s.log.Warn("api: event not recorded", "id", events[0].Message, "event", events[0].Type, "err", err)
	}
}

// history returns the events of message id that c's tenant may see: all
// of them, if the message is its tenant's.
func (s *Server) history(ctx context.Context, id string, c *client) ([]lifecycle.Event, error) {
	events, err := s.events.History(ctx, id)
	if err != nil {
		return nil, unavailable(err)
	}
	if len(events) > 0 && events[0].Tenant != c.key.Tenant {
		return nil, nil
	}
	return events, nil
}

// ended returns the view of a message whose task is gone, by the last
// event of its history that ends it, or notFound.
func (s *Server) ended(ctx context.Context, id string, c *client) (*View, error) {
	events, err := s.history(ctx, id, c)
	if err != nil {
		return nil, err
	}
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		v := &View{ID: id, Tenant: e.Tenant}
		switch e.Type {
		case lifecycle.Sent, lifecycle.Delivered, lifecycle.Bounced, lifecycle.Complained, lifecycle.Unsubscribed:
			v.State, v.SentAt = stateSent, &e.At
		case lifecycle.Folded:
			v.State = stateCompleted
		case lifecycle.Archived:
			v.State, v.Reason = stateArchived, e.Reason
		case lifecycle.Dropped:
			v.State, v.Reason = stateArchived, "dropped: over "+e.Rule
		case lifecycle.Expired:
			v.State, v.Reason = stateArchived, "expired: "+e.Reason+" passed"
		case lifecycle.Canceled:
			v.State, v.Reason = stateCanceled, canceledReason
		default:
			continue
		}
		return v, nil
	}
	return nil, notFound(id)
}
