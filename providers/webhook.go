package providers

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Webhook POSTs each message as JSON {id, recipient, template, data}
// to a URL, with the task ID as its Idempotency-Key header.
type Webhook struct {
	Name    string
	URL     string
	Headers map[string]string
	Client  *http.Client // its Timeout bounds each send
}

// WebhookIdleConns is how many idle connections a webhook provider made by
// NewWebhook keeps open to its host: net/http's default, 2, would have a
// worker with more sends in flight dial anew for almost every send.
const WebhookIdleConns = 256

// NewWebhook returns a webhook provider with a per-send timeout, on a
// transport of its own (see WebhookIdleConns) trusting roots (nil: the system's CAs).
func NewWebhook(name, url string, timeout time.Duration, headers map[string]string, roots *x509.CertPool) *Webhook {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = WebhookIdleConns
	tr.MaxIdleConnsPerHost = WebhookIdleConns
	if roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
	return &Webhook{Name: name, URL: url, Headers: headers, Client: &http.Client{Timeout: timeout, Transport: tr}}
}

// Send posts m and classifies the answer (docs/providers.md#each-services-answers).
func (p *Webhook) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	body, err := json.Marshal(m)
	if err != nil {
		return "", reject("webhook %s: encode: %v", p.Name, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return "", reject("webhook %s: %v", p.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", m.ID)
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return "", Unreached(fmt.Errorf("webhook %s: %w", p.Name, err))
	}
	defer resp.Body.Close()
	start, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // reuse the connection
	snippet := bytes.TrimSpace(start[:min(len(start), 512)])
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return webhookID(resp.Header, start), nil
	case s == http.StatusTooManyRequests:
		after := webhookWait(resp.Header.Get("Retry-After"), time.Now())
		return "", pause(after, time.Time{}, "", "webhook %s: 429 Too Many Requests, retry after %s", p.Name, after)
	case s >= 500:
		return "", fmt.Errorf("webhook %s: %s: %s", p.Name, resp.Status, snippet)
	default:
		return "", reject("webhook %s: %s: %s", p.Name, resp.Status, snippet)
	}
}

// maxWebhookID bounds the ID a webhook's answer gives: a longer one is no
// ID, and stays out of the log.
const maxWebhookID = 256

// webhookID is the ID a webhook's 2xx answer gives for the message: its
// X-Message-Id or Id header, else the "id" (a string or a number) of a
// JSON object in the first 4 KiB of its body; "" if none.
func webhookID(h http.Header, body []byte) string {
	id := cmp.Or(h.Get("X-Message-Id"), h.Get("Id"))
	if id == "" {
		var v struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &v) == nil {
			var s string
			if json.Unmarshal(v.ID, &s) != nil {
				var n json.Number
				if json.Unmarshal(v.ID, &n) == nil {
					s = n.String()
				}
			}
			id = s
		}
	}
	if id = strings.TrimSpace(id); len(id) > maxWebhookID {
		return ""
	}
	return id
}

// webhookWait is the wait a 429's Retry-After asks for (see retryAfter):
// 1s when absent or unreadable, never less, nor more than a day.
func webhookWait(h string, now time.Time) time.Duration {
	d, at := retryAfter(h, time.Second)
	if !at.IsZero() {
		d = at.Sub(now)
	}
	return min(max(d, time.Second), 24*time.Hour)
}
