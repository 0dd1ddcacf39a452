package api

import (
	"errors"
	"net/http"

	"github.com/notify-throttle/throttler/feedback"
)

// emptyTwiML answers a reply to a Twilio number: nothing to send back
// (Twilio answers a stop word itself).
const emptyTwiML = `<?xml version="1.0" encoding="UTF-8"?><Response/>`

// receive serves POST /v1/feedback/{provider}, or .../inbound for the
// replies to a Twilio number, through package feedback.
func receive(inbound bool) handlerFunc {
	return func(s *Server, w http.ResponseWriter, r *http.Request, _ *client) (logged, error) {
		body, err := readBody(w, r, MaxFeedbackBody)
		if err != nil {
			return logged{}, err
		}
		res, err := s.feedback.Receive(r.Context(), feedback.Request{Provider: r.PathValue("provider"), Inbound: inbound,
			URI: r.URL.RequestURI(), Header: r.Header, Body: body})
		if err != nil {
			return logged{}, refusal(err)
		}
		if inbound {
			w.Header().Set("Content-Type", "text/xml")
			_, _ = w.Write([]byte(emptyTwiML))
		} else {
			writeJSON(w, http.StatusOK, res)
		}
		return logged{count: res.Applied}, nil
	}
}

// refusal is the API's error of feedback's; any other is a 503, which the
// vendor retries (nothing was applied).
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
