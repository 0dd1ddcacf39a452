package config

import "github.com/notify-throttle/throttler/internal/redisconn"

// Secret returns the dashboard's password or token from getenv, or "" when
// it needs none; a variable missing or empty is an error naming it.
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
	if c.src.has("worker.metrics_addr") {
		w = append(w, c.src.errorAt("worker.metrics_addr", "deprecated: it serves more than metrics now; rename it to http_addr (same meaning)").Error())
	}
	if c.Worker.openDashboard() { // only with insecure_no_auth, else Validate fails
		w = append(w, "worker.dashboard.insecure_no_auth is true: the dashboard on "+c.Worker.HTTPAddr+
			" shows recipients and queues to anyone who reaches it; set worker.dashboard.auth instead")
	}
	return w
}

// openDashboard reports whether the dashboard is served without auth off loopback.
func (w Worker) openDashboard() bool {
	d := w.Dashboard
	return d.Enabled && d.Auth == "" && w.HTTPAddr != "" && !redisconn.Loopback(w.HTTPAddr)
}
