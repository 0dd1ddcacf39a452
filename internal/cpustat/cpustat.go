// Package cpustat reads how much CPU this process has used, for benchmarks
// that report CPU per operation next to throughput.
package cpustat

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Self returns this process's user + system CPU in seconds from
// /proc/self/stat (at the usual 100 clock ticks per second), or 0 where
// there is no such file.
func Self() float64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields are counted
	// after its closing one.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 { // utime and stime are fields 14 and 15 of the line
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}
