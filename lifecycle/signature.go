package lifecycle

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A callback is signed as Stripe signs its webhooks ("t=<unix>,v1=<hex
// HMAC-SHA256 of t.body>"): docs/operations.md#events-and-status-callbacks.

// Headers of a callback. EventIDHeader repeats the event's ID, to
// deduplicate on before parsing the body.
const (
	SignatureHeader = "Throttler-Signature"
	EventIDHeader   = "Throttler-Event-Id"
)

// DefaultTolerance is Stripe's.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("lifecycle: no signature: want " + SignatureHeader + ": t=<unix>,v1=<hex>")
	ErrBadSignature = errors.New("lifecycle: the signature does not match the body")
	// ErrStale: t is further from now than the tolerance (a replay, or a
	// clock far off).
	ErrStale = errors.New("lifecycle: the signature's time is outside the tolerance")
)

// Sign returns the signature header's value of body, signed at t with secret.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify reports whether header (Throttler-Signature's value) signs body,
// as received, with secret at a time within tolerance of now (0:
// DefaultTolerance): nil, or ErrNoSignature, ErrBadSignature or ErrStale,
// wrapped. One of several v1 values (a secret being replaced) is enough.
func Verify(secret, header string, body []byte, tolerance time.Duration) error {
	return VerifyAt(secret, header, body, tolerance, time.Now())
}

// VerifyAt is Verify at the moment now.
func VerifyAt(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrNoSignature
	}
	want := mac(secret, ts, body)
	matched := false
	for _, sig := range sigs {
		matched = hmac.Equal(sig, want) || matched
	}
	if !matched {
		return ErrBadSignature
	}
	if off := now.Sub(time.Unix(unix, 0)); off > tolerance || off < -tolerance {
		return fmt.Errorf("%w: signed at %s, %s from now (tolerance %s)", ErrStale,
			time.Unix(unix, 0).UTC().Format(time.RFC3339), off.Round(time.Second), tolerance)
	}
	return nil
}
