package digest

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
)

// The keys of the digests, all under the throttle engine's prefix and
// built here. A digest's keys share one hash slot per recipient, policy
// and provider (the hash in braces); an attempt marker is in its task's.

// keys returns the digest's keys: gen, ids and its list.
func (g *Store) keys(d Ref) (gen, ids, list string) {
	sum := sha1.Sum([]byte(d.Recipient + "\x00" + d.Policy + "\x00" + d.Provider))
	base := g.prefix + "digest:{" + hex.EncodeToString(sum[:10]) + "}:"
	return base + "gen", base + "ids", base + "list:" + strconv.FormatInt(d.Gen, 10)
}

// attemptKey is the key of task id's attempt marker: a send of it was
// tried, and the provider may have taken it.
func (g *Store) attemptKey(id string) string { return g.prefix + "attempt:{" + id + "}" }
