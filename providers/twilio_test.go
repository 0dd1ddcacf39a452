package providers

import (
	"cmp"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// twilioMessages are the messages of Twilio's error reference that name
// the recipient ({to}); the others say "documented".
var twilioMessages = map[int]string{
	21211: "The 'To' number {to} is not a valid phone number.",
	21614: "'To' number {to} is not a valid mobile number",
}

func twilioErr(status, code int, retryAfter string) answer {
	msg := cmp.Or(twilioMessages[code], "documented")
	a := answer{status: status, body: `{"code":` + itoa(code) + `,"message":"` + msg + `","more_info":"https://www.twilio.com/docs/errors/` + itoa(code) + `","status":` + itoa(status) + `}`}
	if retryAfter != "" {
		a.headers = map[string]string{"Retry-After": retryAfter}
	}
	return a
}

func TestTwilioClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	answers := map[string]answer{
		"+15550000001": twilioErr(429, 20429, "2"),
		"+15550000002": twilioErr(429, 14107, "7"),
		"+15550000003": twilioErr(429, 21611, ""),
		"+15550000004": twilioErr(429, 63017, "3"),
		"+15550000005": twilioErr(400, 21211, ""),
		"+15550000006": twilioErr(400, 21610, ""),
		"+15550000007": twilioErr(400, 21614, ""),
		"+15550000008": twilioErr(400, 21635, ""),
		"+15550000009": twilioErr(401, 20003, ""),
		"+15550000010": twilioErr(400, 21602, ""),
		"+15550000011": {status: 503, body: "down"},
		"+15550000012": twilioErr(429, 30001, "1"),
		"+15550000013": twilioErr(429, 14107, ""),
		"+15550000014": {status: 400, body: "To={to}: not a number"},
	}
	for to, a := range answers { // the answer names its recipient
		a.body = strings.ReplaceAll(a.body, "{to}", to)
		answers[to] = a
	}
	f := newFake(t, answer{status: 201, body: `{"sid":"SM1","status":"queued"}`}, answers, func(t *testing.T, r *http.Request) string {
		user, pass, ok := r.BasicAuth()
		if r.Method != http.MethodPost || r.URL.Path != "/2010-04-01/Accounts/AC123/Messages.json" || !ok || user != "AC123" || pass != "secret-token" {
			t.Errorf("request %s %s auth %q:%q", r.Method, r.URL.Path, user, pass)
		}
		if err := r.ParseForm(); err != nil || r.PostForm.Get("From") != "+15559999999" || r.PostForm.Get("Body") != "Your code is 1234" {
			t.Errorf("form %v, %v", r.PostForm, err)
		}
		return r.PostForm.Get("To")
	})
	p := NewTwilio(Settings{Name: "sms", BaseURL: f.URL, ScopePause: 30 * time.Second}, "AC123", "AC123", "secret-token", "+15559999999", "")
	from := "+15559999999"
	cases := map[string]want{
		"+15550000000": {sent: true, id: "SM1"},
		"+15550000001": {outcome: Retry, after: 2 * time.Second, text: "error 20429"},
		"+15550000002": {outcome: Pause, scope: PairScope(from, "+15550000002"), after: 7 * time.Second},
		"+15550000003": {outcome: Pause, scope: SenderScope(from), after: 30 * time.Second},
		"+15550000012": {outcome: Pause, scope: SenderScope(from), after: time.Second},
		"+15550000013": {outcome: Pause, scope: PairScope(from, "+15550000013"), after: 30 * time.Second},
		"+15550000004": {outcome: Pause, after: 3 * time.Second},
		"+15550000005": {outcome: Dead, text: "error 21211: The 'To' number +1***05 is not a valid phone number."},
		"+15550000006": {outcome: Dead},
		"+15550000007": {outcome: Dead, text: "error 21614"},
		"+15550000008": {outcome: Dead},
		"+15550000009": {outcome: Broken},
		"+15550000010": {outcome: Reject},
		"+15550000011": {retry: true, text: "503"},
		"+15550000014": {outcome: Reject, text: "400: To=+1***14: not a number"},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Template: "otp", Data: []byte(`{"body":"Your code is 1234"}`)})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	if _, err := p.Send(ctx(t), Message{ID: "t2", Recipient: "+15550000000"}); err == nil {
		t.Error("a message without a body was sent")
	}
}

// TestTwilioStatusCallback: with a StatusCallback, each message asks
// Twilio to POST its statuses to the URL made of its ID; without, none.
func TestTwilioStatusCallback(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	f := newFake(t, answer{status: 201, body: `{"sid":"SM1","status":"queued"}`}, nil, func(t *testing.T, r *http.Request) string {
		if err := r.ParseForm(); err != nil {
			t.Error(err)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.PostForm.Get("StatusCallback"))
		return r.PostForm.Get("To")
	})
	p := NewTwilio(Settings{Name: "sms", BaseURL: f.URL}, "AC123", "AC123", "secret-token", "+15559999999", "")
	msg := Message{ID: "t1", Recipient: "+15550000000", Data: []byte(`{"body":"hi"}`)}
	if _, err := p.Send(ctx(t), msg); err != nil {
		t.Fatal(err)
	}
	p.StatusCallback = func(id string) string { return "https://api.example.com/v1/feedback/sms?m=" + id }
	if _, err := p.Send(ctx(t), msg); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"", "https://api.example.com/v1/feedback/sms?m=t1"}; !slices.Equal(got, want) {
		t.Errorf("StatusCallback %q, want %q", got, want)
	}
}
