package redistest

import (
	"sync/atomic"
	"testing"
)

// quickTierServers counts the standalone servers started by the quick tier's
// tests in this test process, which is one package. It is the one piece of
// package state here: the rule it keeps is per process.
var quickTierServers atomic.Int32

// oneServerPerPackage reports whether t may start a standalone server, and
// fails t when it may not: in the quick tier (no integration build tag) a
// package starts at most one, which its tests share (RunShared). Benchmarks
// and the integration tier start as many as they need.
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
