package providers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
)

// fcmScope is the OAuth2 scope FCM HTTP v1 sends with.
const fcmScope = "https://www.googleapis.com/auth/firebase.messaging"

// FCM sends push notifications through Firebase Cloud Messaging HTTP v1,
// with an OAuth2 bearer token: docs/providers.md#each-services-answers.
type FCM struct {
	Settings
	Project string
	tokens  oauth2.TokenSource
	client  *http.Client
}

// NewFCM returns an FCM provider that authenticates with a service
// account's JSON key (tokenURL, if set, replaces its token endpoint: tests)
// or, if credentials is empty, with the static bearer token.
func NewFCM(ctx context.Context, s Settings, project, credentials, tokenURL, token string) (*FCM, error) {
	p := &FCM{Settings: s, Project: project, client: s.httpClient()}
	if credentials == "" {
		p.tokens = oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, TokenType: "Bearer"})
		return p, nil
	}
	cfg, err := google.JWTConfigFromJSON([]byte(credentials), fcmScope)
	if err != nil {
		return nil, fmt.Errorf("fcm %s: credentials: not a service account key", s.Name) // never the key itself
	}
	if tokenURL != "" {
		cfg.TokenURL = tokenURL
	}
	tctx := context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, s.httpClient())
	p.tokens = oauth2.ReuseTokenSource(nil, cfg.TokenSource(tctx))
	return p, nil
}

// Scopes returns the device.
func (p *FCM) Scopes(m Message) []string { return []string{DeviceScope(m.Recipient)} }

type fcmMessage struct {
	Message struct {
		Token        string            `json:"token"`
		Notification *fcmNotification  `json:"notification,omitempty"`
		Data         map[string]string `json:"data,omitempty"`
	} `json:"message"`
}

type fcmNotification struct {
	Title string `json:"title,omitempty"`
	Body  string `json:"body,omitempty"`
}

// fcmError is Google's error body with the details FCM sends.
type fcmError struct {
	Error struct {
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type       string `json:"@type"`
			ErrorCode  string `json:"errorCode"`
			Violations []struct {
				Subject     string `json:"subject"`
				Description string `json:"description"`
			} `json:"violations"`
		} `json:"details"`
	} `json:"error"`
}

// code is the FcmError errorCode, else the status.
func (e fcmError) code() string {
	for _, d := range e.Error.Details {
		if strings.HasSuffix(d.Type, "google.firebase.fcm.v1.FcmError") && d.ErrorCode != "" {
			return d.ErrorCode
		}
	}
	return e.Error.Status
}

// perDevice reports whether a QuotaFailure detail names the device's quota.
func (e fcmError) perDevice() bool {
	for _, d := range e.Error.Details {
		if !strings.HasSuffix(d.Type, "google.rpc.QuotaFailure") {
			continue
		}
		for _, v := range d.Violations {
			if strings.Contains(strings.ToLower(v.Subject+" "+v.Description), "device") {
				return true
			}
		}
	}
	return false
}

// Send posts m and classifies the answer; the ID of a message sent is its
// name (projects/{project}/messages/{id}).
func (p *FCM) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := content("fcm "+p.Name, m)
	if err != nil {
		return "", err
	}
	var msg fcmMessage
	msg.Message.Token, msg.Message.Data = m.Recipient, c.Data
	if title := cmp.Or(c.Title, c.Subject); title != "" || c.Body != "" {
		msg.Message.Notification = &fcmNotification{Title: title, Body: c.Body}
	}
	if msg.Message.Notification == nil && len(c.Data) == 0 {
		return "", reject("fcm %s: data has no title, body or data: nothing to push", p.Name)
	}
	tok, err := p.tokens.Token()
	if err != nil {
		return "", broken("fcm %s: cannot get an access token: %v", p.Name, err)
	}
	body, _ := json.Marshal(msg)
	u := p.base("https://fcm.googleapis.com") + "/v1/projects/" + url.PathEscape(p.Project) + "/messages:send"
	status, h, resp, err := post(ctx, p.client, "fcm "+p.Name, u, bytes.NewReader(body),
		"Authorization", "Bearer "+tok.AccessToken, "Content-Type", "application/json")
	if err != nil {
		return "", err
	}
	if status == http.StatusOK {
		var sent struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(resp, &sent)
		return sent.Name, nil
	}
	return "", p.classify(status, h, resp, m.Recipient)
}

// classify maps FCM's error answer to an outcome.
func (p *FCM) classify(status int, h http.Header, resp []byte, device string) error {
	var fe fcmError
	_ = json.Unmarshal(resp, &fe)
	what := fmt.Sprintf("fcm %s: %d %s: %s", p.Name, status, fe.code(), fe.Error.Message)
	after, at := retryAfter(h.Get("Retry-After"), time.Second)
	switch code := fe.code(); {
	case code == "UNREGISTERED" || status == http.StatusNotFound:
		return dead("%s", what)
	case code == "THIRD_PARTY_AUTH_ERROR" || code == "SENDER_ID_MISMATCH" || status == http.StatusUnauthorized || status == http.StatusForbidden:
		return broken("%s", what)
	case status == http.StatusTooManyRequests || code == "QUOTA_EXCEEDED" || code == "RESOURCE_EXHAUSTED":
		if fe.perDevice() {
			return pause(after, at, DeviceScope(device), "%s", what)
		}
		return pause(after, at, "", "%s", what)
	case status >= 500 && h.Get("Retry-After") != "":
		return retryAt(after, at, "%s", what)
	case status >= 500:
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what) // INVALID_ARGUMENT and any other 4xx
}
