package config

import (
	"net"
	"regexp"

	"gopkg.in/yaml.v3"
)

// Dashboard auth kinds.
const (
	// DashboardBasic asks for a user name and password (HTTP basic auth).
	DashboardBasic = "basic"
	// DashboardBearer asks for "Authorization: Bearer <token>".
	DashboardBearer = "bearer"
)

// DefaultDashboardSecretEnv is the environment variable that holds the
// dashboard's password or token unless worker.dashboard.secret_env names
// another.
const DefaultDashboardSecretEnv = "THROTTLER_DASHBOARD_SECRET"

// Dashboard says who may open the dashboard (the throttle view at /throttle
// and asynq's dashboard at /monitoring/, on Worker.HTTPAddr) and what it may
// do. /healthz and /metrics stay open whatever it says.
type Dashboard struct {
	// Enabled serves the dashboard. Default true.
	Enabled bool
	// Actions lets the asynq dashboard change things (run, delete, archive
	// tasks; pause queues); without it, it only shows them. Default false.
	Actions bool
	// Auth is "" (none), DashboardBasic or DashboardBearer. Without auth the
	// address must be a loopback one, unless InsecureNoAuth. Default "".
	Auth string
	// Username is the basic-auth user name. Required for basic auth.
	Username string
	// SecretEnv names the environment variable holding the password
	// (basic) or the token (bearer): never the file. Default
	// DefaultDashboardSecretEnv.
	SecretEnv string
	// InsecureNoAuth serves the dashboard without auth on an address that
	// is not loopback: anyone who reaches it sees recipients and queues.
	// Warnings says so. Default false.
	InsecureNoAuth bool
}

// Secret returns the dashboard's password or token from the environment
// (getenv: os.Getenv), or "" when it needs none. A missing or empty
// variable is an error naming it.
func (d Dashboard) Secret(getenv func(string) string) (string, error) {
	if d.Auth == "" || !d.Enabled {
		return "", nil
	}
	s := getenv(d.SecretEnv)
	if s == "" {
		return "", &Error{Path: "worker.dashboard.auth", Msg: "is " + d.Auth + ", but the environment variable " +
			d.SecretEnv + " that holds its secret is not set or empty"}
	}
	return s, nil
}

// Warnings returns what a program should log at start about the file: the
// old names it uses and settings that weaken security.
func (c *Config) Warnings() []string {
	var w []string
	if c.Worker.addrKey == "metrics_addr" {
		w = append(w, c.src.errorAt("worker.metrics_addr", "deprecated: it serves more than metrics now; rename it to http_addr (same meaning)").Error())
	}
	if d := c.Worker.Dashboard; d.Enabled && d.Auth == "" && c.Worker.HTTPAddr != "" && !loopbackAddr(c.Worker.HTTPAddr) {
		w = append(w, "worker.dashboard.insecure_no_auth is true: the dashboard on "+c.Worker.HTTPAddr+
			" shows recipients and queues to anyone who reaches it; set worker.dashboard.auth instead")
	}
	return w
}

// httpAddr decodes worker.http_addr or its old name; "key:" with nothing is
// off, like "".
func (d *decoder) httpAddr(w *Worker, key string) func(*yaml.Node, string) {
	return func(n *yaml.Node, p string) {
		if w.addrKey != "" {
			d.fail(n, p, "the old name of worker.http_addr: give only http_addr")
			return
		}
		w.addrKey = key
		if isNull(resolve(n)) {
			w.HTTPAddr = ""
			return
		}
		d.setString(&w.HTTPAddr)(n, p)
	}
}

func (d *decoder) dashboard(n *yaml.Node, path string, db *Dashboard) {
	d.mapping(n, path, []field{
		{"enabled", d.setBool(&db.Enabled)},
		{"actions", d.setBool(&db.Actions)},
		{"auth", d.setString(&db.Auth)},
		{"username", d.setString(&db.Username)},
		{"secret_env", d.setString(&db.SecretEnv)},
		{"insecure_no_auth", d.setBool(&db.InsecureNoAuth)},
	})
}

func (d *decoder) setBool(p *bool) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		n = resolve(n)
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(p) != nil {
			d.fail(n, path, "must be true or false (got %s)", describe(n))
		}
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// httpAddr checks worker.http_addr (under the name the file gave it) and
// that a dashboard off loopback has auth or says it needs none.
func (v *validator) httpAddr() {
	w := v.c.Worker
	key := "worker." + w.addrKey
	if w.addrKey == "" {
		key = "worker.http_addr"
	}
	if w.HTTPAddr != "" && !validAddr(w.HTTPAddr) {
		what := "the HTTP server"
		if w.addrKey == "metrics_addr" {
			what = "metrics"
		}
		v.failf(key, `must be host:port, or "" to turn %s off (got %s)`, what, quote(w.HTTPAddr))
		return
	}
	db := w.Dashboard
	switch db.Auth {
	case "", DashboardBasic, DashboardBearer:
	default:
		v.failf("worker.dashboard.auth", `must be %s or %s, or "" for none (got %s)`, DashboardBasic, DashboardBearer, quote(db.Auth))
		return
	}
	switch {
	case db.Auth == DashboardBasic && db.Username == "":
		v.failf("worker.dashboard.username", "required for basic auth")
	case db.Auth != DashboardBasic && db.Username != "":
		v.failf("worker.dashboard.username", "only for basic auth")
	}
	if !envName.MatchString(db.SecretEnv) {
		v.failf("worker.dashboard.secret_env", "must be an environment variable's name (got %s)", quote(db.SecretEnv))
	}
	if db.Enabled && db.Auth == "" && !db.InsecureNoAuth && w.HTTPAddr != "" && !loopbackAddr(w.HTTPAddr) {
		v.fail(key, []string{"worker.dashboard"}, "%s is not a loopback address, and the dashboard there would have no auth: "+
			"set worker.dashboard.auth (basic or bearer), or worker.dashboard.enabled: false, "+
			"or worker.dashboard.insecure_no_auth: true to serve it to anyone who reaches it", quote(w.HTTPAddr))
	}
}

// loopbackAddr reports whether host:port a listens on loopback only.
func loopbackAddr(a string) bool {
	host, _, err := net.SplitHostPort(a)
	return err == nil && isLoopback(host)
}
