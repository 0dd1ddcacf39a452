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

// MessageParam is the query parameter of a status callback URL that
// carries our message's ID.
const MessageParam = "m"

// TwilioCallback returns the function that makes each message's status
// callback URL (providers.Twilio.StatusCallback), given the API's root as
// Twilio reaches it (feedback.public_url).
func TwilioCallback(publicURL, provider string) func(id string) string {
	base := strings.TrimRight(publicURL, "/") + Path + url.PathEscape(provider) + "?" + MessageParam + "="
	return func(id string) string { return base + url.QueryEscape(id) }
}

// stopWords are Twilio's own opt-out keywords, compared trimmed and
// case-insensitively.
var stopWords = []string{"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"}

// deadCodes are the error codes of an undelivered message whose number is
// dead for good (docs/providers.md#what-the-services-report-later); any
// other is a soft bounce.
var deadCodes = []int{21211, 21610, 21614, 21635, 30005, 30006}

// twilioEndpoint reads a Twilio provider's status callbacks and the
// replies to its numbers (/inbound): form posts signed with
// X-Twilio-Signature (TwilioSignature). Twilio signs no time: a replay is
// found by its reports' marks alone.
type twilioEndpoint struct {
	provider  string
	token     string
	publicURL string // the API's root as Twilio calls it, without a trailing slash
}

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

// TwilioSignature returns what X-Twilio-Signature carries, decoded, for a
// POST of form to url: the HMAC-SHA1, keyed with the auth token, of the URL
// and each parameter's name and value, sorted by name.
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

// status reads a status callback: delivered, or undelivered and failed
// (bounced); the other statuses are ignored.
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

// reply reads a reply to the provider's number: a stop word suppresses its
// sender; anything else is none of ours.
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
