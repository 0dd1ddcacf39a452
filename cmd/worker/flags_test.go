package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandLine: -h answers on stdout with status 0, -version names the
// release binary and its commit, and a mistake on the command line is said
// once on stderr with status 2.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string // a prefix
		stderr     string // exact
		stdoutNone bool
	}{
		{name: "help", args: []string{"-h"}, code: 0, stdout: "Usage: worker [-config config.yaml]"},
		{name: "version", args: []string{"-version"}, code: 0, stdout: "throttler-worker "},
		{name: "unknown flag", args: []string{"-nope"}, code: 2, stdoutNone: true,
			stderr: "worker: flag provided but not defined: -nope\nRun 'worker -h' for usage.\n"},
		{name: "bad value", args: []string{"-demo", "soon"}, code: 2, stdoutNone: true,
			stderr: "worker: invalid value \"soon\" for flag -demo: parse error\nRun 'worker -h' for usage.\n"},
		{name: "argument", args: []string{"config.yaml"}, code: 2, stdoutNone: true,
			stderr: "worker: unexpected argument \"config.yaml\": flags come first, values need their flag\nRun 'worker -h' for usage.\n"},
		{name: "connect without check", args: []string{"-connect"}, code: 2, stdoutNone: true,
			stderr: "worker: -connect goes with -check\nRun 'worker -h' for usage.\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			code := exitStatus(err, &stderr)
			if code != tt.code || !strings.HasPrefix(stdout.String(), tt.stdout) || stderr.String() != tt.stderr ||
				tt.stdoutNone && stdout.Len() > 0 {
				t.Errorf("worker %v: status %d, stdout:\n%.200s\nstderr:\n%s\nwant %d, stdout starting %q, stderr %q",
					tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
			}
		})
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, &stdout, &stdout); err != nil || !strings.Contains(stdout.String(), "(commit ") {
		t.Errorf("-version: %v, %q; want the commit", err, stdout.String())
	}
}

// TestHTTPAddrInUseStopsAtStart: a worker whose http_addr cannot be
// listened on stops before it connects to anything, naming the setting,
// instead of running without /healthz and /metrics.
func TestHTTPAddrInUseStopsAtStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	path := filepath.Join(t.TempDir(), "worker.yaml")
	yaml := "redis: {url: \"redis://127.0.0.1:1/0\"}\nworker: {http_addr: \"" + taken.Addr().String() + "\"}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	err = run(ctx, []string{"-config", path}, &stderr, &stderr)
	want := "worker.http_addr: cannot serve /healthz, /metrics and the dashboard on " + taken.Addr().String() + ": "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("run = %v\nwant %s...address already in use", err, want)
	}
	if code := exitStatus(err, &stderr); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if ctx.Err() != nil {
		t.Error("the worker waited for Redis before opening its HTTP address")
	}
}
