package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fleetConfig writes the config files of BenchmarkClusterVsSingle's
// workers from the repository's config.yaml: its worker, policies,
// defaults and log sections as they are, but for each worker's http_addr
// and the default provider, which is a webhook that never binds. Whatever
// config.yaml says of the worker (concurrency, queues and their weights,
// booking, sent markers, the hand-over of dead workers' tasks), and
// whatever it will say (the shards of a queue), the workers run with.
type fleetConfig struct {
	prefix   string // config.yaml's redis.prefix line
	sections map[string]string
}

// fleetSections are the sections of config.yaml the workers take as they are.
var fleetSections = []string{"worker", "policies", "defaults", "log"}

// readFleetConfig reads config.yaml from the repository at root.
func readFleetConfig(root string) (*fleetConfig, error) {
	raw, err := os.ReadFile(filepath.Join(root, "config.yaml"))
	if err != nil {
		return nil, err
	}
	text := string(raw)
	fc := &fleetConfig{sections: map[string]string{}}
	for _, key := range append([]string{"redis"}, fleetSections...) {
		s, ok := yamlSection(text, key)
		if !ok {
			return nil, fmt.Errorf("config.yaml: no %s section", key)
		}
		fc.sections[key] = s
	}
	prefix := regexp.MustCompile(`(?m)^  prefix: .*\n`).FindString(fc.sections["redis"])
	if prefix == "" {
		return nil, fmt.Errorf("config.yaml: no redis.prefix")
	}
	fc.prefix = prefix
	return fc, nil
}

// text returns a worker's config: redis as redisLines say (the lines after
// "redis:", each indented), /healthz and /metrics on httpAddr, the webhook
// at url as the default provider.
func (fc *fleetConfig) text(redisLines, httpAddr, url string) string {
	var b strings.Builder
	b.WriteString("# written by BenchmarkClusterVsSingle from config.yaml\nredis:\n" + redisLines + fc.prefix)
	b.WriteString(setField(fc.sections["worker"], "http_addr", fmt.Sprintf("%q", httpAddr)))
	b.WriteString(fc.sections["policies"])
	fmt.Fprintf(&b, "providers:\n  hook: {type: webhook, url: %q, timeout: 5s, rate: 1000000, burst: 1000000}\n", url)
	b.WriteString(setField(fc.sections["defaults"], "provider", "hook"))
	b.WriteString(fc.sections["log"])
	return b.String()
}

// write writes text's config to a file of its own and returns its path.
func (fc *fleetConfig) write(dir, name, redisLines, httpAddr, url string) (string, error) {
	path := filepath.Join(dir, name+".yaml")
	return path, os.WriteFile(path, []byte(fc.text(redisLines, httpAddr, url)), 0o600)
}

// yamlSection returns the top-level section key of a YAML document: its
// line and the lines after it up to the next top-level key (comments at
// the left margin included).
func yamlSection(text, key string) (string, bool) {
	lines := strings.SplitAfter(text, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, key+":") {
			continue
		}
		end := i + 1
		for end < len(lines) && !isTopLevelKey(lines[end]) {
			end++
		}
		s := strings.Join(lines[i:end], "")
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return s, true
	}
	return "", false
}

// isTopLevelKey reports whether a line starts a top-level key.
func isTopLevelKey(line string) bool {
	return line != "" && line[0] != ' ' && line[0] != '#' && line[0] != '\n' && line[0] != '\r'
}

// setField sets the field of a block section (indented two spaces) to
// value, replacing its line or adding one.
func setField(section, field, value string) string {
	line := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(field) + `:.*$`)
	if line.MatchString(section) {
		return line.ReplaceAllLiteralString(section, "  "+field+": "+value)
	}
	head, rest, _ := strings.Cut(section, "\n")
	return head + "\n  " + field + ": " + value + "\n" + rest
}

// TestFleetConfig: the workers' config keeps config.yaml's sections as
// they are, but for each worker's address and the default provider.
func TestFleetConfig(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	fc, err := readFleetConfig(root)
	if err != nil {
		t.Fatal(err)
	}
	text := fc.text("  url: redis://127.0.0.1:1/0\n", "127.0.0.1:2", "http://127.0.0.1:3/send")
	tests := []struct {
		name, want string
	}{
		{"the worker's address", `  http_addr: "127.0.0.1:2"` + "\n"},
		{"the default provider", "  provider: hook\n"},
		{"the webhook", `url: "http://127.0.0.1:3/send"`},
		{"config.yaml's prefix", `  prefix: "throttle:"` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(text, tt.want) {
				t.Errorf("no %q in\n%s", tt.want, text)
			}
		})
	}
	if n := strings.Count(text, "http_addr:"); n != 1 {
		t.Errorf("%d http_addr lines, want 1", n)
	}
	for _, key := range fleetSections {
		for line := range strings.Lines(fc.sections[key]) {
			if !strings.Contains(line, "http_addr:") && !strings.Contains(line, "provider:") && !strings.Contains(text, line) {
				t.Errorf("config.yaml's %s line %q is not in the workers' config", key, line)
			}
		}
	}
}

func TestSetField(t *testing.T) {
	tests := []struct {
		name, section, field, value, want string
	}{
		{"replaced", "defaults:\n  policy: p\n  provider: console\n", "provider", "hook", "defaults:\n  policy: p\n  provider: hook\n"},
		{"added", "defaults:\n  policy: p\n", "provider", "hook", "defaults:\n  provider: hook\n  policy: p\n"},
		{"a deeper key of that name untouched", "worker:\n  dashboard:\n    http_addr: x\n", "http_addr", `"a"`, "worker:\n  http_addr: \"a\"\n  dashboard:\n    http_addr: x\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := setField(tt.section, tt.field, tt.value); got != tt.want {
				t.Errorf("setField(%q, %q, %q) = %q, want %q", tt.section, tt.field, tt.value, got, tt.want)
			}
		})
	}
}

func TestYAMLSection(t *testing.T) {
	const doc = "# head\nredis:\n  url: x\n# between\nworker:\n  concurrency: 20\n\n  queues: {a: 1}\nlog:\n  level: info"
	tests := []struct {
		name, key, want string
		ok              bool
	}{
		{"middle, up to the next key", "worker", "worker:\n  concurrency: 20\n\n  queues: {a: 1}\n", true},
		{"with the comment after it", "redis", "redis:\n  url: x\n# between\n", true},
		{"last, without a final line break", "log", "log:\n  level: info\n", true},
		{"absent", "policies", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := yamlSection(doc, tt.key)
			if got != tt.want || ok != tt.ok {
				t.Errorf("yamlSection(%q) = %q, %t; want %q, %t", tt.key, got, ok, tt.want, tt.ok)
			}
		})
	}
}
