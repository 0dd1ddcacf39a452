package feedback

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/notify-throttle/throttler/lifecycle"
)

// TwilioSignatureHeader carries Twilio's signature of a request.
const TwilioSignatureHeader = "X-Twilio-Signature"

// MessageParam is the query parameter of a message's status callback URL
// that carries our message's ID (see TwilioCallback).
const MessageParam = "m"

// TwilioCallback returns the function that makes the status callback URL
// of each message of a twilio provider, given the API's root as Twilio
// reaches it (its feedback's public_url): providers.Twilio asks Twilio to
// POST the message's statuses there, and status reads its ID back.
func TwilioCallback(publicURL, provider string) func(id string) string {
	base := strings.TrimRight(publicURL, "/") + Path + url.PathEscape(provider) + "?" + MessageParam + "="
	return func(id string) string { return base + url.QueryEscape(id) }
}

// stopWords are the replies by which a recipient opts out of a Twilio
// sender's messages (Twilio's own opt-out keywords), compared trimmed and
// case-insensitively.
var stopWords = []string{"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"}

// deadCodes are the error codes of an undelivered or failed message whose
// number is dead for good: not a valid number (21211), unsubscribed by
// STOP (21610), not mobile (21614), a landline (21635), unknown to its
// carrier (30005), a landline or an unreachable carrier (30006). Any
// other (30003 unreachable: a phone off; 30007 filtered; 30008 unknown)
// is a soft bounce.
var deadCodes = []int{21211, 21610, 21614, 21635, 30005, 30006}

// twilioEndpoint reads a Twilio provider's status callbacks (at
// /v1/feedback/<provider>, with the message's ID in the query) and the
// replies to its numbers (at .../inbound): form posts, signed with
// X-Twilio-Signature, the base64 HMAC-SHA1, keyed with the account's auth
// token, of the URL Twilio called followed by each POST parameter's name
// and value, sorted by name. Twilio signs no time: a replay is found by
// its reports' marks alone (apply.go).
type twilioEndpoint struct {
	provider  string
	token     string
	publicURL string // the API's root as Twilio calls it, without a trailing slash
}

// read verifies a Twilio request and reads its status or its reply.
func (e *twilioEndpoint) read(_ context.Context, req Request) (reading, error) {
	if mt, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		return reading{}, fmt.Errorf("%w: Twilio posts a form (application/x-www-form-urlencoded), not %q", ErrMalformed, req.Header.Get("Content-Type"))
	}
	form, err := url.ParseQuery(string(req.Body))
	if err != nil {
		return reading{}, fmt.Errorf("%w: not a form: %v", ErrMalformed, err)
	}
	sig, err := base64.StdEncoding.DecodeString(req.Header.Get(TwilioSignatureHeader))
	if err != nil || len(sig) == 0 {
		return reading{}, fmt.Errorf("%w: unsigned: no base64 %s header", ErrSignature, TwilioSignatureHeader)
	}
	if !hmac.Equal(sig, TwilioSignature(e.token, e.publicURL+req.URI, form)) {
		return reading{}, fmt.Errorf("%w: the signature does not verify with the auth token over %s (providers.%s.feedback.public_url is the URL Twilio calls?)",
			ErrSignature, e.publicURL+req.URI, e.provider)
	}
	if req.Inbound {
		return e.reply(form)
	}
	return e.status(req.URI, form)
}

// TwilioSignature returns Twilio's signature of a POST of form to url with
// token: what X-Twilio-Signature carries, decoded.
func TwilioSignature(token, url string, form url.Values) []byte {
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(url))
	for _, name := range slices.Sorted(maps.Keys(form)) {
		for _, v := range slices.Sorted(slices.Values(form[name])) {
			mac.Write([]byte(name))
			mac.Write([]byte(v))
		}
	}
	return mac.Sum(nil)
}

// status reads a message's status callback: delivered, or undelivered
// and failed (bounced, hard for deadCodes); the other statuses (queued,
// sent, read, ...) are ignored.
func (e *twilioEndpoint) status(uri string, form url.Values) (reading, error) {
	sid, status := form.Get("MessageSid"), form.Get("MessageStatus")
	if sid == "" || status == "" {
		return reading{}, fmt.Errorf("%w: a status callback without MessageSid and MessageStatus", ErrMalformed)
	}
	var message string
	if u, err := url.Parse(uri); err == nil {
		message = u.Query().Get(MessageParam)
	}
	r := Report{Message: message, ProviderMessageID: sid, Address: form.Get("To")}
	switch status {
	case "delivered":
		r.Type = lifecycle.Delivered
	case "undelivered", "failed":
		code, _ := strconv.Atoi(form.Get("ErrorCode"))
		r.Type, r.Reason, r.Detail = lifecycle.Bounced, lifecycle.BouncedSoft, status
		if code != 0 {
			r.Detail = fmt.Sprintf("%s: error %d", status, code)
		}
		if slices.Contains(deadCodes, code) {
			r.Reason = lifecycle.BouncedHard
		}
	default:
		return reading{ignored: 1}, nil
	}
	return reading{reports: []Report{r}}, nil
}

// reply reads a reply to the provider's number: a stop word suppresses
// its sender; anything else is none of ours.
func (e *twilioEndpoint) reply(form url.Values) (reading, error) {
	sid, from := form.Get("MessageSid"), form.Get("From")
	if sid == "" || from == "" {
		return reading{}, fmt.Errorf("%w: a reply without MessageSid and From", ErrMalformed)
	}
	word := strings.ToUpper(strings.TrimSpace(form.Get("Body")))
	if !slices.Contains(stopWords, word) {
		return reading{ignored: 1}, nil
	}
	return reading{reports: []Report{{Type: lifecycle.Unsubscribed, Address: from, Vendor: sid, Detail: "replied " + word}}}, nil
}
