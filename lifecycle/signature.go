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

// A callback is signed as Stripe signs its webhooks: one header,
//
//	Throttler-Signature: t=1718000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd
//
// t the Unix time it was signed at, v1 the hex HMAC-SHA256 of "<t>.<body>"
// keyed with the tenant's secret. The receiver computes the same HMAC over
// the body as it arrived (before parsing it) and compares in constant
// time; t within a tolerance of its clock makes a recorded request useless
// to replay later. Each retry is signed anew.

// Headers of a callback.
const (
	SignatureHeader = "Throttler-Signature"
	// EventIDHeader repeats the event's ID, to deduplicate on before
	// parsing the body.
	EventIDHeader = "Throttler-Event-Id"
)

// DefaultTolerance is how far a signature's time may be from the
// receiver's clock by default: Stripe's five minutes.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify.
var (
	// ErrNoSignature: the header is missing or not "t=...,v1=...".
	ErrNoSignature = errors.New("lifecycle: no signature: want " + SignatureHeader + ": t=<unix>,v1=<hex>")
	// ErrBadSignature: no v1 of the header is the body's HMAC with the
	// secret (another secret, or the body or t was changed).
	ErrBadSignature = errors.New("lifecycle: the signature does not match the body")
	// ErrStale: t is further from now than the tolerance (a replay, or a
	// clock far off).
	ErrStale = errors.New("lifecycle: the signature's time is outside the tolerance")
)

// Sign returns the signature header's value of body, signed at t with
// secret.
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

// Verify reports whether header (the Throttler-Signature header's value)
// signs body with secret at a time within tolerance of now (0:
// DefaultTolerance): nil if it does, else ErrNoSignature, ErrBadSignature
// or ErrStale, wrapped. body must be the request's body as received.
// Several v1 values may be given (a sender with two secrets, while one
// replaces the other): one match is enough.
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
