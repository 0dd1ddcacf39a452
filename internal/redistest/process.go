package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	confFile   = "redis.conf"
	logFile    = "redis.log"
	outputFile = "output.log" // stdout and stderr, e.g. config errors before the log opens
	tailLines  = 20

	busOffset      = 10000 // cluster bus port = port + busOffset
	maxClusterPort = 55000 // keeps the bus port well below 65536
	probeTimeout   = 200 * time.Millisecond
)

// errWrongServer means a server answered on our port but it is not ours.
var errWrongServer = errors.New("another server answers on the port")

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // result of Wait; valid once done is closed
}

func spawn(bin, conf, dir string) (*proc, error) {
	out, err := os.OpenFile(filepath.Join(dir, outputFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("redistest: open output file: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(bin, conf)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after grace (at once if grace is 0), and
// waits for the process to exit.
func (p *proc) stop(grace time.Duration) {
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(grace):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exitError(addr string) error {
	if p.err != nil {
		return fmt.Errorf("redistest: redis-server on %s exited before answering PING: %w", addr, p.err)
	}
	return fmt.Errorf("redistest: redis-server on %s exited before answering PING", addr)
}

// waitReady polls PING until the process started with conf answers on addr.
func waitReady(addr, conf string, a access, p *proc) error {
	deadline := time.Now().Add(readyTimeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return p.exitError(addr)
		default:
		}
		if err = probe(addr, conf, a); err == nil {
			return nil
		}
		if errors.Is(err, errWrongServer) {
			return fmt.Errorf("redistest: %s: %w", addr, err)
		}
		time.Sleep(pollInterval)
	}
	return fmt.Errorf("redistest: redis-server on %s: no PING answer within %v: %w", addr, readyTimeout, err)
}

// probe checks with INFO server that the server on addr was started with
// our config file, not someone else's. It dials itself: go-redis logs every
// failed dial, and the server is polled before it listens.
func probe(addr, conf string, a access) error {
	d := &net.Dialer{Timeout: probeTimeout}
	var conn net.Conn
	var err error
	if a.tls != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, a.tls)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	c := redis.NewClient(&redis.Options{Username: a.user, Password: a.password, ReadTimeout: 5 * probeTimeout,
		MaxRetries: -1, PoolSize: 1, DisableIdentity: true,
		Dialer: func(context.Context, string, string) (net.Conn, error) { return conn, nil }})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "config_file:"+conf+"\r\n") {
		return errWrongServer
	}
	return nil
}

// writeConfig writes one server's redis.conf: every test server's
// settings, then sec's (later directives win).
func writeConfig(path, dir string, port int, cluster bool, sec *security) error {
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(port),
		`save ""`,
		"appendonly no",
		"dir " + quote(dir),
		"logfile " + quote(filepath.Join(dir, logFile)),
		"daemonize no",
		"repl-diskless-sync-delay 0", // default 5s would delay every replica sync
	}
	if cluster {
		lines = append(lines,
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			"cluster-node-timeout 2000",
			"cluster-require-full-coverage yes",
			"cluster-allow-replica-migration no",
			// A replica is listed in CLUSTER SLOTS only once its replication
			// offset is non-zero; with no writes that takes the first master
			// PING, sent every repl-ping-replica-period (default 10s).
			"repl-ping-replica-period 1",
		)
	}
	lines = append(lines, sec.lines(port, cluster)...)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("redistest: write config: %w", err)
	}
	return nil
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// freePort returns a loopback port free right now; for a cluster node, below
// maxClusterPort and with its bus port free too.
func freePort(cluster bool) (int, error) {
	for i := range 300 {
		want := 0 // first let the kernel choose, then try random ports
		if i >= 50 {
			want = 20000 + rand.IntN(maxClusterPort-20000)
		}
		port, err := listenFree(want)
		if err != nil && want == 0 {
			return 0, err
		}
		if err != nil || (cluster && port >= maxClusterPort) {
			continue
		}
		if !cluster {
			return port, nil
		}
		if _, err := listenFree(port + busOffset); err == nil {
			return port, nil
		}
	}
	return 0, errors.New("redistest: no free loopback port found")
}

func listenFree(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, fmt.Errorf("redistest: listen on loopback: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func removeLogs(dir string) {
	_ = os.Remove(filepath.Join(dir, logFile))
	_ = os.Remove(filepath.Join(dir, outputFile))
}

// logTail returns the last n lines of the log and of the captured output.
func logTail(dir string, n int) string {
	var b strings.Builder
	for _, name := range []string{logFile, outputFile} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(strings.TrimSpace(string(data))) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		lines = lines[max(0, len(lines)-n):]
		fmt.Fprintf(&b, "--- %s (last %d lines) ---\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
	if b.Len() == 0 {
		return "(no redis-server output)\n"
	}
	return b.String()
}
