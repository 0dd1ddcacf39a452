// Package address checks that a recipient is an address its provider's
// channel can deliver to, before it is enqueued (package intake) and before
// a worker sends it (providers.Addresser): what each type takes and why is
// in docs/operations.md#the-http-api, "What a notification must be".
package address

import (
	"errors"
	"net/mail"
	"strings"

	"github.com/notify-throttle/throttler/config"
)

// Errors, one per shape: the message says what the channel needs.
var (
	ErrE164        = errors.New("not an E.164 number (+ and 8 to 15 digits)")
	ErrEmail       = errors.New("not an email address (local@domain, without a display name)")
	ErrFCMToken    = errors.New("not an FCM registration token (up to 4096 letters, digits, '-', '_', ':' or '.')")
	ErrDeviceToken = errors.New("not an APNs device token (64 to 200 hex digits, an even count)")
)

// Check reports what is wrong with recipient as an address of a provider
// of type kind (config.Provider.Type), as one of the package's errors; nil
// for a good one, and for the types that take any recipient.
func Check(kind, recipient string) error {
	switch kind {
	case config.ProviderTwilio:
		return e164(recipient)
	case config.ProviderSMTP, config.ProviderSES, config.ProviderSendGrid:
		return email(recipient)
	case config.ProviderFCM:
		return fcmToken(recipient)
	case config.ProviderAPNs:
		return deviceToken(recipient)
	}
	return nil
}

// Any reports whether a provider of type kind takes any recipient (log,
// webhook): Check never refuses one. Every other type refuses "".
func Any(kind string) bool { return Check(kind, "") == nil }

// e164 accepts "+" and 8 to 15 digits, the first not 0: ITU-T E.164 caps
// a number at 15 digits with its country code, and none is shorter than 8.
func e164(s string) error {
	digits, ok := strings.CutPrefix(s, "+")
	if !ok || len(digits) < 8 || len(digits) > 15 || digits[0] == '0' || !all(digits, isDigit) {
		return ErrE164
	}
	return nil
}

// email accepts an RFC 5322 addr-spec as net/mail reads it, and nothing
// around it: a display name ("Alice <a@example.com>") or spaces would be
// a second spelling of one recipient in its quota.
func email(s string) error {
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return ErrEmail
	}
	if local, domain, ok := strings.Cut(s, "@"); !ok || local == "" || domain == "" || strings.HasPrefix(domain, "[") {
		return ErrEmail
	}
	return nil
}

// fcmToken accepts the alphabet FCM registration tokens are made of:
// Google documents no format or length, so only what no token can be is
// refused.
func fcmToken(s string) error {
	if s == "" || len(s) > 4096 || !all(s, func(r rune) bool {
		return isDigit(r) || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || strings.ContainsRune("-_:.", r)
	}) {
		return ErrFCMToken
	}
	return nil
}

// deviceToken accepts an APNs device token in hex: 64 digits today, longer
// ones (up to 100 bytes) too, as Apple says tokens vary in length.
func deviceToken(s string) error {
	if len(s) < 64 || len(s) > 200 || len(s)%2 != 0 || !all(s, func(r rune) bool {
		return isDigit(r) || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F'
	}) {
		return ErrDeviceToken
	}
	return nil
}

func isDigit(r rune) bool { return r >= '0' && r <= '9' }

// all reports whether every rune of s passes f.
func all(s string, f func(rune) bool) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return !f(r) })
}
