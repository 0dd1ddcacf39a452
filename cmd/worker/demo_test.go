package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemoRunsBesideTakenPorts: with the configured HTTP address and
// embedded Redis address taken (another worker, another demo), the demo
// serves on free ports, says where, and runs to its end instead of exiting
// at once.
func TestDemoRunsBesideTakenPorts(t *testing.T) {
	var taken [2]string
	for i := range taken {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		taken[i] = ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "demo.yaml")
	yaml := "redis: {url: embedded, embedded_addr: \"" + taken[1] + "\"}\nworker: {http_addr: \"" + taken[0] + "\"}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr lockedBuffer // the demo prints from the handlers' goroutines too
	if err := run(ctx, []string{"-config", path, "-demo", "1s"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	out := stdout.String()
	for i, what := range []string{"serving /healthz, /metrics and the dashboard on 127.0.0.1:", "the embedded Redis listens on 127.0.0.1:"} {
		if !strings.Contains(out, "demo: "+taken[i]+" is taken: "+what) {
			t.Errorf("the demo did not say where it went instead of %s (%s...):\n%s", taken[i], what, out)
		}
	}
	if !strings.Contains(out, "demo: dashboard at http://127.0.0.1:") || strings.Contains(out, "dashboard at http://"+taken[0]) {
		t.Errorf("the demo's dashboard line does not name its new address:\n%s", out)
	}
	if !strings.Contains(out, "Each recipient's sends") {
		t.Errorf("the demo did not run to its end:\n%s", out)
	}
}
