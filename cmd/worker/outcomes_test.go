package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/digest"
	"github.com/notify-throttle/throttler/internal/redisguard"
	"github.com/notify-throttle/throttler/message"
)

// lockedBuffer is a log's output, written by the worker's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

const outcomesYAML = `
worker: {queues: {default: 1}, poll_interval: 50ms, jitter: 0s, inline_wait: 0s, http_addr: "", book: %t}
policies:
  pace: [{limit: 1, per: 1h}]
  capped: {windows: [{limit: 1, per: 1h}], over_cap: drop}
  weekly: {windows: [{limit: 1, per: 1h}], over_cap: digest}
providers:
  out: {type: log, rate: 1000, burst: 100}
defaults: {policy: pace, provider: out, queue: default}
log: {format: json}
`

// TestOneLinePerOutcome runs the worker's asynq server, as main builds it,
// on a real Redis, with a message of each outcome, and checks that each
// task has exactly one log line, with its ID, at INFO for what the rules
// chose and WARN for a fault, and that asynq's own "Retry exhausted" line
// is never written for them (a rule's drop or expiry is the product
// working as configured, not something to alert on).
func TestOneLinePerOutcome(t *testing.T) {
	for _, book := range []bool{false, true} {
		t.Run(fmt.Sprintf("book=%t", book), func(t *testing.T) {
			rdb, _ := shared.NewClient(t)
			cfg, err := config.Parse("outcomes.yaml", []byte(fmt.Sprintf(outcomesYAML, book)))
			if err != nil {
				t.Fatal(err)
			}
			var out lockedBuffer
			srv := serve(t, cfg, rdb, &out)
			client := asynq.NewClientFromRedisClient(rdb)
			defer client.Close()
			insp := asynq.NewInspectorFromRedisClient(rdb)
			enqueue := func(id string, n message.Notification, want asynq.TaskState) {
				t.Helper()
				n.Provider, n.Template = "out", "hello"
				task, err := message.NewTask(n, id, asynq.Queue("default"), asynq.Retention(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := client.Enqueue(task); err != nil {
					t.Fatal(err)
				}
				await(t, insp, id, want)
			}
			soon := time.Now().Add(time.Minute)
			enqueue("sent", message.Notification{Recipient: "alice@example.com", Policy: "pace"}, asynq.TaskStateCompleted)
			enqueue("held", message.Notification{Recipient: "alice@example.com", Policy: "pace"}, asynq.TaskStateRetry)
			enqueue("expiring", message.Notification{Recipient: "alice@example.com", Policy: "pace", SendBy: &soon}, asynq.TaskStateArchived)
			enqueue("capped-1", message.Notification{Recipient: "bob@example.com", Policy: "capped"}, asynq.TaskStateCompleted)
			enqueue("capped-2", message.Notification{Recipient: "bob@example.com", Policy: "capped"}, asynq.TaskStateArchived)
			enqueue("weekly-1", message.Notification{Recipient: "carol@example.com", Policy: "weekly"}, asynq.TaskStateCompleted)
			enqueue("weekly-2", message.Notification{Recipient: "carol@example.com", Policy: "weekly"}, asynq.TaskStateCompleted)
			if _, err := client.Enqueue(asynq.NewTask(message.TaskType, []byte("{"), asynq.TaskID("malformed"), asynq.Queue("default"))); err != nil {
				t.Fatal(err)
			}
			await(t, insp, "malformed", asynq.TaskStateArchived)
			srv.Shutdown()

			held := "INFO deferred"
			if book {
				held = "INFO booked"
			}
			want := map[string][]string{
				"sent": {"INFO sent"}, "held": {held}, "expiring": {"INFO expired"},
				"capped-1": {"INFO sent"}, "capped-2": {"INFO dropped"},
				"weekly-1": {"INFO sent"}, "weekly-2": {"INFO folded"},
				"malformed": {"WARN archived"},
			}
			got := map[string][]string{}
			logText := out.String()
			for _, line := range strings.Split(strings.TrimSpace(logText), "\n") {
				var l struct{ Level, Msg, Task string }
				if err := json.Unmarshal([]byte(line), &l); err != nil {
					t.Fatalf("not a JSON log line: %q", line)
				}
				if l.Task != "" {
					got[l.Task] = append(got[l.Task], l.Level+" "+l.Msg)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("log lines by task (-want +got)\n-%v\n+%v\nlog:\n%s", want, got, logText)
			}
			for _, bad := range []string{"Retry exhausted", "job failed", "alice@example.com", "bob@example.com"} {
				if strings.Contains(logText, bad) {
					t.Errorf("the log has %q:\n%s", bad, logText)
				}
			}
		})
	}
}

// serve starts the worker's asynq server for cfg on rdb, as main builds it,
// logging to out, until the test ends.
func serve(t *testing.T, cfg *config.Config, rdb redis.UniversalClient, out io.Writer) *asynq.Server {
	t.Helper()
	log := newLogger(cfg.Log, out)
	th, _, err := newThrottle(cfg, rdb, prometheus.NewRegistry(), log, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(cfg, cfg.Worker.Queues, rdb, newOutcomes(log), redisguard.New(log, redisguard.Options{}).AsynqLogger())
	mux := asynq.NewServeMux()
	mux.Handle(message.TaskType, th)
	mux.Handle(digest.TaskType, th)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// await polls task id until it is in state want.
func await(t *testing.T, insp *asynq.Inspector, id string, want asynq.TaskState) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := insp.GetTaskInfo("default", id)
		if err == nil && info.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s never became %s: %+v, %v", id, want, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRetryLineSaysTheProvidersBudget: a send that failed for a while
// (a 5xx) through a provider with its own max_retries says it will be
// retried, out of that budget, not the task's (asynq's 25), and names no
// recipient.
func TestRetryLineSaysTheProvidersBudget(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		http.Error(w, "no route to "+r.PostForm.Get("To"), http.StatusBadGateway)
	}))
	defer down.Close()
	rdb, _ := shared.NewClient(t)
	cfg, err := config.Parse("retry.yaml", []byte(`
worker: {queues: {default: 1}, poll_interval: 50ms, jitter: 0s, inline_wait: 0s, http_addr: ""}
policies:
  pace: [{limit: 10, per: 1h}]
providers:
  sms: {type: twilio, account_sid: AC1, password: token, from: "+15550001111", base_url: `+down.URL+`, max_retries: 2, backoff: 1h, rate: 10, burst: 10}
defaults: {policy: pace, provider: sms, queue: default}
log: {format: json}
`))
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	serve(t, cfg, rdb, &out)
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	task, err := message.NewTask(message.Notification{Recipient: "+15550002222", Policy: "pace", Provider: "sms", Template: "otp",
		Data: []byte(`{"body":"Your code is 1234"}`)}, "otp-1", asynq.Queue("default"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
	var line struct {
		Msg, Task string
		Retry, Of int
		Err       string
	}
	for deadline := time.Now().Add(15 * time.Second); line.Msg != "job failed"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no job failed line:\n%s", out.String())
		}
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, `"msg":"job failed"`) {
				_ = json.Unmarshal([]byte(l), &line)
			}
		}
	}
	if line.Task != "otp-1" || line.Retry != 1 || line.Of != 2 || !strings.Contains(line.Err, "502") || strings.Contains(out.String(), "5550002222") {
		t.Errorf("job failed line %+v, want retry 1 of 2 with the 502 and no recipient; log:\n%s", line, out.String())
	}
}

// TestLogSettings: log.format json writes JSON, log.level warn leaves INFO
// out.
func TestLogSettings(t *testing.T) {
	var b bytes.Buffer
	log := newLogger(config.Log{Format: config.LogJSON, Level: "warn"}, &b)
	log.Info("sent", "task", "a")
	log.Warn("archived", "task", "b")
	var l map[string]any
	if err := json.Unmarshal(b.Bytes(), &l); err != nil || l["msg"] != "archived" || strings.Count(b.String(), "\n") != 1 {
		t.Errorf("log with format json, level warn:\n%s", b.String())
	}
	b.Reset()
	newLogger(config.Log{Format: config.LogText, Level: "debug"}, &b).Debug("digest sent", "task", "c")
	if !strings.HasPrefix(b.String(), "time=") || !strings.Contains(b.String(), `level=DEBUG msg="digest sent" task=c`) {
		t.Errorf("log with format text, level debug: %q", b.String())
	}
}
