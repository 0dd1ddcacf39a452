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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// apnsFake is a loopback TLS HTTP/2 server of APNs' API that verifies the
// provider token with the public half of a key made for the test.
type apnsFake struct {
	*httptest.Server
	p8      string // the key (PEM)
	mu      sync.Mutex
	expired map[string]bool // provider tokens to refuse as ExpiredProviderToken
	seen    []string        // the provider tokens it got
}

// apnsKey returns a signing key made for a test (.p8: PEM) and its public
// half.
func apnsKey() (string, *ecdsa.PublicKey) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), &key.PublicKey
}

func newAPNsFake(t *testing.T) *apnsFake {
	t.Helper()
	p8, pub := apnsKey()
	f := &apnsFake{p8: p8, expired: map[string]bool{}}
	answers := map[string]struct {
		status int
		reason string
	}{
		"dev-gone":    {410, "Unregistered"},
		"dev-bad":     {400, "BadDeviceToken"},
		"dev-large":   {413, "PayloadTooLarge"},
		"dev-many":    {429, "TooManyRequests"},
		"dev-updates": {429, "TooManyProviderTokenUpdates"},
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

// provider returns an APNs provider with s, signing with the fake's key,
// that reaches the fake unless s names another base URL.
func (f *apnsFake) provider(t *testing.T, s Settings) *APNs {
	t.Helper()
	if s.BaseURL == "" {
		s.BaseURL, s.Transport = f.URL, f.Client().Transport
	}
	p, err := NewAPNs(s, "TEAM123", "KEY123", "com.example.app", f.p8)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAPNsClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	f := newAPNsFake(t)
	p := f.provider(t, Settings{Name: "ios", ScopePause: 20 * time.Second})
	data := []byte(`{"title":"Hi","body":"Your order shipped","data":{"order":"42"}}`)
	cases := map[string]want{
		"dev-ok":      {sent: true, id: "0A1B2C3D-0000-0000-0000-000000000000"},
		"dev-gone":    {outcome: Dead, text: "410 Unregistered"},
		"dev-bad":     {outcome: Dead},
		"dev-large":   {outcome: Reject, text: "PayloadTooLarge"},
		"dev-many":    {outcome: Pause, scope: DeviceScope("dev-many"), after: 20 * time.Second},
		"dev-updates": {outcome: Pause, after: 20 * time.Second},
		"dev-invalid": {outcome: Broken},
		"dev-down":    {retry: true},
	}
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Data: data})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	// A request that gets no answer fails with its URL, whose path is the
	// device token.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	unreachable := f.provider(t, Settings{Name: "ios", BaseURL: gone.URL})
	device := "0123456789abcdef0123456789abcdef"
	id, err := unreachable.Send(ctx(t), Message{ID: "t1", Recipient: device, Data: data})
	checkOutcome(t, "no answer", id, err, want{retry: true, text: "/3/device/01***ef"})
	noRecipient(t, err, device)

	if _, err := NewAPNs(Settings{Name: "ios"}, "T", "K", "topic", "SECRET-KEY-TEXT"); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("a broken key: %v", err)
	}
}

// TestAPNsExpiredTokenIsRetriedThroughTheBucket: a send whose provider
// token Apple refuses as expired makes one request, not two (a second one
// the provider's bucket never admitted): it returns a retry at once, and
// the retry, admitted again, goes with a new token. A new token refused
// too is broken: no newer one would help.
func TestAPNsExpiredTokenIsRetriedThroughTheBucket(t *testing.T) {
	t.Parallel()
	f := newAPNsFake(t)
	p := f.provider(t, Settings{Name: "ios"})
	data := []byte(`{"title":"Hi","body":"Your order shipped","data":{"order":"42"}}`)
	send := func() (string, error) { return p.Send(ctx(t), Message{ID: "t1", Recipient: "dev-ok", Data: data}) }
	// expireLast has the fake refuse the last token it got as expired, and
	// returns every token it got.
	expireLast := func() []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.expired[f.seen[len(f.seen)-1]] = true
		return slices.Clone(f.seen)
	}
	if _, err := send(); err != nil {
		t.Fatal(err)
	}
	first := expireLast()
	id, err := send()
	checkOutcome(t, "expired", id, err, want{outcome: Retry, after: time.Millisecond, text: "403 ExpiredProviderToken"})
	// The token is young: only the refusal makes a new one (ECDSA
	// signatures differ even within one second's iat).
	id, err = send()
	checkOutcome(t, "the retry", id, err, want{sent: true, id: "0A1B2C3D-0000-0000-0000-000000000000"})
	renewed := expireLast()
	if len(renewed) != 3 || renewed[1] != first[0] || renewed[2] == first[0] {
		t.Fatalf("provider tokens sent %d times, want 3: the first, refused, then a new one", len(renewed))
	}
	id, err = send()
	checkOutcome(t, "a new token expired", id, err, want{outcome: Broken, text: "403 ExpiredProviderToken"})
}
