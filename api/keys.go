package api

// The API's own Redis keys, under the throttle's prefix, each lasting
// intake.KeyRetention. The task ID is the hash tag, so on a cluster each
// lives in its task's slot, as the sent marker does (throttle.Limiter.MarkDone);
// the engine's keys have '{' right after the prefix, so they cannot meet.

// keyRecord holds the hash of the notification an idempotency key was
// first used with (Server.claimKey).
func keyRecord(prefix, id string) string { return prefix + "api:key:{" + id + "}" }

// canceledKey marks a notification archived by DELETE, so that its state
// says canceled rather than archived.
func canceledKey(prefix, id string) string { return prefix + "api:canceled:{" + id + "}" }
