package api

import "strconv"

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

// listKey is one hour's part of a tenant's list of the notifications
// enqueued through the API (Server.list): a sorted set of "<task id>
// <queue>" scored by the time each was queued, in Unix milliseconds. The
// tenant is the hash tag, so on a cluster a tenant's hours live together;
// each part expires ListRetention after its hour ends.
func listKey(prefix, tenant string, hour int64) string {
	return prefix + "api:list:{" + tenant + "}:" + strconv.FormatInt(hour, 10)
}
