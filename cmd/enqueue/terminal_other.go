//go:build !linux

package main

import "os"

// isTerminal reports whether f is a character device: a terminal, or
// rarely something like /dev/null, which a progress bar does not hurt.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
