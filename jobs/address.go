package jobs

import (
	"fmt"

	"github.com/notify-throttle/throttler/message"
)

// Addresser is a Provider that knows which recipients its channel can
// deliver to (an E.164 number, an email address, a device token; see
// package address). A job whose recipient it refuses is archived as
// malformed when it is routed, without a send: intake refuses such a
// recipient at the door, and this catches what came another way (an
// older producer, a Go client, a provider whose type changed by a
// reload). Sent as it is, the vendor's invalid-address answer would
// suppress that string for good.
type Addresser interface {
	CheckRecipient(recipient string) error
}

// checkAddress returns the error that archives a job whose provider p
// refuses its recipient, or nil.
func checkAddress(p Provider, recipient string) error {
	a, ok := p.(Addresser)
	if !ok {
		return nil
	}
	if err := a.CheckRecipient(recipient); err != nil {
		return fmt.Errorf("recipient: %v: %w", err, message.ErrBadPayload)
	}
	return nil
}
