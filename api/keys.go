package api

import "strconv"

// The API's own Redis keys, under the throttle's prefix, each lasting
// intake.KeyRetention: what each holds is in docs/operations.md#the-http-api.

// keyRecord holds the hash of the notification an idempotency key was
// first used with (Server.claimKey).
func keyRecord(prefix, id string) string { return prefix + "api:key:{" + id + "}" }

// canceledKey marks a notification archived by DELETE.
func canceledKey(prefix, id string) string { return prefix + "api:canceled:{" + id + "}" }

// listKey is one hour's part of a tenant's list (Server.list).
func listKey(prefix, tenant string, hour int64) string {
	return prefix + "api:list:{" + tenant + "}:" + strconv.FormatInt(hour, 10)
}
