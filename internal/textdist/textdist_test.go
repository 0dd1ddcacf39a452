package textdist

import (
	"math"
	"strings"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"policy", "policy", 0},
		{"polcy", "policy", 1},   // deletion
		{"pollicy", "policy", 1}, // insertion
		{"polixy", "policy", 1},  // substitution
		{"ploicy", "policy", 1},  // swap of adjacent bytes
		{"concurency", "concurrency", 1},
		{"recipeint", "recipient", 1},
		{"queue", "policy", 6},
		{"", "abc", 3},
		{strings.Repeat("a", MaxLen+1), "a", math.MaxInt},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if c.want != math.MaxInt {
			if got := Distance(c.b, c.a); got != c.want {
				t.Errorf("Distance(%q, %q) = %d, want %d (symmetric)", c.b, c.a, got, c.want)
			}
		}
	}
}
