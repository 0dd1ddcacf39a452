package providers

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// sesErr is SES v2's documented error shape: the type in X-Amzn-ErrorType,
// the message in the JSON body.
func sesErr(status int, typ, msg string) answer {
	return answer{status: status, headers: map[string]string{"X-Amzn-ErrorType": typ}, body: `{"message":"` + msg + `"}`}
}

func TestSESClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	answers := map[string]answer{
		"rate@example.com":      sesErr(429, "TooManyRequestsException", "Too many requests."),
		"limit@example.com":     sesErr(400, "LimitExceededException", "Maximum sending rate exceeded."),
		"daily@example.com":     sesErr(400, "LimitExceededException", "Daily message quota exceeded."),
		"rejected@example.com":  sesErr(400, "MessageRejected", "Email address is not verified. The following identities failed the check in region EU-WEST-1: Rejected@Example.com"),
		"notfound@example.com":  sesErr(404, "NotFoundException", "Configuration set does not exist."),
		"suspended@example.com": sesErr(400, "AccountSuspendedException", "Account suspended."),
		"paused@example.com":    sesErr(400, "SendingPausedException", "Sending paused."),
		"creds@example.com":     sesErr(403, "UnrecognizedClientException", "The security token included in the request is invalid."),
		"down@example.com":      sesErr(500, "InternalFailure", "internal"),
	}
	f := newFake(t, answer{status: 200, body: `{"MessageId":"0100-abc"}`}, answers, func(t *testing.T, r *http.Request) string {
		auth := r.Header.Get("Authorization")
		if r.Method != http.MethodPost || r.URL.Path != "/v2/email/outbound-emails" ||
			!strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDTEST/") || !strings.Contains(auth, "/eu-west-1/ses/aws4_request") {
			t.Errorf("request %s %s auth %q", r.Method, r.URL.Path, auth)
		}
		var in struct {
			FromEmailAddress string
			Destination      struct{ ToAddresses []string }
			Content          struct {
				Simple struct {
					Subject struct{ Data string }
					Body    struct{ Text, Html struct{ Data string } }
				}
			}
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Destination.ToAddresses) != 1 {
			t.Fatalf("body %+v, %v", in, err)
		}
		s := in.Content.Simple
		if in.FromEmailAddress != "noreply@example.com" || s.Subject.Data != "Welcome" || s.Body.Text.Data != "Hello" || s.Body.Html.Data != "<p>Hello</p>" {
			t.Errorf("send %+v", in)
		}
		return in.Destination.ToAddresses[0]
	})
	p := NewSES(Settings{Name: "ses", BaseURL: f.URL}, "eu-west-1", "AKIDTEST", "secret", "noreply@example.com")
	p.QuotaReset = 7 * time.Hour
	p.now = func() time.Time { return time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC) }
	cases := map[string]want{
		"ok@example.com":        {sent: true, id: "0100-abc"},
		"rate@example.com":      {outcome: Pause, after: time.Second},
		"limit@example.com":     {outcome: Pause, after: time.Second},
		"daily@example.com":     {outcome: Pause, at: time.Date(2026, 3, 2, 7, 0, 0, 0, time.UTC)},
		"rejected@example.com":  {outcome: Reject, text: "MessageRejected: Email address is not verified. The following identities failed the check in region EU-WEST-1: r***@example.com"},
		"notfound@example.com":  {outcome: Reject},
		"suspended@example.com": {outcome: Broken},
		"paused@example.com":    {outcome: Broken},
		"creds@example.com":     {outcome: Broken},
		"down@example.com":      {retry: true},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Data: []byte(`{"subject":"Welcome","body":"Hello","html":"<p>Hello</p>"}`)})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.requests != len(cases) {
		t.Errorf("%d requests for %d sends: the SDK retried", f.requests, len(cases))
	}
}
