// Package buildinfo says which build of the throttler a binary is, for
// -version and the throttler_build_info metric: the version and commit the
// linker sets (-X, as `make release` does), else those Go recorded
// (runtime/debug.ReadBuildInfo).
package buildinfo

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set by the linker (-X) for a release; empty, they
// are read from the build info.
var (
	version string
	commit  string
)

// Info is a binary's build.
type Info struct {
	Version string // "v1.2.0", or "(devel)" for a build from a checkout
	// Commit is the VCS revision, "+dirty" when the tree had changes;
	// "unknown" when the build recorded none (-buildvcs=false).
	Commit string
	Go     string // the toolchain ("go1.24.3")
}

// Read returns this binary's build.
func Read() Info {
	info := Info{Version: version, Commit: commit, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info.Version = cmp.Or(info.Version, bi.Main.Version)
		info.Commit = cmp.Or(info.Commit, revision(bi.Settings))
	}
	info.Version = cmp.Or(info.Version, "(devel)")
	info.Commit = cmp.Or(info.Commit, "unknown")
	return info
}

// revision returns the vcs.revision setting, marked +dirty when
// vcs.modified is true.
func revision(settings []debug.BuildSetting) string {
	var rev string
	var dirty bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "+dirty"
	}
	return rev
}

// String returns what -version prints after the program's name:
// "v1.2.0 (commit 3f2a9c1, go1.24.3, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s/%s)", i.Version, i.Commit, i.Go, runtime.GOOS, runtime.GOARCH)
}
