// Package redistest starts real redis-server processes for tests: a
// server (Start) or a Redis Cluster (StartCluster), optionally with ACL
// users and TLS (StartWith, StartClusterWith), each on a free loopback port
// with its files in a test temp dir, stopped at cleanup.
package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	readyTimeout  = 10 * time.Second
	stopTimeout   = 5 * time.Second
	startAttempts = 5
	pollInterval  = 20 * time.Millisecond
)

// TB is the part of testing.TB the helpers need, so that TestMain can
// supply its own. Fatalf is expected not to return.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Binary returns the path of redis-server: the one in PATH, else in
// /usr/bin or /usr/local/bin. The error is a one-line install hint.
func Binary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("redistest: redis-server not found in PATH; install it (Debian/Ubuntu: apt-get install redis-server)")
}

// Server is one redis-server process on a loopback port.
type Server struct {
	Addr string // "127.0.0.1:PORT"
	Port int
	Dir  string    // holds redis.conf, redis.log and, for cluster nodes, nodes.conf
	TLS  *TLSFiles // with Options.TLS: the CA and certificates

	bin    string
	conf   string // absolute path of the generated config file
	sec    *security
	access access // how the helpers and Client log in
	id     string // cluster node ID; empty for standalone servers

	mu     sync.Mutex // guards proc and frozen; held while stopping so Stop waits
	proc   *proc      // nil when stopped
	frozen bool       // stopped with SIGSTOP (Freeze) until Thaw
}

// Start starts a redis-server without persistence and waits until it
// answers PING, or fails t with its log's tail. extra are more directives,
// "name value" ("requirepass secret").
func Start(t TB, extra ...string) *Server {
	t.Helper()
	return start(t, false, &security{opts: Options{Extra: extra}})
}

// start starts one server, standalone or a cluster node, as sec says.
func start(t TB, cluster bool, sec *security) *Server {
	t.Helper()
	if !cluster && !oneServerPerPackage(t) {
		return nil
	}
	bin, err := Binary()
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	dir, err := filepath.Abs(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: temp dir: %v", err)
		return nil
	}
	s := &Server{
		Dir:    dir,
		TLS:    sec.files,
		bin:    bin,
		conf:   filepath.Join(dir, confFile),
		sec:    sec,
		access: sec.access(passwordFrom(sec.opts.Extra)),
	}
	t.Cleanup(s.Stop)
	if err := s.startFresh(cluster); err != nil {
		t.Fatalf("%v\n%s", err, logTail(s.Dir, tailLines))
		return nil
	}
	return s
}

// startFresh picks a port, writes the config and launches the server, on
// another port if that one turns out to be taken.
func (s *Server) startFresh(cluster bool) error {
	var err error
	for range startAttempts {
		port, perr := freePort(cluster)
		if perr != nil {
			return perr
		}
		s.Port = port
		s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		if err = writeConfig(s.conf, s.Dir, port, cluster, s.sec); err != nil {
			return err
		}
		removeLogs(s.Dir)
		var taken bool
		if taken, err = s.launch(); !taken {
			return err
		}
	}
	return fmt.Errorf("%w (gave up after %d ports)", err, startAttempts)
}

// launch spawns the process and waits for PING. On failure it kills the
// process and reports whether someone else had the port.
func (s *Server) launch() (portTaken bool, err error) {
	p, err := spawn(s.bin, s.conf, s.Dir)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err = waitReady(s.Addr, s.conf, s.access, p); err == nil {
		return false, nil
	}
	s.Kill()
	taken := errors.Is(err, errWrongServer) || strings.Contains(logTail(s.Dir, tailLines), "Address already in use")
	return taken, err
}

// Client returns a client of the server, closed at cleanup: as AdminUser
// on a server with ACL users, else with a "requirepass" extra line's
// password, over TLS to a TLS server, with the client certificate.
func (s *Server) Client(t TB) *redis.Client {
	t.Helper()
	return s.ClientOn(t, 0)
}

// ClientOn is Client on database db.
func (s *Server) ClientOn(t TB, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:      s.Addr,
		Username:  s.access.user,
		Password:  s.access.password,
		DB:        db,
		TLSConfig: s.access.tls.Clone(),
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop sends SIGTERM, then SIGKILL after stopTimeout, and waits for the
// process. It may be called more than once.
func (s *Server) Stop() { s.halt(stopTimeout) }

// Kill sends SIGKILL and waits for the process to exit (for fault tests).
func (s *Server) Kill() { s.halt(0) }

func (s *Server) halt(grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(grace)
		s.proc = nil
	}
	s.frozen = false
}

// Restart stops the process if it runs and starts it again, with the same
// port, dir and config, waiting for PING.
func (s *Server) Restart(t TB) {
	t.Helper()
	s.Stop()
	if _, err := s.launch(); err != nil {
		t.Fatalf("%v\n%s", err, logTail(s.Dir, tailLines))
	}
}

// Running reports whether the process is running (not stopped or killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.done:
		return false
	default:
		return true
	}
}

// passwordFrom returns the value of the last "requirepass" directive.
func passwordFrom(extra []string) string {
	var pw string
	for _, line := range extra {
		f := strings.Fields(line)
		if len(f) == 2 && strings.EqualFold(f[0], "requirepass") {
			pw = strings.Trim(f[1], `"'`)
		}
	}
	return pw
}
