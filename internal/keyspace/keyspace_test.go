package keyspace_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/keyspace/keyspacetest"
)

// decodeSubject inverts the readable (not hashed) form of EncodeSubject.
func decodeSubject(e string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(e); i++ {
		c := e[i]
		if c != '%' {
			if !keyspace.KeepByte(c) {
				return "", fmt.Errorf("byte %q at %d is neither kept nor escaped", c, i)
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(e) {
			return "", fmt.Errorf("truncated escape at %d", i)
		}
		var v byte
		for _, h := range []byte(e[i+1 : i+3]) {
			switch {
			case '0' <= h && h <= '9':
				v = v<<4 | (h - '0')
			case 'A' <= h && h <= 'F':
				v = v<<4 | (h - 'A' + 10)
			default:
				return "", fmt.Errorf("bad escape %q at %d", e[i:i+3], i)
			}
		}
		if keyspace.KeepByte(v) {
			return "", fmt.Errorf("escape %q at %d of a byte that is kept as is", e[i:i+3], i)
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}

func checkEncoded(t *testing.T, s string) string {
	t.Helper()
	e := keyspace.EncodeSubject(s)
	if again := keyspace.EncodeSubject(s); again != e {
		t.Fatalf("EncodeSubject(%q) not deterministic: %q then %q", s, e, again)
	}
	if len(e) > 130 {
		t.Errorf("EncodeSubject(%q) = %d bytes, want at most 130", s, len(e))
	}
	for i := 0; i < len(e); i++ {
		c := e[i]
		if c == '{' || c == '}' || c == ':' || c == ' ' || c < 0x20 || c >= 0x7f || !(keyspace.KeepByte(c) || c == '%' || c == '#') {
			t.Fatalf("EncodeSubject(%q) = %q: byte %q at %d", s, e, c, i)
		}
	}
	if strings.HasPrefix(e, "#") {
		if len(e) != 44 || strings.Contains(e[1:], "#") || strings.Contains(e, "%") {
			t.Errorf("EncodeSubject(%q) = %q: not '#' and 43 base64url bytes", s, e)
		}
	} else {
		if strings.Contains(e, "#") {
			t.Errorf("EncodeSubject(%q) = %q: '#' in the readable form", s, e)
		}
		if d, err := decodeSubject(e); err != nil || d != s {
			t.Errorf("EncodeSubject(%q) = %q decodes to %q, %v", s, e, d, err)
		}
	}
	tag := keyspace.Tag(keyspace.DefaultPrefix, s)
	if strings.Count(tag, "{") != 1 || strings.Count(tag, "}") != 1 || !strings.HasSuffix(tag, "}") {
		t.Errorf("Tag(%q) = %q: want exactly one hash tag, at its end", s, tag)
	}
	return e
}

func FuzzEncodeSubject(f *testing.F) {
	nasty := keyspacetest.NastySubjects()
	for i, a := range nasty {
		f.Add(a, nasty[(i+1)%len(nasty)])
		f.Add(a, a)
	}
	// Pairs whose encodings could meet if escaping or hashing went wrong.
	most := keyspace.MaxEncoded
	for _, p := range [][2]string{
		{"%41", "A"}, {"%", "%25"}, {"{", "%7B"}, {"}", "%7D"}, {":", "%3A"}, {" ", "%20"}, {"#", "%23"},
		{"a{b}c", "a%7Bb%7Dc"}, {"\n", "%0A"}, {"\u00e9", "e\u0301"}, {"\u00e9", "%C3%A9"},
		{strings.Repeat("a", most), strings.Repeat("a", most+1)},
		{"#" + strings.Repeat("A", 43), strings.Repeat("x", 1024)},
	} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := checkEncoded(t, a), checkEncoded(t, b)
		if a != b && ea == eb && !(strings.HasPrefix(ea, "#") && strings.HasPrefix(eb, "#")) {
			t.Errorf("EncodeSubject(%q) = EncodeSubject(%q) = %q", a, b, ea)
		}
		if a == b && ea != eb {
			t.Errorf("EncodeSubject(%q) gave %q and %q", a, ea, eb)
		}
	})
}

// TestKeys pins each key kind's name: the Lua and the readers find the
// engine's state by them, so a changed name is a changed layout.
func TestKeys(t *testing.T) {
	tag := keyspace.Tag("t:", "a b")
	for _, tc := range []struct {
		name string
		key  func(tag, rule string) string
		want string
	}{
		{"quota", keyspace.Quota, "t:{a%20b}:q:r"},
		{"bucket", keyspace.Bucket, "t:{a%20b}:b:r"},
		{"book", keyspace.Book, "t:{a%20b}:b:r:book"},
		{"slots", keyspace.Slots, "t:{a%20b}:b:r:slots"},
		{"fair", keyspace.Fair, "t:{a%20b}:b:r:fair"},
		{"tenants", keyspace.Tenants, "t:{a%20b}:b:r:tenants"},
		{"calendar", keyspace.Calendar, "t:{a%20b}:c:r"},
	} {
		if got := tc.key(tag, "r"); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if got, want := keyspace.Done("t:", "job-1"), "t:done:{job-1}"; got != want {
		t.Errorf("done: %q, want %q", got, want)
	}
}

func TestTaskOf(t *testing.T) {
	for _, tc := range []struct{ member, want string }{
		{"job-1", "job-1"},
		{"job-1\x1f3", "job-1"},
		{"job-1\x1e4", "job-1"},
		{"", ""},
	} {
		if got := keyspace.TaskOf(tc.member); got != tc.want {
			t.Errorf("TaskOf(%q) = %q, want %q", tc.member, got, tc.want)
		}
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"throttle:", true}, {"", true}, {"a{b", false}, {"}", false},
	} {
		if err := keyspace.CheckPrefix(tc.prefix); (err == nil) != tc.ok {
			t.Errorf("CheckPrefix(%q) = %v, want ok %v", tc.prefix, err, tc.ok)
		}
	}
}
