package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/intake"
)

// Limits of a tenant's list, kept in Redis in parts of an hour each
// (listKey): docs/operations.md#the-http-api, "The list".
const (
	ListRetention    = intake.KeyRetention // after a notification was queued, give or take its part's hour
	DefaultListLimit = 20                  // a page's size by default
	MaxListLimit     = 100                 // and at most
	listScan         = 3                   // entries a page reads at most per one it returns (with a state filter)
)

// hour is a list part's span, in µs.
const hour = int64(time.Hour / time.Microsecond)

// listed adds a notification just enqueued to its tenant's list, at the
// µs the API accepted it. A failure is logged, not answered: a 503 would
// have the producer enqueue it again.
func (s *Server) listed(ctx context.Context, c *client, id, queue string, accepted time.Time) {
	us := accepted.UnixMicro()
	k := listKey(s.cfg.Redis.Prefix, c.key.Tenant, us/hour)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, k, redis.Z{Score: float64(us), Member: id + " " + queue})
		p.PExpireAt(ctx, k, time.UnixMicro((us/hour+1)*hour).Add(ListRetention))
		return nil
	})
	if err != nil && s.log != nil {
		s.log.Warn("api: a notification enqueued is missing from its tenant's list", "id", id, "err", err)
	}
}

// listAnswer is the body of GET /v1/notifications.
type listAnswer struct {
	Notifications []*View `json:"notifications"`
	NextCursor    string  `json:"next_cursor,omitempty"` // the next page's cursor; absent at the end
}

// listQuery is a list request's parameters.
type listQuery struct {
	state         string    // "": any
	after, before time.Time // exclusive; zero: unbounded
	limit         int
	from          *position // the cursor: where the last page ended
}

// position is an entry's place in a list, newest first: by time, then by
// member, as ZRANGE ... REV orders them.
type position struct {
	us     int64
	member string
}

// list serves GET /v1/notifications.
func (s *Server) list(w http.ResponseWriter, r *http.Request, c *client) (logged, error) {
	if err := s.limit(w, r, c, 1); err != nil {
		return logged{}, err
	}
	q, err := parseListQuery(r.URL.Query())
	if err != nil {
		return logged{}, err
	}
	page, next, err := s.page(r.Context(), c, q, time.Now())
	if err != nil {
		return logged{}, err
	}
	ans := listAnswer{Notifications: page}
	if next != nil {
		ans.NextCursor = next.encode()
	}
	writeJSON(w, http.StatusOK, ans)
	return logged{count: len(page)}, nil
}

var listParams = []string{"state", "created_after", "created_before", "limit", "cursor"}

// parseListQuery reads a list's parameters; an error names the one at fault.
func parseListQuery(v url.Values) (listQuery, error) {
	q := listQuery{limit: DefaultListLimit}
	for name, vals := range v {
		if !slices.Contains(listParams, name) {
			return q, badParam(name, "unknown parameter %s (parameters: %s)", intake.Quote(name), strings.Join(listParams, ", "))
		}
		if len(vals) > 1 {
			return q, badParam(name, "given %d times", len(vals))
		}
	}
	if st := v.Get("state"); st != "" {
		if !slices.Contains(states, st) {
			return q, badParam("state", "%s is not a state (states: %s)", intake.Quote(st), strings.Join(states, ", "))
		}
		q.state = st
	}
	for name, dst := range map[string]*time.Time{"created_after": &q.after, "created_before": &q.before} {
		if t := v.Get(name); t != "" {
			at, err := time.Parse(time.RFC3339, t)
			if err != nil {
				return q, badParam(name, "must be an RFC 3339 time such as 2026-11-22T10:00:00Z (got %s)", intake.Quote(t))
			}
			*dst = at
		}
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxListLimit {
			return q, badParam("limit", "must be from 1 to %d (got %s)", MaxListLimit, intake.Quote(l))
		}
		q.limit = n
	}
	if cur := v.Get("cursor"); cur != "" {
		p, ok := decodeCursor(cur)
		if !ok {
			return q, badParam("cursor", "not a cursor this API gave: pass next_cursor as it came")
		}
		q.from = &p
	}
	return q, nil
}

func badParam(name, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: name, Message: name + ": " + fmt.Sprintf(format, args...)}
}

// page returns a page of q's notifications, and the position to go on
// from, or nil at the end of the list.
func (s *Server) page(ctx context.Context, c *client, q listQuery, now time.Time) ([]*View, *position, error) {
	hi := now.Add(time.Minute).UnixMicro() // producers' clocks differ a little
	if !q.before.IsZero() {
		hi = min(hi, q.before.UnixMicro()-1)
	}
	if q.from != nil {
		hi = min(hi, q.from.us)
	}
	lo := now.Add(-ListRetention - time.Hour).UnixMicro()
	if !q.after.IsZero() {
		lo = max(lo, q.after.UnixMicro()+1)
	}
	out := []*View{}
	var last *position
	budget := q.limit * listScan
	chunk := int64(budget + 1)
	for h := hi / hour; h >= lo/hour && hi >= lo; h-- {
		for offset := int64(0); ; offset += chunk {
			zs, err := s.rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: listKey(s.cfg.Redis.Prefix, c.key.Tenant, h),
				Start: hi, Stop: lo, ByScore: true, Rev: true, Offset: offset, Count: chunk}).Result() // REV: from hi down
			if err != nil {
				return nil, nil, unavailable(err)
			}
			for _, z := range zs {
				p := position{us: int64(z.Score), member: z.Member.(string)}
				if q.from != nil && p.us == q.from.us && p.member >= q.from.member {
					continue // on the last page already
				}
				if len(out) == q.limit || budget == 0 {
					return out, last, nil
				}
				budget--
				last = &p
				v, err := s.listView(ctx, c, p)
				if err != nil {
					return nil, nil, err
				}
				if v != nil && (q.state == "" || v.State == q.state) {
					out = append(out, v)
				}
			}
			if int64(len(zs)) < chunk {
				break
			}
		}
	}
	return out, nil, nil
}

// listView returns where the notification at p stands, or nil when it is
// forgotten (done, its sent marker gone).
func (s *Server) listView(ctx context.Context, c *client, p position) (*View, error) {
	id, queue, _ := strings.Cut(p.member, " ")
	v, err := s.view(ctx, id, []string{queue}, c)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if v.QueuedAt == nil { // sent, its task gone: what the list knows
		at := time.UnixMicro(p.us).UTC().Truncate(time.Second)
		v.Queue, v.QueuedAt = queue, &at
	}
	return v, nil
}

// encode makes p a cursor: opaque to clients, who pass it back as it came.
func (p position) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.us, 10) + " " + p.member))
}

// decodeCursor reads a cursor encode made.
func decodeCursor(s string) (position, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return position{}, false
	}
	us, member, _ := strings.Cut(string(b), " ")
	n, err := strconv.ParseInt(us, 10, 64)
	id, queue, ok := strings.Cut(member, " ")
	if err != nil || !ok || queue == "" || uuid.Validate(id) != nil {
		return position{}, false
	}
	return position{us: n, member: member}, true
}
