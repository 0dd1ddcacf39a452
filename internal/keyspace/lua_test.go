package keyspace_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/internal/keyspace"
)

// luaConstants returns the numbers the engine's Lua names at the top level
// of its files, "local NAME = 123" or "local A, B = 1, 2", by name.
func luaConstants(t *testing.T) map[string]int64 {
	t.Helper()
	files, err := filepath.Glob("../../lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("the engine's Lua: %v (%d files)", err, len(files))
	}
	line := regexp.MustCompile(`(?m)^local ([A-Z_][A-Z0-9_]*(?:, *[A-Z_][A-Z0-9_]*)*) *= *([0-9]+(?:, *[0-9]+)*)`)
	out := map[string]int64{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range line.FindAllStringSubmatch(string(src), -1) {
			names, values := strings.Split(m[1], ","), strings.Split(m[2], ",")
			for i := range min(len(names), len(values)) {
				v, _ := strconv.ParseInt(strings.TrimSpace(values[i]), 10, 64)
				out[strings.TrimSpace(names[i])] = v
			}
		}
	}
	return out
}

// TestConstantsMatchLua checks that the values keyspace gives readers are
// the ones the Lua writes with.
func TestConstantsMatchLua(t *testing.T) {
	lua := luaConstants(t)
	for _, tc := range []struct {
		name string
		want int64
	}{
		{"GRACE", keyspace.Grace},
	} {
		got, ok := lua[tc.name]
		if !ok {
			t.Errorf("%s: not a top-level number of lua/*.lua", tc.name)
			continue
		}
		if got != tc.want {
			t.Errorf("%s = %d in the Lua, %d in keyspace", tc.name, got, tc.want)
		}
	}
}
