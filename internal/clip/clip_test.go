package clip

import "testing"

func TestCut(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 5, "short"},
		{"longer", 4, "long…"},
		{"añb", 2, "a…"}, // ñ is 2 bytes: not split
		{"ñ", 1, "…"},
		{"", 0, ""},
	} {
		if got := Cut(c.s, c.n, "…"); got != c.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
