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
	var want []string
	for _, line := range strings.Split(string(data), "\n") {
		if w, ok := strings.CutPrefix(line, "# want: "); ok {
			want = append(want, w)
		}
	}
	if len(want) == 0 {
		t.Fatalf("%s has no \"# want: \" line: every testdata file is a mistake and says what error it wants", file)
	}
	return strings.Join(want, "\n")
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
