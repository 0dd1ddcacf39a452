package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/notify-throttle/throttler/throttle"
)

// populate gives n recipients a history under marketing (one entry each,
// through the engine) and the sms provider a few takes.
func (e *env) populate(t testing.TB, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		r := throttle.Request{ID: fmt.Sprintf("h%d", i),
			Takes: []throttle.Take{{Rule: e.rules.quotas["marketing"], Subject: fmt.Sprintf("user%d@example.com", i)}}}
		if _, err := e.lim.Admit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	e.admit(t, "recent", "user0@example.com", "transactional", "sms")
}

// commandsPer returns how many Redis commands one GET of path costs.
func (e *env) commandsPer(t testing.TB, path string) int64 {
	t.Helper()
	before := e.cmds.Load()
	if code, body := e.get(t, path); code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return e.cmds.Load() - before
}

var measured = []string{"/throttle?recipient=user7@example.com", "/throttle/api/providers", "/throttle/api/recipients/user7@example.com",
	"/throttle/api/recipients/nobody@example.com", "/throttle/api/campaigns"}

// TestCommandsIndependentOfKeys: a page load and a recipient lookup send
// the same number of Redis commands with 100 recipients in Redis as with
// 5,000, and none walks the keyspace.
func TestCommandsIndependentOfKeys(t *testing.T) {
	counts := map[string][]int64{}
	for _, n := range []int{100, 5000} {
		e := newEnv(t, "", nil)
		e.populate(t, n)
		for _, p := range measured {
			counts[p] = append(counts[p], e.commandsPer(t, p))
		}
		if walks := e.scans.Load(); walks > 0 {
			t.Errorf("%d keyspace walks (SCAN, KEYS, ...) at %d recipients", walks, n)
		}
	}
	for _, p := range measured {
		c := counts[p]
		if c[0] != c[1] || c[0] == 0 {
			t.Errorf("GET %s: %d commands at 100 recipients, %d at 5,000; want the same", p, c[0], c[1])
		}
		t.Logf("GET %s: %d Redis commands", p, c[0])
	}
}

// BenchmarkCommandsPerPage reports the Redis commands of a /throttle page
// load (with a recipient looked up) and of a recipient lookup through the
// API, at 1k and 100k recipients with history: the counts must not move.
//
//	go test -run '^$' -bench CommandsPerPage ./dashboard/
func BenchmarkCommandsPerPage(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		e := newEnv(b, "", nil)
		e.populate(b, n)
		for _, c := range []struct{ name, path string }{
			{"page", "/throttle?recipient=user7@example.com"},
			{"lookup", "/throttle/api/recipients/user7@example.com"},
		} {
			b.Run(fmt.Sprintf("%s/recipients=%d", c.name, n), func(b *testing.B) {
				var cmds int64
				for b.Loop() {
					cmds += e.commandsPer(b, c.path)
				}
				b.ReportMetric(float64(cmds)/float64(b.N), "cmds/op")
			})
		}
	}
}
