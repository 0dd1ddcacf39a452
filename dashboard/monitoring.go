package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/hibiken/asynqmon"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/message"
)

// monitoring returns asynq's dashboard (asynqmon) at /monitoring/ on the
// worker's client, payloads' recipients redacted. Without actions, every
// request but GET and HEAD is refused here, whatever asynqmon's read-only
// mode does.
func monitoring(rdb redis.UniversalClient, actions bool) http.Handler {
	h := asynqmon.New(asynqmon.Options{
		RootPath:         "/monitoring",
		RedisConnOpt:     sharedClient{rdb},
		PayloadFormatter: asynqmon.PayloadFormatterFunc(formatPayload),
		ReadOnly:         !actions,
	})
	// h is never closed: that would close the worker's client.
	if actions {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "the asynq dashboard is read-only: worker.dashboard.actions: true allows "+r.Method, http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// sharedClient hands asynqmon the worker's client (login, TLS, cluster and
// the outage guard included).
type sharedClient struct{ rdb redis.UniversalClient }

func (c sharedClient) MakeRedisClient() any { return c.rdb }

// formatPayload shows a notification or a digest as JSON, its recipient
// redacted; other task types as asynqmon would. A notification that does
// not decode is not shown: it may hold a recipient.
func formatPayload(taskType string, payload []byte) string {
	if taskType == digest.TaskType { // {recipient, policy, provider, gen}
		var d map[string]any
		if json.Unmarshal(payload, &d) != nil {
			return fmt.Sprintf("(a malformed digest of %d bytes, not shown)", len(payload))
		}
		if r, ok := d["recipient"].(string); ok {
			d["recipient"] = message.Redact(r)
		}
		b, _ := json.Marshal(d)
		return string(b)
	}
	if taskType != message.TaskType {
		if utf8.Valid(payload) {
			return string(payload)
		}
		return fmt.Sprintf("(%d bytes, not text)", len(payload))
	}
	n, err := message.Decode(payload)
	if err != nil {
		return fmt.Sprintf("(a malformed notification of %d bytes, not shown: %v)", len(payload), err)
	}
	n.Recipient = message.Redact(n.Recipient)
	b, err := json.Marshal(n)
	if err != nil {
		return "(not shown)"
	}
	return string(b)
}
