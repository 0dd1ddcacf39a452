package throttle

import (
	"fmt"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// Every Redis key the engine writes is named by internal/keyspace, which
// says what each holds and which the operator's views read through too. The
// short names below are the engine's own spelling of keyspace's builders.

// DefaultPrefix starts every key unless Options.Prefix says otherwise.
const DefaultPrefix = keyspace.DefaultPrefix

// subjectTag returns "<prefix>{<encoded subject>}", the start of every key of
// that subject.
func subjectTag(prefix, subject string) string { return keyspace.Tag(prefix, subject) }

func quotaKey(tag, rule string) string    { return keyspace.Quota(tag, rule) }
func bucketKey(tag, rule string) string   { return keyspace.Bucket(tag, rule) }
func sentKey(tag, rule string) string     { return keyspace.Sent(tag, rule) }
func bookKey(tag, rule string) string     { return keyspace.Book(tag, rule) }
func slotsKey(tag, rule string) string    { return keyspace.Slots(tag, rule) }
func fairKey(tag, rule string) string     { return keyspace.Fair(tag, rule) }
func tenantsKey(tag, rule string) string  { return keyspace.Tenants(tag, rule) }
func calendarKey(tag, rule string) string { return keyspace.Calendar(tag, rule) }
func doneKey(prefix, id string) string    { return keyspace.Done(prefix, id) }

// checkPrefix rejects prefixes that would take over the hash tag.
func checkPrefix(p string) error {
	if err := keyspace.CheckPrefix(p); err != nil {
		return fmt.Errorf("throttle: %w", err)
	}
	return nil
}
