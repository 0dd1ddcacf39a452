package asynqdb

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// asynq exports no encoder for its task message, so Message writes the
// protobuf by hand: the field numbers of TaskMessage in asynq Version's
// internal/proto/asynq.proto, zero fields left out as proto3 does
// (TestContract compares the bytes with what asynq's Client stores).
const (
	fieldType      = 1
	fieldPayload   = 2
	fieldID        = 3
	fieldQueue     = 4
	fieldRetry     = 5
	fieldTimeout   = 8
	fieldRetention = 12
	fieldHeaders   = 15 // map<string, string>: an entry per key, key 1 and value 2
)

// DefaultTimeout is the timeout asynq's Client gives a task that sets
// neither a timeout nor a deadline.
const DefaultTimeout = 30 * time.Minute

// Message is a pending task as Client.Enqueue would store it, for a task
// with no deadline, no uniqueness lock and no group.
type Message struct {
	Type      string
	Payload   []byte
	ID        string
	Queue     string
	Retry     int
	Timeout   time.Duration // whole seconds; 0 means DefaultTimeout
	Retention time.Duration // whole seconds
	Headers   map[string]string
}

// AppendTo appends m's encoding (asynq's TaskMessage) to b: the task
// hash's msg field.
func (m Message) AppendTo(b []byte) []byte {
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
		timeout = DefaultTimeout
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
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		var e []byte
		e = str(e, 1, k)
		e = str(e, 2, m.Headers[k])
		b = protowire.AppendTag(b, fieldHeaders, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// Payload returns the payload of an encoded task message (the task hash's
// msg field) and its type, or an error if msg is not a TaskMessage.
func Payload(msg []byte) (typ string, payload []byte, err error) {
	for len(msg) > 0 {
		num, wt, n := protowire.ConsumeField(msg)
		if n < 0 {
			return "", nil, fmt.Errorf("asynqdb: task message: %w", protowire.ParseError(n))
		}
		if wt == protowire.BytesType && (num == fieldType || num == fieldPayload) {
			_, _, tag := protowire.ConsumeTag(msg)
			v, _ := protowire.ConsumeBytes(msg[tag:n])
			if num == fieldType {
				typ = string(v)
			} else {
				payload = v
			}
		}
		msg = msg[n:]
	}
	return typ, payload, nil
}
