package providers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// SendGrid sends email through SendGrid's v3 Mail Send API.
type SendGrid struct {
	Settings
	APIKey   string
	From     string // the sender's address
	FromName string // optional
	client   *http.Client
}

// NewSendGrid returns a SendGrid provider.
func NewSendGrid(s Settings, apiKey, from, fromName string) *SendGrid {
	return &SendGrid{Settings: s, APIKey: apiKey, From: from, FromName: fromName,
		client: s.httpClient()}
}

// Scopes returns none: SendGrid limits the whole account.
func (p *SendGrid) Scopes(Message) []string { return nil }

type sgAddress struct {
	Email string `json:"email"`
	Name  string `json:"name,omitempty"`
}

type sgContent struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type sgPersonalization struct {
	To []sgAddress `json:"to"`
}

type sgMail struct {
	Personalizations []sgPersonalization `json:"personalizations"`
	From             sgAddress           `json:"from"`
	Subject          string              `json:"subject"`
	Content          []sgContent         `json:"content"`
	CustomArgs       map[string]string   `json:"custom_args,omitempty"`
}

// Send posts m and classifies the answer; the ID of a message sent is the
// answer's X-Message-Id. custom_args carry the task ID into SendGrid's
// events (package feedback).
func (p *SendGrid) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := emailContent("sendgrid "+p.Name, m)
	if err != nil {
		return "", err
	}
	mail := sgMail{Personalizations: []sgPersonalization{{To: []sgAddress{{Email: m.Recipient}}}},
		From: sgAddress{Email: p.From, Name: p.FromName}, Subject: c.Subject, CustomArgs: map[string]string{"task_id": m.ID}}
	if c.Body != "" {
		mail.Content = append(mail.Content, sgContent{"text/plain", c.Body})
	}
	if c.HTML != "" {
		mail.Content = append(mail.Content, sgContent{"text/html", c.HTML})
	}
	body, _ := json.Marshal(mail)
	status, h, resp, err := post(ctx, p.client, "sendgrid "+p.Name, p.base("https://api.sendgrid.com")+"/v3/mail/send",
		bytes.NewReader(body), "Authorization", "Bearer "+p.APIKey, "Content-Type", "application/json")
	if err != nil {
		return "", err
	}
	if status >= 200 && status < 300 {
		return h.Get("X-Message-Id"), nil
	}
	return "", p.classify(status, h, resp)
}

// classify maps SendGrid's answer to an outcome.
func (p *SendGrid) classify(status int, h http.Header, resp []byte) error {
	what := fmt.Sprintf("sendgrid %s: %d: %s", p.Name, status, snippet(resp))
	switch {
	case status == http.StatusTooManyRequests:
		if at, ok := epoch(h.Get("X-RateLimit-Reset")); ok {
			return pause(0, at, "", "%s", what)
		}
		after, at := retryAfter(h.Get("Retry-After"), time.Second)
		return pause(after, at, "", "%s", what)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return broken("%s", what)
	case status >= 500:
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what)
}

// emailContent decodes m's data and checks that it makes an email: a
// subject, and a body or html.
func emailContent(provider string, m Message) (Content, error) {
	c, err := content(provider, m)
	switch {
	case err != nil:
		return c, err
	case c.Subject == "":
		return c, reject("%s: data.subject is empty: an email needs a subject", provider)
	case c.Body == "" && c.HTML == "":
		return c, reject("%s: data.body and data.html are empty: an email needs one", provider)
	}
	return c, nil
}
