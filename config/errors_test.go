package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/throttle"
)

// noEnv is an environment with nothing set.
func noEnv(string) string { return "" }

// TestLoadErrors loads every file of testdata/, each a mistake (or a few),
// and checks the whole error against the "# want: " lines at the file's end,
// one per problem: file, line, path and bad value included. A file of no
// bytes at all wants the message for an empty file.
//
// It loads each as enqueue does too (LoadProducer): a producer checks every
// setting a worker checks but resolves no provider's secret, so it finds
// the same mistakes, except where the file's "# producer: " lines say
// otherwise ("# producer: loads": a secret only a worker resolves).
func TestLoadErrors(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			want := wantOf(t, file)
			c, err := LoadWithEnv(file, noEnv)
			if err == nil {
				t.Fatalf("Load succeeded, want error:\n%s\ngot config %+v", want, c)
			}
			if got := err.Error(); got != want {
				t.Errorf("wrong error\n got: %s\nwant: %s", got, want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows the password: %v", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != file || e.Line < 1 {
				t.Errorf("errors.As(*Error) = %+v, want one naming the file and a line", e)
			}
			want = producerWantOf(t, file)
			switch c, err := LoadProducer(file, noEnv); {
			case want == "loads" && err != nil:
				t.Errorf("LoadProducer: %v, want it to load", err)
			case want == "loads":
			case err == nil:
				t.Errorf("LoadProducer succeeded, want error:\n%s\ngot config %+v", want, c)
			case err.Error() != want:
				t.Errorf("LoadProducer: wrong error\n got: %s\nwant: %s", err, want)
			}
		})
	}
}

// wantOf returns the error a testdata file wants: its "# want: " lines.
func wantOf(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) == 0 {
		return file + ":1: empty: no settings (see the example config.yaml)"
	}
	want := commentLines(data, "# want: ")
	if want == "" {
		t.Fatalf("%s has no \"# want: \" line: every testdata file is a mistake and says what error it wants", file)
	}
	return want
}

// producerWantOf returns what LoadProducer wants of a testdata file: its
// "# producer: " lines, else what a worker wants.
func producerWantOf(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := commentLines(data, "# producer: "); want != "" {
		return want
	}
	return wantOf(t, file)
}

// commentLines returns the rest of data's lines that start with prefix,
// joined by newlines.
func commentLines(data []byte, prefix string) string {
	var lines []string
	for _, line := range strings.Split(string(data), "\n") {
		if w, ok := strings.CutPrefix(line, prefix); ok {
			lines = append(lines, w)
		}
	}
	return strings.Join(lines, "\n")
}

func TestRuleErrorWrapsThrottle(t *testing.T) {
	_, err := LoadWithEnv("testdata/bad_policy_name.yaml", noEnv)
	if !errors.Is(err, throttle.ErrInvalidRule) {
		t.Errorf("error %v does not wrap throttle.ErrInvalidRule", err)
	}
	var re *throttle.RuleError
	if !errors.As(err, &re) || re.Rule != `quota name "daily limit"` {
		t.Errorf("errors.As(*throttle.RuleError) = %+v, want the quota's", re)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestErrorText checks Error's format with and without each part.
func TestErrorText(t *testing.T) {
	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{File: "c.yaml", Line: 3, Path: "worker.jitter", Msg: "bad"}, "c.yaml:3: worker.jitter: bad"},
		{Error{File: "c.yaml", Path: "worker.jitter", Msg: "bad"}, "c.yaml: worker.jitter: bad"},
		{Error{File: "c.yaml", Line: 1, Msg: "empty"}, "c.yaml:1: empty"},
		{Error{Path: "REDIS_URL", Msg: "bad"}, "REDIS_URL: bad"},
		{Error{Path: "a\nb", Msg: "x\ty"}, `a\nb: x\ty`},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.e, got, tt.want)
		}
	}
}
