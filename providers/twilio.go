package providers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// twilioPairPause is how long Twilio fails a pair's messages after 14107,
// per its error reference, when it sends no Retry-After.
const twilioPairPause = 30 * time.Second

// Twilio sends SMS through Twilio's Messages API.
type Twilio struct {
	Settings
	AccountSID         string
	Username, Password string                 // the account SID and auth token, or an API key's SID and secret
	From               string                 // a sender number; or
	ServiceSID         string                 // a messaging service
	StatusCallback     func(id string) string // if set, the URL of a message's statuses (feedback.TwilioCallback)
	client             *http.Client
}

// NewTwilio returns a Twilio provider.
func NewTwilio(s Settings, accountSID, username, password, from, serviceSID string) *Twilio {
	return &Twilio{Settings: s, AccountSID: accountSID, Username: username, Password: password,
		From: from, ServiceSID: serviceSID, client: s.httpClient()}
}

// sender is the sender identity scopes are keyed by.
func (p *Twilio) sender() string {
	if p.From != "" {
		return p.From
	}
	return p.ServiceSID
}

// Scopes returns the sender and the (sender, recipient) pair.
func (p *Twilio) Scopes(m Message) []string {
	return []string{SenderScope(p.sender()), PairScope(p.sender(), m.Recipient)}
}

// twilioError is Twilio's error body.
type twilioError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Send posts m and classifies the answer; the ID of a message sent is its
// SID.
func (p *Twilio) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := content("twilio "+p.Name, m)
	if err != nil {
		return "", err
	}
	if c.Body == "" {
		return "", reject("twilio %s: data.body is empty: an SMS needs a body", p.Name)
	}
	form := url.Values{"To": {m.Recipient}, "Body": {c.Body}}
	if p.ServiceSID != "" {
		form.Set("MessagingServiceSid", p.ServiceSID)
	} else {
		form.Set("From", p.From)
	}
	if p.StatusCallback != nil {
		form.Set("StatusCallback", p.StatusCallback(m.ID))
	}
	u := p.base("https://api.twilio.com") + "/2010-04-01/Accounts/" + url.PathEscape(p.AccountSID) + "/Messages.json"
	basic := base64.StdEncoding.EncodeToString([]byte(p.Username + ":" + p.Password))
	status, h, body, err := post(ctx, p.client, "twilio "+p.Name, u, strings.NewReader(form.Encode()),
		"Authorization", "Basic "+basic, "Content-Type", "application/x-www-form-urlencoded")
	if err != nil {
		return "", err
	}
	if status >= 200 && status < 300 {
		var sent struct {
			SID string `json:"sid"`
		}
		_ = json.Unmarshal(body, &sent)
		return sent.SID, nil
	}
	var te twilioError
	_ = json.Unmarshal(body, &te)
	return "", p.classify(status, h, te, m.Recipient, body)
}

// classify maps a Twilio error to its outcome.
func (p *Twilio) classify(status int, h http.Header, te twilioError, to string, body []byte) error {
	what := fmt.Sprintf("twilio %s: %d error %d: %s", p.Name, status, te.Code, te.Message)
	if te.Code == 0 {
		what = fmt.Sprintf("twilio %s: %d: %s", p.Name, status, snippet(body))
	}
	after, at := retryAfter(h.Get("Retry-After"), time.Second)
	switch te.Code {
	case 20429: // too many concurrent requests: never processed, safe to retry
		return retryAt(after, at, "%s", what)
	case 14107: // too many messages between this pair of numbers
		after, at = retryAfter(h.Get("Retry-After"), twilioPairPause)
		return pause(after, at, PairScope(p.sender(), to), "%s", what)
	case 21611, 30001: // the sender's queue overflowed
		after, at = retryAfter(h.Get("Retry-After"), p.scopePause())
		return pause(after, at, SenderScope(p.sender()), "%s", what)
	case 63017: // the account's rate
		return pause(after, at, "", "%s", what)
	case 21211, 21610, 21614, 21635: // invalid, unsubscribed, not mobile, landline
		return dead("%s", what)
	case 20003, 20005, 20008: // authentication, account suspended, test credentials
		return broken("%s", what)
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return broken("%s", what)
	case status == http.StatusTooManyRequests:
		return pause(after, at, "", "%s", what)
	case status >= 500:
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what)
}
