package api

import (
	"errors"
	"net/http"

	"github.com/notify-throttle/throttler/feedback"
)

// emptyTwiML answers a reply to a Twilio number: nothing to send back
// (Twilio answers a stop word itself).
const emptyTwiML = `<?xml version="1.0" encoding="UTF-8"?><Response/>`

// receive serves POST /v1/feedback/{provider} (and, inbound, the replies
// to a Twilio number at .../inbound): the provider's request goes to
// package feedback, which verifies its signature and applies its
// reports; the answer says what they did (200), or why it was refused:
// 404 no such provider, 400 malformed, 403 unsigned or forged, 409
// replayed, 503 Redis (the vendor retries, and nothing was applied).
func (s *Server) receive(inbound bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ *client) logged {
		body, err := readBody(w, r, MaxFeedbackBody)
		if err != nil {
			writeError(w, err)
			return logged{}
		}
		res, err := s.feedback.Receive(r.Context(), feedback.Request{Provider: r.PathValue("provider"), Inbound: inbound,
			URI: r.URL.RequestURI(), Header: r.Header, Body: body})
		if err != nil {
			writeError(w, refusal(err))
			return logged{}
		}
		if inbound {
			w.Header().Set("Content-Type", "text/xml")
			_, _ = w.Write([]byte(emptyTwiML))
		} else {
			writeJSON(w, http.StatusOK, res)
		}
		return logged{count: res.Applied}
	}
}

// refusal is the API's error of feedback's.
func refusal(err error) *Error {
	e := &Error{Message: err.Error()}
	switch {
	case errors.Is(err, feedback.ErrNoProvider):
		e.Status, e.Code = http.StatusNotFound, CodeNotFound
	case errors.Is(err, feedback.ErrMalformed):
		e.Status, e.Code = http.StatusBadRequest, CodeInvalid
	case errors.Is(err, feedback.ErrSignature):
		e.Status, e.Code = http.StatusForbidden, CodeBadSignature
	case errors.Is(err, feedback.ErrReplayed):
		e.Status, e.Code = http.StatusConflict, CodeReplayed
	default:
		return unavailable(err)
	}
	return e
}
