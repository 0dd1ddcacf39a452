package providers

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestRedactError(t *testing.T) {
	base := errors.New("root cause")
	for name, c := range map[string]struct {
		err       error
		recipient string
		want      string
	}{
		"a number named by the service": {errors.New("twilio sms: 400 error 21211: The 'To' number +15551234567 is not a valid phone number."),
			"+15551234567", "twilio sms: 400 error 21211: The 'To' number +1***67 is not a valid phone number."},
		"a number without its +": {errors.New("to 15551234567: unknown"), "+15551234567", "to +1***67: unknown"},
		"an address in capitals": {errors.New("ses mail: MessageRejected: identities failed the check: Alice@Example.COM"),
			"alice@example.com", "ses mail: MessageRejected: identities failed the check: a***@example.com"},
		"escaped in a URL's path": {fmt.Errorf("fcm push: %w", &url.Error{Op: "Post", URL: "https://fcm.example/v1/" + url.PathEscape("ab:c/d e"), Err: base}),
			"ab:c/d e", `fcm push: Post "https://fcm.example/v1/ab***` + ` e": root cause`},
		"none": {errors.New("apns ios: 503 ServiceUnavailable"), "dev-1234", "apns ios: 503 ServiceUnavailable"},
	} {
		if got := RedactError(c.err, c.recipient); got.Error() != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}

	// A SendError stays one, with its Err redacted (what settle logs and
	// keeps as a suppression's reason), wrapped or not; the chain stays.
	se := &SendError{Outcome: Dead, Err: fmt.Errorf("twilio sms: The 'To' number +15551234567 is invalid: %w", base)}
	for _, err := range []error{se, fmt.Errorf("wrapped: %w", se)} {
		got := RedactError(err, "+15551234567")
		var gse *SendError
		if !errors.As(got, &gse) || gse.Outcome != Dead || strings.Contains(got.Error(), "5551234") || strings.Contains(gse.Err.Error(), "5551234") {
			t.Errorf("%v: %v", err, got)
		}
		if !errors.Is(got, base) {
			t.Errorf("%v: the chain lost its cause", got)
		}
	}
	if RedactError(nil, "x") != nil {
		t.Error("nil became an error")
	}
}
