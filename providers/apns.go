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

	"github.com/notify-throttle/throttler/jobs"
)

// apnsTokenLife is how long a provider token (JWT) is used: Apple accepts
// one for an hour and refuses refreshes more often than every 20 minutes.
const apnsTokenLife = 50 * time.Minute

// APNs sends push notifications through Apple's HTTP/2 API: POST
// /3/device/{token} with "authorization: bearer <ES256 JWT>", apns-topic
// (the app's bundle ID) and {"aps": {"alert": {title, body}}, data...}.
type APNs struct {
	Settings
	TeamID, KeyID, Topic string
	key                  *ecdsa.PrivateKey
	client               *http.Client

	mu     sync.Mutex
	jwt    string
	issued time.Time
}

// NewAPNs returns an APNs provider signing with the .p8 key (PEM).
func NewAPNs(s Settings, teamID, keyID, topic, p8 string) (*APNs, error) {
	key, err := jwt.ParseECPrivateKeyFromPEM([]byte(p8))
	if err != nil {
		return nil, fmt.Errorf("apns %s: key: not a PEM EC private key (.p8)", s.Name) // never the key itself
	}
	return &APNs{Settings: s, TeamID: teamID, KeyID: keyID, Topic: topic, key: key,
		client: s.httpClient(http.DefaultTransport.(*http.Transport).Clone())}, nil
}

// Scopes returns the device.
func (p *APNs) Scopes(m jobs.Message) []string { return []string{jobs.DeviceScope(m.Recipient)} }

// token returns the provider token, made anew when older than
// apnsTokenLife or when stale is the one Apple just refused.
func (p *APNs) token(stale string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jwt != "" && p.jwt != stale && time.Since(p.issued) < apnsTokenLife {
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
	return signed, nil
}

// apnsPayload is the data mapped: title and body to aps.alert, data's
// fields beside aps.
func apnsPayload(c Content) ([]byte, error) {
	payload := map[string]any{}
	for k, v := range c.Data {
		payload[k] = v
	}
	payload["aps"] = map[string]any{"alert": map[string]string{"title": cmp.Or(c.Title, c.Subject), "body": c.Body}}
	return json.Marshal(payload)
}

// Send posts m and classifies the answer (docs/providers.md#apns). A
// refused provider token (ExpiredProviderToken) is made anew and the send
// tried once more.
func (p *APNs) Send(ctx context.Context, m jobs.Message) (id string, err error) {
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
	stale := ""
	for try := 0; ; try++ {
		tok, err := p.token(stale)
		if err != nil {
			return "", broken("apns %s: signing the provider token: %v", p.Name, err)
		}
		status, reason, h, err := p.post(ctx, m.Recipient, tok, body)
		if err != nil {
			return "", fmt.Errorf("apns %s: %w", p.Name, err)
		}
		if status == http.StatusForbidden && reason == "ExpiredProviderToken" && try == 0 {
			stale = tok
			continue
		}
		if status == http.StatusOK {
			return h.Get("apns-id"), nil
		}
		return "", p.classify(status, reason, h, m.Recipient)
	}
}

// post sends one request and returns the status and Apple's reason.
func (p *APNs) post(ctx context.Context, device, tok string, body []byte) (int, string, http.Header, error) {
	u := p.base("https://api.push.apple.com") + "/3/device/" + url.PathEscape(device)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("authorization", "bearer "+tok)
	req.Header.Set("apns-topic", p.Topic)
	req.Header.Set("apns-push-type", "alert")
	status, h, resp, err := do(p.client, req)
	if err != nil {
		return 0, "", nil, err
	}
	var r struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(resp, &r)
	return status, r.Reason, h, nil
}

// classify maps APNs' error status and reason to an outcome.
func (p *APNs) classify(status int, reason string, h http.Header, device string) error {
	what := fmt.Sprintf("apns %s: %d %s", p.Name, status, reason)
	switch {
	case status == http.StatusGone || reason == "Unregistered" || reason == "BadDeviceToken" || reason == "DeviceTokenNotForTopic":
		return dead("%s", what)
	case status == http.StatusTooManyRequests: // TooManyRequests: this device, not the fleet
		after, at := retryAfter(h.Get("Retry-After"), p.scopePause())
		return pause(after, at, jobs.DeviceScope(device), "%s", what)
	case status == http.StatusForbidden: // InvalidProviderToken, MissingProviderToken, ExpiredProviderToken twice
		return broken("%s", what)
	case status >= 500:
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what) // PayloadTooLarge, BadTopic, BadPriority...
}
