package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestVersion: -version prints the release binary's name, version and
// commit on stdout, connects to nothing and exits 0.
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-version"}, process{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }})
	if code != 0 || !strings.HasPrefix(stdout.String(), "throttler-enqueue ") || !strings.Contains(stdout.String(), "(commit ") || stderr.Len() > 0 {
		t.Errorf("enqueue -version: status %d, stdout %q, stderr %q; want 0 and \"throttler-enqueue VERSION (commit ...)\"", code, stdout.String(), stderr.String())
	}
}
