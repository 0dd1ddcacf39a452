package cpustat

import (
	"runtime"
	"testing"
	"time"
)

// TestSelfCountsWork: CPU spent spinning shows up, and time spent asleep
// does not count as CPU.
func TestSelfCountsWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/stat")
	}
	// Spin until 0.1 s of CPU is counted: on a busy machine 300 ms of wall
	// time may give this process much less CPU than that.
	before, start := Self(), time.Now()
	for Self()-before < 0.1 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("spinning 30s counted %.2fs of CPU, want at least 0.1s", Self()-before)
		}
	}
	before = Self()
	// Sleeping is what is under test: it must not count as CPU.
	time.Sleep(300 * time.Millisecond)
	if slept := Self() - before; slept > 0.15 {
		t.Errorf("sleeping 300ms counted %.2fs of CPU", slept)
	}
}
