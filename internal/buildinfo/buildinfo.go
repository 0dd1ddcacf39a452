// Package buildinfo says which build of the throttler a binary is: its
// version and the commit it was built from, for -version and the
// throttler_build_info metric.
//
// Both come from the binary itself (runtime/debug.ReadBuildInfo: the module
// version `go install` records, the vcs.revision `go build` stamps in a git
// checkout), unless the linker sets them, as `make release` does:
//
//	go build -ldflags "-X github.com/notify-throttle/throttler/internal/buildinfo.version=v1.2.0
//	  -X github.com/notify-throttle/throttler/internal/buildinfo.commit=3f2a9c1"
package buildinfo

import (
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
	// Version is the release ("v1.2.0"), the module version go install
	// recorded, or "(devel)" for a build from a checkout.
	Version string
	// Commit is the VCS revision, with "+dirty" when the tree had changes;
	// "unknown" when the build did not record one (go build -buildvcs=false).
	Commit string
	// Go is the toolchain that built it ("go1.24.3").
	Go string
}

// Read returns this binary's build.
func Read() Info {
	info := Info{Version: version, Commit: commit, Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if info.Version == "" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			info.Commit = revision(bi.Settings)
		}
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
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
