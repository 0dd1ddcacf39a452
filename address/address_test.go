package address

import (
	"errors"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/config"
)

func TestCheck(t *testing.T) {
	token := strings.Repeat("0123456789abcdef", 4)
	fcm := "dQw4w9WgXcQ:APA91bH" + strings.Repeat("x-_Y", 30)
	cases := []struct {
		name, kind, recipient string
		want                  error
	}{
		{"an E.164 number", config.ProviderTwilio, "+14155550100", nil},
		{"the shortest E.164", config.ProviderTwilio, "+12345678", nil},
		{"the longest E.164", config.ProviderTwilio, "+123456789012345", nil},
		{"a number without +", config.ProviderTwilio, "5550100008", ErrE164},
		{"words for a number", config.ProviderTwilio, "not-a-number", ErrE164},
		{"spaces in a number", config.ProviderTwilio, "+1 415 555 0100", ErrE164},
		{"16 digits", config.ProviderTwilio, "+1234567890123456", ErrE164},
		{"a leading 0", config.ProviderTwilio, "+04155550100", ErrE164},
		{"an email to twilio", config.ProviderTwilio, "a@example.com", ErrE164},
		{"an email address", config.ProviderSMTP, "alice@example.com", nil},
		{"a plus address", config.ProviderSES, "alice+news@mail.example.co.uk", nil},
		{"no @", config.ProviderSendGrid, "alice.example.com", ErrEmail},
		{"no domain", config.ProviderSMTP, "alice@", ErrEmail},
		{"a display name", config.ProviderSMTP, "Alice <alice@example.com>", ErrEmail},
		{"a space before", config.ProviderSES, " alice@example.com", ErrEmail},
		{"two addresses", config.ProviderSendGrid, "a@example.com, b@example.com", ErrEmail},
		{"a number to smtp", config.ProviderSMTP, "+14155550100", ErrEmail},
		{"an FCM token", config.ProviderFCM, fcm, nil},
		{"an email to fcm", config.ProviderFCM, "a@example.com", ErrFCMToken},
		{"a number to fcm", config.ProviderFCM, "+14155550100", ErrFCMToken},
		{"a space in an FCM token", config.ProviderFCM, fcm[:40] + " " + fcm[41:], ErrFCMToken},
		{"a device token", config.ProviderAPNs, token, nil},
		{"an upper-case device token", config.ProviderAPNs, strings.ToUpper(token), nil},
		{"a longer device token", config.ProviderAPNs, token + token, nil},
		{"63 hex digits", config.ProviderAPNs, token[1:], ErrDeviceToken},
		{"not hex", config.ProviderAPNs, "g" + token[1:], ErrDeviceToken},
		{"anything to log", config.ProviderLog, "not-a-number", nil},
		{"anything to a webhook", config.ProviderWebhook, "user 42", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Check(c.kind, c.recipient); !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Errorf("Check(%s, %q) = %v, want %v", c.kind, c.recipient, err, c.want)
			}
			if Any(c.kind) && c.want != nil {
				t.Errorf("Any(%s) but %q is refused", c.kind, c.recipient)
			}
		})
	}
}
