package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestRevision: the commit is the VCS revision, marked when the tree had
// changes, and empty when the build recorded none.
func TestRevision(t *testing.T) {
	tests := []struct {
		name     string
		settings []debug.BuildSetting
		want     string
	}{
		{"clean", []debug.BuildSetting{{Key: "vcs.revision", Value: "3f2a9c1"}, {Key: "vcs.modified", Value: "false"}}, "3f2a9c1"},
		{"dirty", []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}, {Key: "vcs.revision", Value: "3f2a9c1"}}, "3f2a9c1+dirty"},
		{"none", []debug.BuildSetting{{Key: "GOOS", Value: "linux"}}, ""},
	}
	for _, tt := range tests {
		if got := revision(tt.settings); got != tt.want {
			t.Errorf("%s: revision = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestRead: a build says something for each field, and the linker's
// values win over the build info's.
func TestRead(t *testing.T) {
	i := Read()
	if i.Version == "" || i.Commit == "" || !strings.HasPrefix(i.Go, "go") {
		t.Errorf("Read() = %+v, want every field set", i)
	}
	version, commit = "v9.9.9", "abc"
	defer func() { version, commit = "", "" }()
	if i := Read(); i.Version != "v9.9.9" || i.Commit != "abc" || !strings.HasPrefix(i.String(), "v9.9.9 (commit abc, go") {
		t.Errorf("Read() with -X values = %+v (%s)", i, i)
	}
}
