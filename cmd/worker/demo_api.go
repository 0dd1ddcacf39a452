package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/api"
	"github.com/notify-throttle/throttler/config"
)

// The demo's API key: a throwaway, valid only in the demo's process, on a
// loopback port, so printing it shows nothing worth hiding.
const (
	demoAPIKey       = "demo-key-only-for-make-demo"
	demoAPIRecipient = "erin@example.com"
)

// demoAPI has the demo serve the HTTP API, on a free loopback port unless
// the config names an address, with a key of its own.
func demoAPI(cfg *config.Config) {
	if cfg.API.Addr == "" {
		cfg.API.Addr = "127.0.0.1:0"
	}
	keys := map[string]config.APIKey{}
	maps.Copy(keys, cfg.API.Keys)
	keys["demo"] = config.APIKey{Key: demoAPIKey, Rate: config.DefaultAPIRate, Burst: config.DefaultAPIBurst}
	cfg.API.Keys = keys
}

// demoLead is how far ahead, within its run, the demo schedules the API's message.
func demoLead(run time.Duration) time.Duration { return min(5*time.Second, run/4) }

// demoCurl enqueues one notification through the API at base, scheduled
// lead from now (send_at), printing the curl command that does the same
// and what the API answered, and returns its ID.
func demoCurl(ctx context.Context, base string, lead time.Duration, start time.Time, out io.Writer) (string, error) {
	at := time.Now().Add(lead).UTC().Truncate(time.Second).Add(time.Second)
	body := fmt.Sprintf(`{"recipient":%q,"template":"welcome","policy":%q,"provider":%q,"send_at":%q,"data":{"n":1}}`,
		demoAPIRecipient, demoPolicy, demoProvider, at.Format(time.RFC3339))
	fmt.Fprintf(out, "One more through the HTTP API, scheduled a few seconds ahead (send_at), as this curl command does:\n"+
		"  curl -X POST %s/v1/notifications -H 'Authorization: Bearer %s' \\\n"+
		"       -H 'Idempotency-Key: demo-erin-welcome' -H 'Content-Type: application/json' -d '%s'\n",
		base, demoAPIKey, body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/notifications", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+demoAPIKey)
	req.Header.Set(api.IdempotencyHeader, "demo-erin-welcome")
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("demo: the API: %w", err)
	}
	defer res.Body.Close()
	var v api.View
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		return "", fmt.Errorf("demo: the API's answer: %w", err)
	}
	state := v.State
	if v.Until != nil {
		state += fmt.Sprintf(" until %.2fs: it waits in asynq's schedule at no cost to the throttle, then every rule applies", v.Until.Sub(start).Seconds())
	}
	fmt.Fprintf(out, "  -> %s: id %s, %s\n     (GET %s/v1/notifications/%s tells where it stands)\n\n", res.Status, v.ID, state, base, v.ID)
	return v.ID, nil
}
