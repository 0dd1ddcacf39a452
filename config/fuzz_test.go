package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// errorLine is how every line of an error from Parse starts.
var errorLine = regexp.MustCompile(`^fuzz\.yaml:[0-9]+: `)

// FuzzParse checks that Parse never panics and returns either a valid
// Config or an error whose every line names the file and a line.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	seeds = append(seeds, "../config.yaml")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("policies:\n  a: &a [{limit: 1, per: 1d}]\n  b: *a\ncampaigns:\n  - {name: x, cron: '* * * * *', template: t, policy: a, provider: p, data: {k: [1, {z: .inf}]}}\nproviders:\n  p: {type: log, rate: 1e-3, burst: 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a config and an error: %v", err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !errorLine.MatchString(line) {
					t.Fatalf("error line %q does not start with fuzz.yaml:LINE:", line)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted what Validate rejects: %v", err)
		}
		if _, _, err := c.Rules(); err != nil {
			t.Fatalf("Parse accepted a config whose Rules fail: %v", err)
		}
	})
}
