package campaign

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/notify-throttle/throttler/message"
)

// Tick is one firing of a campaign at the moment its schedule named, in
// whole seconds: the same on every worker, whatever its clock.
type Tick struct {
	Campaign string `json:"campaign"`
	Unix     int64  `json:"tick"`
}

// NewTick returns the tick of the campaign named name at t (to the second).
func NewTick(name string, t time.Time) Tick { return Tick{Campaign: name, Unix: t.Unix()} }

// Time returns the tick's moment.
func (t Tick) Time() time.Time { return time.Unix(t.Unix, 0).UTC() }

// String returns "<campaign>@<RFC 3339 UTC>", e.g. "digest@2024-06-03T09:00:00Z".
func (t Tick) String() string { return t.Campaign + "@" + t.Time().Format(time.RFC3339) }

// TaskID returns the ID of the tick's fan-out task,
// "campaign:<name>:<unix>": while it exists, firing the tick again is a
// conflict.
func (t Tick) TaskID() string { return "campaign:" + t.Campaign + ":" + strconv.FormatInt(t.Unix, 10) }

// NotificationID returns the task ID of the tick's notification to
// recipient: the same however often it is met.
func (t Tick) NotificationID(recipient string) string {
	return message.TaskID(t.TaskID() + ":" + recipient)
}

func (t Tick) payload() []byte {
	b, _ := json.Marshal(t) // a string and an integer always encode
	return b
}

var errBadTick = errors.New("campaign: bad fan-out payload")

func decodeTick(payload []byte) (Tick, error) {
	var t Tick
	if err := json.Unmarshal(payload, &t); err != nil {
		return t, fmt.Errorf("%w: %v", errBadTick, err)
	}
	if t.Campaign == "" || t.Unix <= 0 {
		return t, fmt.Errorf("%w: %q", errBadTick, payload)
	}
	return t, nil
}
