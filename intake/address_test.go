package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/message"
)

// TestRecipientFitsTheProvider: a recipient its provider's channel cannot
// take is refused at intake, naming the field and what the channel needs,
// instead of being sent to the vendor as it is.
func TestRecipientFitsTheProvider(t *testing.T) {
	c := testChecker(t)
	c.Config.Providers["sms"] = config.Provider{Type: config.ProviderTwilio, Rate: 1, Burst: 1}
	c.Config.Providers["mail"] = config.Provider{Type: config.ProviderSES, Rate: 1, Burst: 1}
	cases := []struct {
		name      string
		entry     Entry
		wantError string
	}{
		{"a number without +", Entry{Recipient: "5550100008", Provider: "sms"},
			"recipient: not an E.164 number (+ and 8 to 15 digits), as provider sms (twilio) needs"},
		{"words for a number", Entry{Recipient: "not-a-number", Provider: "sms"},
			"recipient: not an E.164 number (+ and 8 to 15 digits), as provider sms (twilio) needs"},
		{"an E.164 number", Entry{Recipient: "+14155550100", Provider: "sms"}, ""},
		{"not an email address", Entry{Recipient: "alice", Provider: "mail"},
			"recipient: not an email address (local@domain, without a display name), as provider mail (ses) needs"},
		{"an email address", Entry{Recipient: "alice@example.com", Provider: "mail"}, ""},
		{"anything to a log provider", Entry{Recipient: "not-a-number"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.entry.Template = "t"
			_, err := c.Check(tc.entry, time.Now())
			if tc.wantError == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Field != "recipient" || err.Error() != tc.wantError {
				t.Errorf("%v, want %q", err, tc.wantError)
			}
		})
	}
}

// TestTooLargeNamesTheData: a notification whose task would be over
// message.MaxPayloadLen is refused naming its data, as too large, however
// small the rest.
func TestTooLargeNamesTheData(t *testing.T) {
	c := testChecker(t)
	data := `{"x":"` + strings.Repeat("x", message.MaxPayloadLen-100) + `"}`
	_, err := c.Check(Entry{Recipient: "a@example.com", Template: "t", Data: json.RawMessage(data)}, time.Now())
	var e *Error
	if !errors.As(err, &e) || e.Field != "data" || !e.TooLarge || !strings.HasPrefix(err.Error(), fmt.Sprintf("data: %d bytes, too much: the task's payload of ", len(data))) {
		t.Errorf("%v (%#v), want a too large error about data", err, e)
	}
}
