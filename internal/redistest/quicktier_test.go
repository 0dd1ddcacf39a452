//go:build !integration

package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// fatalTB records what Fatalf says instead of stopping the test.
type fatalTB struct {
	*testing.T
	fatal string
}

func (f *fatalTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }

// TestQuickTierStartsOneServerPerPackage: the package's first standalone
// server starts; a second one is refused with a message saying what to do
// instead, before any process starts.
func TestQuickTierStartsOneServerPerPackage(t *testing.T) {
	s := Start(t)
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the first server: %v", err)
	}
	second := &fatalTB{T: t}
	if got := start(second, false, &security{}); got != nil {
		t.Fatalf("a second server started on %s", got.Addr)
	}
	if !strings.Contains(second.fatal, "a second redis-server in this package's quick tier") {
		t.Errorf("the second start failed with %q, want it to say why", second.fatal)
	}
}
