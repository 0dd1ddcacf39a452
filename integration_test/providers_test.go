//go:build integration

package integration_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/notify-throttle/throttler/message"
)

// serviceFake is a loopback fake of a service's API: it records each
// request's recipient and arrival and answers what answer says.
type serviceFake struct {
	srv      *httptest.Server
	mu       sync.Mutex
	arrivals []arrival // Recipient, At and Status only
}

func newServiceFake(t *testing.T, recipient func(r *http.Request) string, answer func(to string, seq int) (status int, headers map[string]string, body string)) *serviceFake {
	t.Helper()
	f := &serviceFake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		to := recipient(r)
		f.mu.Lock()
		seq := len(f.arrivals)
		f.mu.Unlock()
		status, headers, body := answer(to, seq)
		f.mu.Lock()
		f.arrivals = append(f.arrivals, arrival{At: at, Recipient: to, Status: status})
		f.mu.Unlock()
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *serviceFake) snapshot() []arrival {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arrival(nil), f.arrivals...)
}

// to returns the arrivals for one recipient.
func (f *serviceFake) to(recipient string) []arrival {
	var out []arrival
	for _, a := range f.snapshot() {
		if a.Recipient == recipient {
			out = append(out, a)
		}
	}
	return out
}

// serviceFleet is a fleet whose config has one more provider, "svc", of
// the given lines (after "svc:").
func serviceFleet(t *testing.T, svc string) *fleet {
	t.Helper()
	cfg := fleetConfig{Concurrency: 10, ShutdownTimeout: 5 * time.Second, InlineWait: time.Second, Jitter: 0,
		Policy: "[{limit: 100, per: 1m}]", Rate: 100, Burst: 10, ProviderMore: "\n  svc:" + svc}
	return newFleet(t, cfg, nil)
}

// TestTwilioPairPauseHoldsOnlyThatPair: Twilio answers 14107 (too many
// messages between one pair of numbers) with Retry-After: 4 to the first
// message to one number. Messages to other numbers go on at once; the
// paused pair's messages, the one refused and one queued after, reach
// Twilio only once the 4 s are over.
func TestTwilioPairPauseHoldsOnlyThatPair(t *testing.T) {
	const pause = 4 * time.Second
	held := "+15550000001"
	var pausedAt time.Time
	var mu sync.Mutex
	fake := newServiceFake(t, func(r *http.Request) string {
		_ = r.ParseForm()
		if r.URL.Path != "/2010-04-01/Accounts/AC123/Messages.json" || r.PostForm.Get("From") != "+15559999999" || r.PostForm.Get("Body") == "" {
			t.Errorf("twilio request %s %v", r.URL.Path, r.PostForm)
		}
		return r.PostForm.Get("To")
	}, func(to string, seq int) (int, map[string]string, string) {
		mu.Lock()
		defer mu.Unlock()
		if to == held && pausedAt.IsZero() {
			pausedAt = time.Now()
			return 429, map[string]string{"Retry-After": "4"}, `{"code":14107,"message":"Message rate limit exceeded","status":429}`
		}
		return 201, nil, `{"sid":"SM1","status":"queued"}`
	})
	f := serviceFleet(t, fmt.Sprintf(`
    type: twilio
    base_url: %s
    account_sid: AC123
    password: twilio-token
    from: "+15559999999"
    rate: 100
    burst: 10`, fake.srv.URL))
	f.startWorkers("w1", "w2") // the pair is held for both: the pause is in Redis
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	sms := func(key, to string) string {
		return f.enqueue(client, key, message.Notification{Recipient: to, Template: "otp", Provider: "svc", Data: json.RawMessage(`{"body":"code 1234"}`)})
	}
	sms("held-1", held)
	for deadline := time.Now().Add(10 * time.Second); len(fake.to(held)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first message never reached Twilio")
		}
	}
	sms("held-2", held)
	for i := range 10 {
		sms(fmt.Sprintf("other-%d", i), fmt.Sprintf("+1555000010%d", i))
	}
	f.waitSettled(30*time.Second, func(q asynq.QueueInfo) bool { return q.Completed == 12 })
	mu.Lock()
	start := pausedAt
	mu.Unlock()
	var othersBy time.Time
	for _, a := range fake.snapshot() {
		if a.Recipient != held && a.At.After(othersBy) {
			othersBy = a.At
		}
	}
	if d := othersBy.Sub(start); d >= pause {
		t.Errorf("the other pairs' last message went %s after the pause began: they were held with the paused pair", d)
	}
	got := fake.to(held)
	if len(got) != 3 {
		t.Fatalf("the paused pair's messages reached Twilio %d times, want 3 (refused, then both once the pause was over)", len(got))
	}
	for _, a := range got[1:] {
		if d := a.At.Sub(start); d < pause-skewTolerance {
			t.Errorf("a message of the paused pair reached Twilio %s after the pause began, within its %s", d, pause)
		}
	}
	t.Logf("others done %s after the pause began; the pair resumed at +%s and +%s",
		othersBy.Sub(start).Round(time.Millisecond), got[1].At.Sub(start).Round(time.Millisecond), got[2].At.Sub(start).Round(time.Millisecond))
}

