package campaign

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The fan-out writes notification tasks the way asynq's Client.Enqueue
// does, but many per round trip and in the same atomic script as its
// progress (see batch.lua). asynq exports no encoder for its task message,
// so taskMessage writes the protobuf by hand. The field numbers are those
// of TaskMessage in asynq v0.26.0's internal/proto/asynq.proto; fields
// equal to zero are left out, as proto3 does. TestTaskMessageMatchesAsynq
// checks the bytes against what asynq's own Client stores, so an asynq
// upgrade that changes the format fails the tests instead of the workers.
const (
	fieldType      = 1
	fieldPayload   = 2
	fieldID        = 3
	fieldQueue     = 4
	fieldRetry     = 5
	fieldTimeout   = 8
	fieldRetention = 12
)

// defaultTimeout is the timeout asynq's Client gives a task that sets
// neither a timeout nor a deadline.
const defaultTimeout = 30 * time.Minute

// message is a pending task as the fan-out enqueues it: no deadline, no
// uniqueness lock, no group, no headers.
type message struct {
	Type      string
	Payload   []byte
	ID        string
	Queue     string
	Retry     int
	Timeout   time.Duration // whole seconds; 0 means defaultTimeout
	Retention time.Duration // whole seconds
}

// appendTo appends m's encoding (asynq's TaskMessage) to b.
func (m message) appendTo(b []byte) []byte {
	str := func(b []byte, num protowire.Number, s string) []byte {
		if s == "" {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	varint := func(b []byte, num protowire.Number, v int64) []byte {
		if v == 0 {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v))
	}
	timeout := m.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	b = str(b, fieldType, m.Type)
	if len(m.Payload) > 0 {
		b = protowire.AppendTag(b, fieldPayload, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Payload)
	}
	b = str(b, fieldID, m.ID)
	b = str(b, fieldQueue, m.Queue)
	b = varint(b, fieldRetry, int64(int32(m.Retry)))
	b = varint(b, fieldTimeout, int64(timeout/time.Second))
	b = varint(b, fieldRetention, int64(m.Retention/time.Second))
	return b
}
