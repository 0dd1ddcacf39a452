package providers

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// apnsTokenLife is how long a provider token (JWT) is used: Apple accepts
// one for an hour and refuses refreshes more often than every 20 minutes.
const apnsTokenLife = 50 * time.Minute

// APNs sends push notifications through Apple's HTTP/2 API, with an ES256
// provider token: docs/providers.md#each-services-answers.
type APNs struct {
	Settings
	TeamID, KeyID, Topic string
	key                  *ecdsa.PrivateKey
	client               *http.Client

	mu     sync.Mutex
	jwt    string
	issued time.Time
	// refused: Apple refused the last token as expired (jwt is then "");
	// renewed: jwt was made after such a refusal.
	refused, renewed bool
}

// NewAPNs returns an APNs provider signing with the .p8 key (PEM).
func NewAPNs(s Settings, teamID, keyID, topic, p8 string) (*APNs, error) {
	key, err := jwt.ParseECPrivateKeyFromPEM([]byte(p8))
	if err != nil {
		return nil, fmt.Errorf("apns %s: key: not a PEM EC private key (.p8)", s.Name) // never the key itself
	}
	return &APNs{Settings: s, TeamID: teamID, KeyID: keyID, Topic: topic, key: key,
		client: s.httpClient()}, nil
}

// Scopes returns the device.
func (p *APNs) Scopes(m Message) []string { return []string{DeviceScope(m.Recipient)} }

// token returns the provider token, made anew when older than
// apnsTokenLife or when Apple refused the last one (see expired).
func (p *APNs) token() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jwt != "" && time.Since(p.issued) < apnsTokenLife {
		return p.jwt, nil
	}
	now := time.Now()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": p.TeamID, "iat": now.Unix()})
	tok.Header["kid"] = p.KeyID
	signed, err := tok.SignedString(p.key)
	if err != nil {
		return "", err
	}
	p.jwt, p.issued = signed, now
	p.renewed, p.refused = p.refused, false
	return signed, nil
}

// expired notes that Apple refused tok as expired: the next send makes a
// new token, unless tok was itself made after such a refusal; then it
// reports true, since a new one would not help (the clock or the key is
// wrong). A token older than the one in use was replaced already.
func (p *APNs) expired(tok string) (again bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case tok != p.jwt:
		return false
	case p.renewed:
		return true
	}
	p.jwt, p.refused = "", true
	return false
}

// apnsPayload maps title and body to aps.alert, data's fields beside aps.
func apnsPayload(c Content) ([]byte, error) {
	payload := map[string]any{}
	for k, v := range c.Data {
		payload[k] = v
	}
	payload["aps"] = map[string]any{"alert": map[string]string{"title": cmp.Or(c.Title, c.Subject), "body": c.Body}}
	return json.Marshal(payload)
}

// Send posts m and classifies the answer; the ID of a message sent is its
// apns-id. A token refused as expired is made anew for the next send, and m
// is retried at once, admitted again by the provider's bucket.
func (p *APNs) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := content("apns "+p.Name, m)
	if err != nil {
		return "", err
	}
	if c.Title == "" && c.Subject == "" && c.Body == "" {
		return "", reject("apns %s: data has no title or body: nothing to show", p.Name)
	}
	body, err := apnsPayload(c)
	if err != nil {
		return "", reject("apns %s: %v", p.Name, err)
	}
	tok, err := p.token()
	if err != nil {
		return "", broken("apns %s: signing the provider token: %v", p.Name, err)
	}
	u := p.base("https://api.push.apple.com") + "/3/device/" + url.PathEscape(m.Recipient)
	status, h, resp, err := post(ctx, p.client, "apns "+p.Name, u, bytes.NewReader(body),
		"authorization", "bearer "+tok, "apns-topic", p.Topic, "apns-push-type", "alert")
	if err != nil {
		return "", err
	}
	var answer struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(resp, &answer)
	switch reason := answer.Reason; {
	case status == http.StatusOK:
		return h.Get("apns-id"), nil
	case status == http.StatusForbidden && reason == "ExpiredProviderToken" && !p.expired(tok):
		// No wait but the bucket's: a deferral, not a failure.
		return "", retryAt(time.Millisecond, time.Time{}, "apns %s: %d %s: retried with a new provider token", p.Name, status, reason)
	}
	return "", p.classify(status, answer.Reason, h, m.Recipient)
}

// classify maps APNs' error status and reason to an outcome.
func (p *APNs) classify(status int, reason string, h http.Header, device string) error {
	what := fmt.Sprintf("apns %s: %d %s", p.Name, status, reason)
	switch {
	case status == http.StatusGone || reason == "Unregistered" || reason == "BadDeviceToken" || reason == "DeviceTokenNotForTopic":
		return dead("%s", what)
	case status == http.StatusTooManyRequests && reason == "TooManyProviderTokenUpdates": // the whole provider
		after, at := retryAfter(h.Get("Retry-After"), p.scopePause())
		return pause(after, at, "", "%s", what)
	case status == http.StatusTooManyRequests: // TooManyRequests: this device, not the fleet
		after, at := retryAfter(h.Get("Retry-After"), p.scopePause())
		return pause(after, at, DeviceScope(device), "%s", what)
	case status == http.StatusForbidden: // InvalidProviderToken, MissingProviderToken, ExpiredProviderToken for a new token
		return broken("%s", what)
	case status >= 500:
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what) // PayloadTooLarge, BadTopic, BadPriority...
}
