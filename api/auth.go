package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/throttle"
)

// client is an API key's holder: what it may do and its rate limit.
type client struct {
	name   string
	sum    [sha256.Size]byte // of the key: compared in constant time
	key    config.APIKey
	bucket *throttle.Bucket // notifications per second, per key
	setup  *setup           // the keys and names it was found among
}

// clients returns the config's API keys, by name.
func clients(cfg *config.Config, st *setup) ([]client, error) {
	var out []client
	for _, name := range slices.Sorted(maps.Keys(cfg.API.Keys)) {
		k := cfg.API.Keys[name]
		b, err := throttle.NewBucket(bucketName, k.Rate, k.Burst)
		if err != nil {
			return nil, fmt.Errorf("api: key %s: %w", name, err)
		}
		out = append(out, client{name: name, sum: sha256.Sum256([]byte(k.Key)), key: k, bucket: b, setup: st})
	}
	return out, nil
}

// bucketName names the keys' rate limits among the throttle's rules; the
// subject of each is "api-key:" and the key's name.
const bucketName = "api"

// authenticate returns the client whose key the request carries as
// "Authorization: Bearer <key>". Every key is compared, in constant time,
// so the time taken says nothing about which came close.
func (st *setup) authenticate(r *http.Request) (*client, error) {
	h := r.Header.Get("Authorization")
	scheme, key, _ := strings.Cut(h, " ")
	if h == "" || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return nil, &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized,
			Message: "no API key: send it as Authorization: Bearer <key>", Field: "Authorization"}
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(key)))
	var found *client
	for i := range st.keys {
		if subtle.ConstantTimeCompare(sum[:], st.keys[i].sum[:]) == 1 {
			found = &st.keys[i]
		}
	}
	if found == nil {
		return nil, &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized, Message: "unknown API key", Field: "Authorization"}
	}
	return found, nil
}

// limit takes n tokens of c's bucket (the throttle's, shared by every
// worker), or returns the 429 that says when they will be there, and sets
// the answer's RateLimit headers either way.
func (s *Server) limit(w http.ResponseWriter, r *http.Request, c *client, n int) error {
	if n > c.key.Burst {
		s.peek(w, r, c)
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: "/notifications",
			Message: fmt.Sprintf("%d notifications, more than this key's burst of %d: send fewer at once", n, c.key.Burst)}
	}
	d, err := s.limiter.Admit(r.Context(), throttle.Request{ID: uuid.NewString(),
		Takes: []throttle.Take{{Rule: c.bucket, Subject: "api-key:" + c.name, Cost: n}}})
	if err != nil {
		return unavailable(err)
	}
	rateHeaders(w, c, d)
	if !d.Allowed() {
		return &Error{Status: http.StatusTooManyRequests, Code: CodeRateLimited, RetryAfter: d.Delay,
			Message: fmt.Sprintf("over this key's rate limit (%v/s, burst %d): retry after %s", c.key.Rate, c.key.Burst, timefmt.Duration(d.Delay))}
	}
	return nil
}

// peek sets the RateLimit headers of an answer that took no token (a
// batch refused before it was counted), from what the bucket holds now;
// nothing when Redis cannot tell.
func (s *Server) peek(w http.ResponseWriter, r *http.Request, c *client) {
	d, err := s.limiter.Check(r.Context(), throttle.Request{ID: uuid.NewString(),
		Takes: []throttle.Take{{Rule: c.bucket, Subject: "api-key:" + c.name, Cost: 1}}})
	if err == nil {
		if d.Allowed() {
			d.Remaining++ // Check counts the token it would take
		}
		rateHeaders(w, c, d)
	}
}

// rateHeaders sets the three RateLimit headers of
// draft-ietf-httpapi-ratelimit-headers (docs/operations.md#the-http-api).
func rateHeaders(w http.ResponseWriter, c *client, d throttle.Decision) {
	left := max(0, min(d.Remaining, c.key.Burst))
	if !d.Allowed() {
		left = 0
	}
	full := math.Ceil(float64(c.key.Burst-left) / c.key.Rate)
	h := w.Header()
	h.Set("RateLimit-Limit", strconv.Itoa(c.key.Burst))
	h.Set("RateLimit-Remaining", strconv.Itoa(left))
	h.Set("RateLimit-Reset", strconv.FormatFloat(full, 'f', 0, 64))
}
