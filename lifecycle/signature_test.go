package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestVerify: a signature made with the secret verifies within the
// tolerance; another secret, a changed body or timestamp, a time outside
// the tolerance or a malformed header do not, each with its error.
func TestVerify(t *testing.T) {
	const secret = "whsec-0123456789abcdef"
	body := []byte(`{"id":"7f3c","type":"sent","message":"m1","tenant":"billing","at":"2025-06-10T08:00:00Z"}`)
	signed := time.Unix(1_750_000_000, 0)
	header := Sign(secret, signed, body)
	other := Sign("whsec-another-secret-000", signed, body)
	for _, tt := range []struct {
		name   string
		secret string
		header string
		body   string
		now    time.Time
		want   error
	}{
		{"right secret, just signed", secret, header, string(body), signed, nil},
		{"right secret, 4m59s later", secret, header, string(body), signed.Add(4*time.Minute + 59*time.Second), nil},
		{"receiver's clock 4m behind", secret, header, string(body), signed.Add(-4 * time.Minute), nil},
		{"wrong secret", "whsec-wrong-000000000000", header, string(body), signed, ErrBadSignature},
		{"signed with another secret", secret, other, string(body), signed, ErrBadSignature},
		{"tampered body", secret, header, strings.Replace(string(body), "sent", "canceled", 1), signed, ErrBadSignature},
		{"tampered timestamp", secret, strings.Replace(header, "t=1750000000", "t=1750000300", 1), string(body), signed.Add(5 * time.Minute), ErrBadSignature},
		{"stale: 5m1s later", secret, header, string(body), signed.Add(5*time.Minute + time.Second), ErrStale},
		{"from the future", secret, header, string(body), signed.Add(-6 * time.Minute), ErrStale},
		{"one of two v1 matches (rotation)", secret, other + ",v1=" + strings.SplitN(header, "v1=", 2)[1], string(body), signed, nil},
		{"no header", secret, "", string(body), signed, ErrNoSignature},
		{"no v1", secret, "t=1750000000", string(body), signed, ErrNoSignature},
		{"no t", secret, "v1=" + strings.SplitN(header, "v1=", 2)[1], string(body), signed, ErrNoSignature},
		{"v1 not hex", secret, "t=1750000000,v1=zz", string(body), signed, ErrNoSignature},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyAt(tt.secret, tt.header, []byte(tt.body), 5*time.Minute, tt.now)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("VerifyAt = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestSignFormat: the header is t=<unix>,v1=<64 hex digits>, and Verify's
// default tolerance is five minutes.
func TestSignFormat(t *testing.T) {
	h := Sign("s", time.Unix(42, 0), []byte("{}"))
	if !strings.HasPrefix(h, "t=42,v1=") || len(h) != len("t=42,v1=")+64 {
		t.Errorf("Sign = %q, want t=42,v1=<64 hex digits>", h)
	}
	if err := VerifyAt("s", h, []byte("{}"), 0, time.Unix(42+299, 0)); err != nil {
		t.Errorf("within the default tolerance: %v", err)
	}
	if err := VerifyAt("s", h, []byte("{}"), 0, time.Unix(42+301, 0)); !errors.Is(err, ErrStale) {
		t.Errorf("past the default tolerance: %v, want ErrStale", err)
	}
}
