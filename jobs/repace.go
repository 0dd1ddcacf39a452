package jobs

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/fleet"
	"github.com/notify-throttle/throttler/internal/asynqdb"
	"github.com/notify-throttle/throttler/message"
)

// Repace and Reweigh move the work waiting on a changed rate or weight, in
// the throttle (throttle.Limiter.Repace, Reweigh) and in asynq's retry sets
// (fleet.Rescale): docs/booking.md, "Re-pacing when the rules change".

// Repace moves the waiting work of each provider whose rate changed to its
// new rate, looking for its waiting tasks in queues; rdb is asynq's Redis.
// It returns how many tasks it moved.
func (t *Throttle) Repace(ctx context.Context, rdb redis.UniversalClient, queues []string) (int, error) {
	rs := t.rules()
	moved := 0
	for _, name := range slices.Sorted(maps.Keys(rs.Providers)) {
		route := rs.Providers[name]
		if route.Shadow || route.Bucket == nil {
			continue
		}
		k, now, err := t.Limiter.Repace(ctx, route.Bucket, name)
		if err != nil {
			return moved, err
		}
		if k == 0 {
			continue
		}
		n := 0
		err = fleet.Scan(ctx, rdb, queues, func(ws []fleet.Waiting) error {
			m, err := fleet.Rescale(ctx, rdb, ws, now, func(w fleet.Waiting) float64 {
				if provider, _, ok := routeOf(w.Msg); ok && provider == name {
					return k
				}
				return 1
			})
			n += m
			return err
		})
		moved += n
		t.Log.Info("provider rate changed: waiting work re-paced", "provider", name, "rate", route.Bucket.String(),
			"factor", strconv.FormatFloat(k, 'g', 4, 64), "waiting_tasks_moved", n)
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// Reweigh moves the tenants' lines waiting on each provider to the
// tenants' weights in effect, looking for the waiting tasks in queues; rdb
// is asynq's Redis. It returns how many tasks it moved.
func (t *Throttle) Reweigh(ctx context.Context, rdb redis.UniversalClient, queues []string) (int, error) {
	rs := t.rules()
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(rs.Providers)) {
		route := rs.Providers[name]
		if route.Shadow || route.Bucket == nil {
			continue
		}
		yes, err := t.Limiter.Reweighed(ctx, route.Bucket, name, rs.Weights)
		if err != nil {
			return 0, err
		}
		if yes {
			changed = append(changed, name)
		}
	}
	if len(changed) == 0 {
		return 0, nil
	}
	var ws []fleet.Waiting
	if err := fleet.Scan(ctx, rdb, queues, func(batch []fleet.Waiting) error {
		ws = append(ws, batch...)
		return nil
	}); err != nil {
		return 0, err
	}
	moved := 0
	for _, name := range changed {
		// Every tenant waiting is named (one not weighed weighs 1), so that
		// each one's factor comes back for its tasks.
		weights := maps.Clone(rs.Weights)
		if weights == nil {
			weights = map[string]int{}
		}
		tenants := map[string]string{} // task ID -> tenant, for the provider's tasks
		for _, w := range ws {
			if provider, tenant, ok := routeOf(w.Msg); ok && provider == name {
				tenants[w.ID] = tenant
				if _, ok := weights[tenant]; !ok {
					weights[tenant] = 1
				}
			}
		}
		k, now, err := t.Limiter.Reweigh(ctx, rs.Providers[name].Bucket, name, weights)
		if err != nil {
			return moved, err
		}
		if k == nil {
			continue
		}
		n, err := fleet.Rescale(ctx, rdb, ws, now, func(w fleet.Waiting) float64 {
			if tenant, ok := tenants[w.ID]; ok {
				return k[tenant]
			}
			return 1
		})
		moved += n
		t.Log.Info("tenants' weights changed: waiting lines re-paced", "provider", name, "waiting_tasks_moved", n)
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// routeOf returns the provider and tenant of msg (a task hash's msg), if it
// is a notification or digest.
func routeOf(msg string) (provider, tenant string, ok bool) {
	if msg == "" {
		return "", "", false
	}
	typ, payload, err := asynqdb.Payload([]byte(msg))
	if err != nil || typ != message.TaskType && typ != digest.TaskType {
		return "", "", false
	}
	var p struct {
		Provider string `json:"provider"`
		Tenant   string `json:"tenant"`
	}
	if json.Unmarshal(payload, &p) != nil {
		return "", "", false
	}
	return p.Provider, p.Tenant, true
}
