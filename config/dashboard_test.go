package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestHTTPAddrAndDashboard checks the HTTP address under both its names and
// the dashboard's settings: what loads, and the exact message of each
// mistake.
func TestHTTPAddrAndDashboard(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // the error; "" when the file loads
		addr string // HTTPAddr when it loads
		warn []string
	}{
		{name: "http_addr", yaml: "worker:\n  http_addr: 127.0.0.1:9000\n", addr: "127.0.0.1:9000"},
		{name: "metrics_addr still works, deprecated", yaml: "worker:\n  metrics_addr: 127.0.0.1:9000\n", addr: "127.0.0.1:9000",
			warn: []string{"c.yaml:2: worker.metrics_addr: deprecated: it serves more than metrics now; rename it to http_addr (same meaning)"}},
		{name: "http_addr empty turns it off", yaml: "worker:\n  http_addr:\n", addr: ""},
		{name: "both names", yaml: "worker:\n  http_addr: 127.0.0.1:9000\n  metrics_addr: 127.0.0.1:9001\n",
			want: "c.yaml:3: worker.metrics_addr: the old name of worker.http_addr: give only http_addr"},
		{name: "bad http_addr", yaml: "worker:\n  http_addr: localhost\n",
			want: `c.yaml:2: worker.http_addr: must be host:port, or "" to turn the HTTP server off (got "localhost")`},
		{name: "bad metrics_addr keeps its message", yaml: "worker:\n  metrics_addr: localhost\n",
			want: `c.yaml:2: worker.metrics_addr: must be host:port, or "" to turn metrics off (got "localhost")`},
		{name: "public without auth", yaml: "worker:\n  http_addr: 0.0.0.0:9464\n",
			want: `c.yaml:2: worker.http_addr: "0.0.0.0:9464" is not a loopback address, and the dashboard there would have no auth: ` +
				`set worker.dashboard.auth (basic or bearer), or worker.dashboard.enabled: false, ` +
				`or worker.dashboard.insecure_no_auth: true to serve it to anyone who reaches it`},
		{name: "all interfaces without auth", yaml: "worker:\n  metrics_addr: :9464\n",
			want: `c.yaml:2: worker.metrics_addr: ":9464" is not a loopback address, and the dashboard there would have no auth: ` +
				`set worker.dashboard.auth (basic or bearer), or worker.dashboard.enabled: false, ` +
				`or worker.dashboard.insecure_no_auth: true to serve it to anyone who reaches it`},
		{name: "public with bearer", yaml: "worker:\n  http_addr: 0.0.0.0:9464\n  dashboard: {auth: bearer}\n", addr: "0.0.0.0:9464"},
		{name: "public with basic", yaml: "worker:\n  http_addr: 0.0.0.0:9464\n  dashboard: {auth: basic, username: ops}\n", addr: "0.0.0.0:9464"},
		{name: "public without dashboard", yaml: "worker:\n  http_addr: 0.0.0.0:9464\n  dashboard: {enabled: false}\n", addr: "0.0.0.0:9464"},
		{name: "public, explicitly open", yaml: "worker:\n  http_addr: 0.0.0.0:9464\n  dashboard: {insecure_no_auth: true}\n", addr: "0.0.0.0:9464",
			warn: []string{"worker.dashboard.insecure_no_auth is true: the dashboard on 0.0.0.0:9464 shows recipients and queues to anyone who reaches it; set worker.dashboard.auth instead"}},
		{name: "unknown auth", yaml: "worker:\n  dashboard: {auth: digest}\n",
			want: `c.yaml:2: worker.dashboard.auth: must be basic or bearer, or "" for none (got "digest")`},
		{name: "basic without user", yaml: "worker:\n  dashboard:\n    auth: basic\n",
			want: `c.yaml:3: worker.dashboard.username: required for basic auth`},
		{name: "user without basic", yaml: "worker:\n  dashboard:\n    auth: bearer\n    username: ops\n",
			want: `c.yaml:4: worker.dashboard.username: only for basic auth`},
		{name: "bad secret_env", yaml: "worker:\n  dashboard:\n    secret_env: \"MY SECRET\"\n",
			want: `c.yaml:3: worker.dashboard.secret_env: must be an environment variable's name (got "MY SECRET")`},
		{name: "actions not bool", yaml: "worker:\n  dashboard:\n    actions: yes please\n",
			want: `c.yaml:3: worker.dashboard.actions: must be true or false (got "yes please")`},
		{name: "unknown dashboard key", yaml: "worker:\n  dashboard:\n    readonly: true\n",
			want: `c.yaml:3: worker.dashboard.readonly: unknown key (known: enabled, actions, auth, username, secret_env, insecure_no_auth)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("c.yaml", []byte(tt.yaml))
			if tt.want != "" {
				if err == nil || err.Error() != tt.want {
					t.Fatalf("error:\n got %v\nwant %s", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Worker.HTTPAddr != tt.addr {
				t.Errorf("HTTPAddr = %q, want %q", c.Worker.HTTPAddr, tt.addr)
			}
			if got := c.Warnings(); !reflect.DeepEqual(got, tt.warn) {
				t.Errorf("Warnings() (-want +got):\n-%q\n+%q", tt.warn, got)
			}
		})
	}
}

func TestDashboardSecret(t *testing.T) {
	parse := func(yaml string) Dashboard {
		t.Helper()
		c, err := Parse("c.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return c.Worker.Dashboard
	}
	none := parse("worker:\n  concurrency: 1\n")
	if s, err := none.Secret(env(nil)); s != "" || err != nil {
		t.Errorf("no auth: Secret() = %q, %v; want none", s, err)
	}
	bearer := parse("worker:\n  dashboard: {auth: bearer, secret_env: OPS_TOKEN}\n")
	if s, err := bearer.Secret(env(map[string]string{"OPS_TOKEN": "t0ken"})); s != "t0ken" || err != nil {
		t.Errorf("bearer: Secret() = %q, %v; want t0ken", s, err)
	}
	_, err := bearer.Secret(env(nil))
	want := "worker.dashboard.auth: is bearer, but the environment variable OPS_TOKEN that holds its secret is not set or empty"
	if err == nil || err.Error() != want {
		t.Errorf("bearer without its variable: %v, want %s", err, want)
	}
	basic := parse("worker:\n  dashboard: {auth: basic, username: ops}\n")
	if _, err := basic.Secret(env(nil)); err == nil || !strings.Contains(err.Error(), "THROTTLER_DASHBOARD_SECRET") {
		t.Errorf("basic without the default variable: %v, want it named", err)
	}
}
