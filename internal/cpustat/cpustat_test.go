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
	before := Self()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	spun := Self() - before
	if spun < 0.1 {
		t.Errorf("spinning 300ms counted %.2fs of CPU, want most of it", spun)
	}
	before = Self()
	time.Sleep(300 * time.Millisecond)
	if slept := Self() - before; slept > 0.15 {
		t.Errorf("sleeping 300ms counted %.2fs of CPU", slept)
	}
}
