package screen

import "strings"

// The keys the screen writes beside the throttle engine's (internal/keyspace), all
// under the engine's prefix and built here. The part in braces is the Redis
// Cluster hash tag; user data in it is escaped by keyPart.

// holdKey is a scoped pause of one provider: "<prefix>hold:{<provider>|<scope>}",
// a string that expires when the pause ends (see Screen).
func holdKey(prefix, provider, scope string) string {
	return prefix + "hold:{" + keyPart(provider) + "|" + keyPart(scope) + "}"
}

// suppressedKey is a provider's suppressed addresses:
// "<prefix>suppressed:{<provider>}", a hash of address -> suppression JSON.
func suppressedKey(prefix, provider string) string {
	return prefix + "suppressed:{" + keyPart(provider) + "}"
}

// keyPart escapes s for a key's hash tag: '%', '{' and '}' become %XX, so
// no value can close the tag or meet another's escaped form.
var keyPart = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace
