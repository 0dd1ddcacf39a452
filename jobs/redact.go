package jobs

import (
	"cmp"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Redact hides most of a recipient for logs and dashboards while keeping
// enough to tell recipients apart at a glance: an address keeps its first
// character and its domain (a***@example.com), anything else its first two
// and last two characters (+1***67); up to five characters are hidden
// whole.
func Redact(recipient string) string {
	if at := strings.LastIndexByte(recipient, '@'); at > 0 {
		first, _ := utf8.DecodeRuneInString(recipient)
		return string(first) + "***" + recipient[at:]
	}
	r := []rune(recipient)
	if len(r) <= 5 {
		return "***"
	}
	return string(r[:2]) + "***" + string(r[len(r)-2:])
}

// RedactError returns err with its text showing recipient only as Redact
// does, wherever it showed it: as given, in another case (an address),
// without its + (a number), or escaped for a URL (a device token in a
// request's path). A service's answer often names the recipient ("The
// 'To' number +1555... is not a valid phone number"), and a failed
// request's error its URL; every provider returns its errors through this,
// so that the log, a task's last error and a suppression's reason keep the
// redaction promise, and the rest of the text (the service's code, the
// status) stays. A *SendError stays one, its Err redacted; the original
// error stays in the chain for errors.Is and errors.As. nil stays nil.
func RedactError(err error, recipient string) error {
	if err == nil || recipient == "" {
		return err
	}
	var se *SendError
	if !errors.As(err, &se) {
		return redactText(err, recipient)
	}
	c := *se
	c.Err = redactText(se.Err, recipient)
	if error(se) == err {
		return &c
	}
	return &redactedError{text: redactIn(err.Error(), recipient), err: &c}
}

// redactedError is an error whose text is another's with the recipient
// redacted (see RedactError).
type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }

// redactText returns err, or a redactedError if its text shows recipient.
func redactText(err error, recipient string) error {
	text := redactIn(err.Error(), recipient)
	if text == err.Error() {
		return err
	}
	return &redactedError{text: text, err: err}
}

// redactIn replaces every form of recipient in text (see RedactError) with
// Redact(recipient).
func redactIn(text, recipient string) string {
	forms := []string{recipient, url.PathEscape(recipient), url.QueryEscape(recipient)}
	if digits, ok := strings.CutPrefix(recipient, "+"); ok && digits != "" {
		forms = append(forms, digits)
	}
	// The longest first, so that +1555... goes whole, not as + and 1555...
	slices.SortFunc(forms, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	quoted := make([]string, 0, len(forms))
	for _, f := range slices.Compact(forms) {
		quoted = append(quoted, regexp.QuoteMeta(f))
	}
	re := regexp.MustCompile(`(?i)` + strings.Join(quoted, "|"))
	return re.ReplaceAllLiteralString(text, Redact(recipient))
}
