package providers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/notify-throttle/throttler/jobs"
)

// apnsFake is a loopback TLS HTTP/2 server of APNs' API that verifies the
// provider token with the key's public half.
type apnsFake struct {
	*httptest.Server
	mu      sync.Mutex
	expired map[string]bool // provider tokens to refuse as ExpiredProviderToken
	seen    []string        // the provider tokens it got
}

func newAPNsFake(t *testing.T, pub *ecdsa.PublicKey) *apnsFake {
	t.Helper()
	f := &apnsFake{expired: map[string]bool{}}
	answers := map[string]struct {
		status int
		reason string
	}{
		"dev-gone":    {410, "Unregistered"},
		"dev-bad":     {400, "BadDeviceToken"},
		"dev-large":   {413, "PayloadTooLarge"},
		"dev-many":    {429, "TooManyRequests"},
		"dev-invalid": {403, "InvalidProviderToken"},
		"dev-down":    {503, "ServiceUnavailable"},
	}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("APNs request over %s, want HTTP/2", r.Proto)
		}
		device, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
		if r.Method != http.MethodPost || !ok || r.Header.Get("apns-topic") != "com.example.app" || r.Header.Get("apns-push-type") != "alert" {
			t.Errorf("request %s %s topic %q", r.Method, r.URL.Path, r.Header.Get("apns-topic"))
		}
		bearer, _ := strings.CutPrefix(r.Header.Get("authorization"), "bearer ")
		tok, err := jwt.Parse(bearer, func(tk *jwt.Token) (any, error) { return pub, nil }, jwt.WithValidMethods([]string{"ES256"}))
		if err != nil || tok.Header["kid"] != "KEY123" || tok.Claims.(jwt.MapClaims)["iss"] != "TEAM123" {
			t.Errorf("provider token: %v %v", tok, err)
		}
		var payload struct {
			Aps struct {
				Alert struct{ Title, Body string } `json:"alert"`
			} `json:"aps"`
			Order string `json:"order"`
		}
		if err := json.NewDecoder(r.Body).Decode(&payload); err != nil || payload.Aps.Alert.Title != "Hi" || payload.Aps.Alert.Body != "Your order shipped" || payload.Order != "42" {
			t.Errorf("payload %+v, %v", payload, err)
		}
		f.mu.Lock()
		f.seen = append(f.seen, bearer)
		expired := f.expired[bearer]
		f.mu.Unlock()
		a, found := answers[device]
		if expired {
			a, found = struct {
				status int
				reason string
			}{403, "ExpiredProviderToken"}, true
		}
		if !found {
			w.Header().Set("apns-id", "0A1B2C3D-0000-0000-0000-000000000000")
			return
		}
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(`{"reason":"` + a.reason + `"}`))
	}))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

func TestAPNsClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	p8 := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	f := newAPNsFake(t, &key.PublicKey)
	p, err := NewAPNs(Settings{Name: "ios", BaseURL: f.URL, Transport: f.Client().Transport, ScopePause: 20 * time.Second}, "TEAM123", "KEY123", "com.example.app", p8)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"title":"Hi","body":"Your order shipped","data":{"order":"42"}}`)
	cases := map[string]want{
		"dev-ok":      {sent: true, id: "0A1B2C3D-0000-0000-0000-000000000000"},
		"dev-gone":    {outcome: jobs.Dead, text: "410 Unregistered"},
		"dev-bad":     {outcome: jobs.Dead},
		"dev-large":   {outcome: jobs.Reject, text: "PayloadTooLarge"},
		"dev-many":    {outcome: jobs.Pause, scope: jobs.DeviceScope("dev-many"), after: 20 * time.Second},
		"dev-invalid": {outcome: jobs.Broken},
		"dev-down":    {retry: true},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), jobs.Message{ID: "t1", Recipient: to, Data: data})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	// A request that gets no answer fails with its URL, whose path is the
	// device token.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	unreachable, _ := NewAPNs(Settings{Name: "ios", BaseURL: gone.URL}, "TEAM123", "KEY123", "com.example.app", p8)
	device := "0123456789abcdef0123456789abcdef"
	id, err := unreachable.Send(ctx(t), jobs.Message{ID: "t1", Recipient: device, Data: data})
	checkOutcome(t, "no answer", id, err, want{retry: true, text: "/3/device/01***ef"})
	noRecipient(t, err, device)

	// An expired provider token is made anew and the send tried again.
	f.mu.Lock()
	first := f.seen[0]
	f.expired[first] = true
	f.mu.Unlock()
	// The token is young: only the refusal makes a new one (ECDSA
	// signatures differ even within one second's iat).
	if _, err := p.Send(ctx(t), jobs.Message{ID: "t2", Recipient: "dev-ok", Data: data}); err != nil {
		t.Fatalf("after ExpiredProviderToken: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.seen); n < 2 || f.seen[n-1] == first || f.seen[n-2] != first {
		t.Errorf("the refused token was not replaced: %d requests", n)
	}
	if _, err := NewAPNs(Settings{Name: "ios"}, "T", "K", "topic", "SECRET-KEY-TEXT"); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("a broken key: %v", err)
	}
}