// TestFCMUnregisteredSuppressesTheToken: FCM answers 404 UNREGISTERED for a
// token. That message is archived with the reason, the token suppressed,
// the next message to it archived without reaching FCM, and enqueue
// -suppressions lists it; other tokens are unaffected.
func TestFCMUnregisteredSuppressesTheToken(t *testing.T) {
	const dead = "dead:APA91b-token"
	fake := newServiceFake(t, func(r *http.Request) string {
		var m struct {
			Message struct {
				Token        string
				Notification struct{ Title, Body string }
			}
		}
		_ = json.NewDecoder(r.Body).Decode(&m)
		if r.URL.Path != "/v1/projects/demo-app/messages:send" || r.Header.Get("Authorization") != "Bearer static-access-token" || m.Message.Notification.Title != "Hi" {
			t.Errorf("fcm request %s auth %q message %+v", r.URL.Path, r.Header.Get("Authorization"), m)
		}
		return m.Message.Token
	}, func(to string, seq int) (int, map[string]string, string) {
		if to == dead {
			return 404, nil, `{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}`
		}
		return 200, nil, `{"name":"projects/demo-app/messages/1"}`
	})
	f := serviceFleet(t, fmt.Sprintf(`
    type: fcm
    base_url: %s
    project_id: demo-app
    token: static-access-token
    rate: 100
    burst: 10`, fake.srv.URL))
	f.startWorkers("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	push := func(key, to string) string {
		return f.enqueue(client, key, message.Notification{Recipient: to, Template: "shipped", Provider: "svc", Data: json.RawMessage(`{"title":"Hi","body":"shipped"}`)})
	}
	first := push("first", dead)
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Archived == 1 })
	second := push("second", dead)
	live := push("live", "live-token")
	f.waitSettled(20*time.Second, func(q asynq.QueueInfo) bool { return q.Archived == 2 && q.Completed == 1 })
	archived := f.archived()
	if e := archived[first]; e == nil || !strings.HasPrefix(e.LastErr, "dead address: fcm svc: 404 UNREGISTERED") {
		t.Errorf("first: %+v", e)
	}
	if e := archived[second]; e == nil || !strings.HasPrefix(e.LastErr, "suppressed by provider svc since ") || !strings.Contains(e.LastErr, "UNREGISTERED") {
		t.Errorf("second: %+v", e)
	}
	if n := len(fake.to(dead)); n != 1 {
		t.Errorf("FCM got %d messages for the dead token, want 1", n)
	}
	if n := len(fake.to("live-token")); n != 1 || archived[live] != nil {
		t.Errorf("the live token got %d messages", n)
	}
	out, errOut, code := runCommand(t, f.dir, nil, buildBinary(t, "enqueue"), "-config", f.writeConfig("enqueue", ""), "-suppressions", "svc")
	if code != 0 || !strings.Contains(out, dead) || !strings.Contains(out, "404 UNREGISTERED") {
		t.Errorf("enqueue -suppressions: exit %d\n%s%s", code, out, errOut)
	}
}

// TestSESDailyQuotaDefersToTheReset: SES answers "Daily message quota
// exceeded" once. The message is deferred to the provider's quota_reset
// (an hour from now, as a time of day), not failed, and the provider is
// paused fleet-wide: the next message waits too.
func TestSESDailyQuotaDefersToTheReset(t *testing.T) {
	fake := newServiceFake(t, func(r *http.Request) string {
		var in struct {
			Destination struct{ ToAddresses []string }
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=AKIDTEST/") || len(in.Destination.ToAddresses) != 1 {
			t.Errorf("ses request auth %q", r.Header.Get("Authorization"))
			return ""
		}
		return in.Destination.ToAddresses[0]
	}, func(to string, seq int) (int, map[string]string, string) {
		if seq == 0 {
			return 400, map[string]string{"X-Amzn-ErrorType": "LimitExceededException"}, `{"message":"Daily message quota exceeded."}`
		}
		return 200, nil, `{"MessageId":"m1"}`
	})
	now := time.Now().UTC()
	reset := now.Add(time.Hour).Truncate(time.Minute)
	offset := reset.Sub(reset.Truncate(24 * time.Hour))
	f := serviceFleet(t, fmt.Sprintf(`
    type: ses
    base_url: %s
    region: eu-west-1
    access_key_id: AKIDTEST
    secret_access_key: ses-secret
    from: noreply@example.com
    quota_reset: %s
    rate: 14
    burst: 14`, fake.srv.URL, offset))
	f.startWorkers("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	mail := func(key, to string) string {
		return f.enqueue(client, key, message.Notification{Recipient: to, Template: "welcome", Provider: "svc", Data: json.RawMessage(`{"subject":"Hi","body":"Hello"}`)})
	}
	id := mail("quota", "a@example.com")
	var info *asynq.TaskInfo
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		i, err := f.insp.GetTaskInfo(fleetQueue, id)
		if err == nil && i.State == asynq.TaskStateRetry {
			info = i
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message was never deferred: %+v %v", i, err)
		}
	}
	if info.Retried != 0 || !strings.Contains(info.LastErr, "Daily message quota exceeded") {
		t.Errorf("deferral: retried %d, %q", info.Retried, info.LastErr)
	}
	// The task wakes a little before its moment (the fleet's lead: it
	// sleeps the rest), and asynq shows its wake-up to the second, down.
	if d := info.NextProcessAt.Sub(reset); d < -1500*time.Millisecond || d > 3*time.Second {
		t.Errorf("deferred to %s, want the reset %s (- the wake-up's lead and asynq's rounding down, + up to 3s of rounding)", info.NextProcessAt.UTC(), reset)
	}
	next := mail("next", "b@example.com")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		i, err := f.insp.GetTaskInfo(fleetQueue, next)
		if err == nil && i.State == asynq.TaskStateRetry {
			if d := i.NextProcessAt.Sub(reset); d < -3*time.Second || d > 3*time.Second {
				t.Errorf("the next message was deferred to %s, want about the reset %s", i.NextProcessAt.UTC(), reset)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next message was not held by the paused provider: %+v %v", i, err)
		}
	}
	if n := len(fake.snapshot()); n != 1 {
		t.Errorf("SES got %d requests, want 1: the provider is paused", n)
	}
}
