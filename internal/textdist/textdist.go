// Package textdist measures how far apart two short strings are, for "did
// you mean" suggestions in error messages (config keys, JSONL fields).
package textdist

import "math"

// MaxLen is the longest string Distance compares; longer ones are never a
// typo of a known name, and the bound keeps a fuzzed input cheap.
const MaxLen = 64

// Distance is the optimal string alignment distance of a and b in bytes:
// insertions, deletions, substitutions and swaps of adjacent bytes each
// count 1. It is math.MaxInt when either is longer than MaxLen.
func Distance(a, b string) int {
	if len(a) > MaxLen || len(b) > MaxLen {
		return math.MaxInt
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
