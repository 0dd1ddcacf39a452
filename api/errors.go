package api

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/intake"
)

// Error codes: what a client branches on (the message is for people).
const (
	CodeUnauthorized     = "unauthorized"           // 401: no API key, or an unknown one
	CodeForbidden        = "forbidden"              // 403: the key may not use this policy, provider or tenant
	CodeInvalid          = "invalid"                // 400: the body is not a notification the config accepts
	CodeTooLarge         = "too_large"              // 413: the body is over the route's limit, or its task over message.MaxPayloadLen
	CodeNotFound         = "not_found"              // 404
	CodeConflict         = "idempotency_conflict"   // 409: the key was used with another body
	CodeAlreadySent      = "already_sent"           // 409: too late to cancel
	CodeNotPending       = "not_cancelable"         // 409: being sent now, or already archived
	CodeRateLimited      = "rate_limited"           // 429: the key's rate limit; see Retry-After
	CodeUnavailable      = "unavailable"            // 503: Redis did not answer (in time); see Retry-After
	CodeMethodNotAllowed = "method_not_allowed"     // 405: a method the path does not have
	CodeUnsupportedMedia = "unsupported_media_type" // 415: a body not application/json
	CodeBadSignature     = "bad_signature"          // 403: feedback unsigned, forged, stale or from an unknown topic
	CodeReplayed         = "replayed"               // 409: feedback applied before
)

// Error is an API error: the response's status and its JSON body
// {"error": {"code", "message", "field"}}.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field is a JSON pointer (RFC 6901) to the part of the body at fault
	// ("/notifications/3/data"), or the header or query parameter; "" for
	// the request as a whole.
	Field      string        `json:"field,omitempty"`
	RetryAfter time.Duration `json:"-"` // with a 429 or a 503: when to try again
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// errorBody is an error's response body.
type errorBody struct {
	Error *Error `json:"error"`
}

// asError returns err if it is an *Error, else the 503 of a Redis failure.
func asError(err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		e = unavailable(err)
	}
	return e
}

// writeError writes err (an *Error, else a 503).
func writeError(w http.ResponseWriter, err error) {
	e := asError(err)
	if e.RetryAfter > 0 {
		secs := (e.RetryAfter + time.Second - 1) / time.Second
		w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	writeJSON(w, e.Status, errorBody{e})
}

// unavailable is the error of a request Redis did not answer; the cause
// is not shown (it may name hosts).
func unavailable(error) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, RetryAfter: time.Second, Message: "the queue did not answer: try again"}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// invalid turns an intake error about a notification at pointer base ("" or
// "/notifications/3") into a 400 pointing at its field, or the 413 of one
// whose task would be too large.
func invalid(err error, base string) *Error {
	e := &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Message: err.Error(), Field: base}
	var ie *intake.Error
	if errors.As(err, &ie) && ie.Field != "" {
		e.Field = base + "/" + pointerToken(ie.Field)
	}
	if ie != nil && ie.TooLarge {
		e.Status, e.Code = http.StatusRequestEntityTooLarge, CodeTooLarge
	}
	return e
}

// requireJSON returns the 415 of a request whose body is not declared
// application/json (a charset parameter is fine), else nil.
func requireJSON(r *http.Request) *Error {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	got := intake.Quote(ct)
	if ct == "" {
		got = "none"
	}
	return &Error{Status: http.StatusUnsupportedMediaType, Code: CodeUnsupportedMedia, Field: "Content-Type",
		Message: "the body must be sent as Content-Type: application/json (got " + got + ")"}
}

// pointerToken escapes a member name for a JSON pointer (RFC 6901).
func pointerToken(name string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}
