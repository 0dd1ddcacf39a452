// Package lifecycle is the life of a message as its producer sees it: each
// outcome is an Event, kept in the message's history (Recorder) and, for a
// tenant with a status callback, POSTed to its endpoint, signed
// (Dispatcher, Verify). How and at what cost:
// docs/operations.md#events-and-status-callbacks; the receiver's view:
// event.schema.json.
package lifecycle

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"strconv"
	"time"
)

// Type is what happened to a message, by the name the worker's log lines
// give the same outcome. Who records which: docs/operations.md's table.
type Type string

const (
	Accepted     Type = "accepted"     // enqueued (Via says by what)
	Scheduled    Type = "scheduled"    // to be sent at Moment, at the producer's asking
	Booked       Type = "booked"       // waits for Moment, which every rule allows (Rule held it)
	Deferred     Type = "deferred"     // waits until Until: a rule without booking (Rule), or its provider (Provider, Detail)
	Sent         Type = "sent"         // its provider accepted it (ProviderMessageID when it said)
	Dropped      Type = "dropped"      // over its policy's cap (Rule), which drops
	Expired      Type = "expired"      // its deadline (Reason) came before the rules allowed it (Rule)
	Folded       Type = "folded"       // folded into Digest, a message of its own that goes at Moment
	Archived     Type = "archived"     // never to be sent, for Reason (see the Archived* reasons)
	Canceled     Type = "canceled"     // canceled through the API (DELETE)
	Delivered    Type = "delivered"    // the provider reports it delivered
	Bounced      Type = "bounced"      // the provider reports it bounced: Reason hard (now suppressed) or soft
	Complained   Type = "complained"   // its recipient marked it as spam
	Unsubscribed Type = "unsubscribed" // its recipient unsubscribed
)

// Types are the event types, in the order of a message's life.
var Types = []Type{Accepted, Scheduled, Booked, Deferred, Sent, Dropped, Expired, Folded, Archived, Canceled,
	Delivered, Bounced, Complained, Unsubscribed}

// Reasons of an Archived event: the throttler_archived_total labels.
const (
	ArchivedMalformed  = "malformed"         // its payload is not a notification the config routes
	ArchivedRejected   = "rejected"          // its provider refused it for good
	ArchivedSuppressed = "suppressed"        // its address is on its provider's dead list
	ArchivedDead       = "dead_address"      // its provider said the address is dead (and it is suppressed now)
	ArchivedExhausted  = "retries_exhausted" // its sends failed as many times as its task may retry
)

// Reasons of a Bounced event: the address is dead (and now suppressed), or
// may take a later message (a full mailbox, a phone off).
const (
	BouncedHard = "hard"
	BouncedSoft = "soft"
)

// Vias of an Accepted event: what enqueued the message.
const (
	ViaAPI      = "api"
	ViaEnqueue  = "enqueue"
	ViaCampaign = "campaign"
)

// Event is one outcome of one message. Its JSON is what the history keeps,
// GET shows and a callback POSTs (event.schema.json); the fields after At
// are those of its Type.
type Event struct {
	// ID is the same for the same outcome of the same message, however
	// often it is recorded or POSTed: receivers deduplicate on it (NewID).
	ID      string `json:"id"`
	Type    Type   `json:"type"`
	Message string `json:"message"` // the task ID, the API's id
	// IdempotencyKey is the producer's, if any: the accepted event carries
	// it, the others are given it from that event when read or POSTed.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Tenant         string `json:"tenant"` // "" is the default tenant
	// At is when it happened by Redis's clock, UTC to the millisecond: an
	// admission's TIME, else Recorder.Now.
	At time.Time `json:"at"`

	Via               string     `json:"via,omitempty"`                 // accepted: ViaAPI, ViaEnqueue or ViaCampaign
	Campaign          string     `json:"campaign,omitempty"`            // accepted by a campaign: its run, "<name>@<tick>"
	Moment            *time.Time `json:"moment,omitempty"`              // scheduled, booked, folded: when it (the digest) goes
	Until             *time.Time `json:"until,omitempty"`               // deferred: when it is tried again
	Rule              string     `json:"rule,omitempty"`                // booked, deferred, dropped, expired: the rule, with its limit
	Provider          string     `json:"provider,omitempty"`            // sent, deferred by a provider, archived, the feedback
	ProviderMessageID string     `json:"provider_message_id,omitempty"` // sent, the feedback: the provider's own ID, when known
	Reason            string     `json:"reason,omitempty"`              // archived: an Archived* reason; expired: the deadline; bounced: BouncedHard or BouncedSoft
	Detail            string     `json:"detail,omitempty"`              // deferred by a provider, archived, the feedback: its words
	Digest            string     `json:"digest,omitempty"`              // folded: the digest's message ID
}

// NewID returns the ID of an outcome of type t of message, told apart from
// its other outcomes of that type by what (Event.what): the first 16 bytes
// of a SHA-256, in hex.
func NewID(message string, t Type, what string) string {
	sum := sha256.Sum256([]byte(message + "\x00" + string(t) + "\x00" + what))
	return hex.EncodeToString(sum[:16])
}

// what tells e apart from its message's other outcomes of its type: a
// message is booked or deferred many times, each at its own moment, and a
// soft bounce may come before a hard one.
func (e *Event) what() string {
	switch e.Type {
	case Scheduled, Booked:
		return millis(e.Moment)
	case Folded:
		return e.Digest
	case Deferred:
		return millis(e.Until)
	case Archived:
		return e.Reason
	case Delivered, Complained, Unsubscribed:
		return e.ProviderMessageID
	case Bounced:
		return e.ProviderMessageID + "\x00" + e.Reason
	}
	return ""
}

func millis(t *time.Time) string {
	if t == nil {
		return ""
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// fill gives e its ID and its time (now) unless it has them; times are kept
// in UTC to the millisecond.
func (e *Event) fill(now time.Time) {
	if e.At.IsZero() {
		e.At = now
	}
	e.At = e.At.UTC().Truncate(time.Millisecond)
	for _, t := range []**time.Time{&e.Moment, &e.Until} {
		if *t != nil {
			v := (*t).UTC().Truncate(time.Millisecond)
			*t = &v
		}
	}
	e.ID = IDOf(*e)
}

// IDOf returns the ID e is recorded with: its own if it has one, else
// NewID's (a moment counts to the millisecond, as Record keeps it).
func IDOf(e Event) string {
	if e.ID != "" {
		return e.ID
	}
	return NewID(e.Message, e.Type, e.what())
}

// Moment returns a pointer to t, for Event.Moment and Event.Until.
func Moment(t time.Time) *time.Time { return &t }

// Schema is the JSON Schema (2020-12) of an event's JSON: event.schema.json.
//
//go:embed event.schema.json
var Schema []byte
