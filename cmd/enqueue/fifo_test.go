//go:build unix && integration

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestRedisFailsMidFile stops Redis after 100 lines of a file (a FIFO, so
// that the test decides when the rest arrives): enqueue must stop, say how
// many lines were enqueued and from which line to resume, and not report
// the bad line past that point.
func TestRedisFailsMidFile(t *testing.T) {
	h := newOwnHarness(t)
	path := filepath.Join(t.TempDir(), "in.jsonl")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan outcome)
	go func() { done <- h.runArgs("-file", path) }()
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write := func(from, to int) {
		var b strings.Builder
		for i := from; i <= to; i++ {
			if i == 150 {
				b.WriteString("{}\n") // rejected, were it reached
				continue
			}
			fmt.Fprintf(&b, `{"recipient":"r%d@example.com","template":"t"}`+"\n", i)
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			t.Error(err)
		}
	}
	write(1, 100)
	waitPending(t, h, 100)
	h.srv.Kill()
	write(101, 200)
	w.Close()

	out := <-done
	lines := strings.Split(strings.TrimSuffix(out.stderr, "\n"), "\n")
	wantTail := []string{
		fmt.Sprintf("enqueue: stopped: lines 1-100 are done, 100 enqueued; resume from line 101: tail -n +101 %s | enqueue -config testdata/config.yaml -file -", path),
		"enqueued 100, duplicates 0, rejected 0 (100 lines)",
	}
	if out.code != 1 || len(lines) != 3 || !strings.HasPrefix(lines[0], "enqueue: "+path+":101: ") || !slices.Equal(lines[1:], wantTail) {
		t.Errorf("enqueue = %d, stderr:\n%s\nwant 1 and stderr:\nenqueue: %s:101: <the Redis error>\n%s", out.code, out.stderr, path, strings.Join(wantTail, "\n"))
	}
}
