package providers

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

func TestSendGridClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	reset := time.Now().Add(42 * time.Second).Truncate(time.Second)
	answers := map[string]answer{
		"limited@example.com": {status: 429, headers: map[string]string{"X-RateLimit-Reset": itoa(int(reset.Unix())), "X-RateLimit-Remaining": "0"},
			body: `{"errors":[{"field":null,"message":"too many requests"}]}`},
		"bad@example.com":   {status: 400, body: `{"errors":[{"message":"The to email bad@example.com does not contain a valid address.","field":"personalizations.0.to.0.email"}]}`},
		"auth@example.com":  {status: 401, body: `{"errors":[{"message":"The provided authorization grant is invalid, expired, or revoked"}]}`},
		"perm@example.com":  {status: 403, body: `{"errors":[{"message":"access forbidden"}]}`},
		"down@example.com":  {status: 500, body: `{"errors":[{"message":"internal"}]}`},
		"large@example.com": {status: 413, body: `{"errors":[{"message":"payload too large"}]}`},
	}
	f := newFake(t, answer{status: 202, headers: map[string]string{"X-Message-Id": "sg-msg-1"}}, answers, func(t *testing.T, r *http.Request) string {
		if r.Method != http.MethodPost || r.URL.Path != "/v3/mail/send" || r.Header.Get("Authorization") != "Bearer SG.key" {
			t.Errorf("request %s %s auth %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		}
		var mail sgMail
		if err := json.NewDecoder(r.Body).Decode(&mail); err != nil || len(mail.Personalizations) != 1 || len(mail.Personalizations[0].To) != 1 {
			t.Fatalf("body %+v, %v", mail, err)
		}
		if mail.From.Email != "noreply@example.com" || mail.Subject != "Welcome" || len(mail.Content) != 2 ||
			mail.Content[0] != (sgContent{"text/plain", "Hello"}) || mail.Content[1] != (sgContent{"text/html", "<p>Hello</p>"}) || mail.CustomArgs["task_id"] != "t1" {
			t.Errorf("mail %+v", mail)
		}
		return mail.Personalizations[0].To[0].Email
	})
	p := NewSendGrid(Settings{Name: "mail", BaseURL: f.URL}, "SG.key", "noreply@example.com", "")
	cases := map[string]want{
		"ok@example.com":      {sent: true, id: "sg-msg-1"},
		"limited@example.com": {outcome: Pause, at: reset},
		"bad@example.com":     {outcome: Reject, text: "400: {\"errors\":[{\"message\":\"The to email b***@example.com does not contain a valid address."},
		"auth@example.com":    {outcome: Broken},
		"perm@example.com":    {outcome: Broken},
		"down@example.com":    {retry: true},
		"large@example.com":   {outcome: Reject},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Template: "welcome", Data: []byte(`{"subject":"Welcome","body":"Hello","html":"<p>Hello</p>"}`)})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	id, err := p.Send(ctx(t), Message{ID: "t2", Recipient: "ok@example.com", Data: []byte(`{"body":"no subject"}`)})
	checkOutcome(t, "no subject", id, err, want{outcome: Reject, text: "data.subject"})
}
