package api

import "crypto/sha256"

// The API's own Redis keys, under the throttle's prefix. The task ID is the
// hash tag, so on a cluster each lives in its task's slot, as the sent
// markers do (jobs.SentMarks.Key); the engine's keys have '{' right after
// the prefix, so they cannot meet.

// bodyKey holds the hash of the notification an idempotency key was first
// used with (Server.claimKey).
func bodyKey(prefix, id string) string { return prefix + "api:body:{" + id + "}" }

// canceledKey marks a notification archived by DELETE, so that its state
// says canceled rather than archived.
func canceledKey(prefix, id string) string { return prefix + "api:canceled:{" + id + "}" }

func sha256Sum(b []byte) [sha256.Size]byte { return sha256.Sum256(b) }
