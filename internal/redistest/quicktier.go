package redistest

import (
	"sync/atomic"
	"testing"
)

// quickTierServers counts the servers the quick tier's tests started in
// this process, which is one package's: the package's one state, as the
// rule it keeps is per process.
var quickTierServers atomic.Int32

// oneServerPerPackage reports whether t may start a server, and fails t if
// not: in the quick tier (no integration tag) a package starts one, which
// its tests share (RunShared); benchmarks and the integration tier, many.
func oneServerPerPackage(t TB) bool {
	t.Helper()
	if _, bench := t.(*testing.B); bench || integrationTier {
		return true
	}
	if quickTierServers.Add(1) > 1 {
		t.Fatalf("redistest: a second redis-server in this package's quick tier: give the test a database of the shared one (RunShared, Shared.NewClient), or put it behind the integration build tag")
		return false
	}
	return true
}
