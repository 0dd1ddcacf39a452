//go:build integration

package integration_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/internal/redistest"
	"github.com/notify-throttle/throttler/lifecycle"
)

// The secrets of TestSecretsNeverLeave, each distinctive enough that a
// match anywhere is a leak.
const (
	secretAuth     = "Bearer auth-SECRET-1f9c" // a header, from the environment
	secretKey      = "key-SECRET-77ab"         // a header, from a file
	secretURLPass  = "urlpass-SECRET-4d2e"     // the webhook URL's password
	secretDownPass = "downpass-SECRET-9b31"    // the password of a webhook that is down
	secretRedis    = "redis-SECRET-c0de"       // the Redis password, from a file
	secretUnused   = "unused-SECRET-5e5e"      // a variable a missing reference sits beside
	secretCallback = "callback-SECRET-7c1d"    // the status callback's signing secret, from the environment
)

var secrets = []string{secretAuth, secretKey, secretURLPass, secretDownPass, secretRedis, secretUnused, secretCallback}

// headerHook records the credentials of every request it gets.
type headerHook struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []http.Header
}

func newHeaderHook(t *testing.T) *headerHook {
	h := &headerHook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.got = append(h.got, r.Header.Clone())
		h.mu.Unlock()
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *headerHook) requests() []http.Header {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// secretsSetup is a Redis with a password, a webhook and a config that
// takes every secret from the environment or a file.
type secretsSetup struct {
	dir       string
	redis     *redistest.Server
	hook      *headerHook
	callbacks *headerHook // the default tenant's status callback
	config    string
	env       []string // the variables the config references
}

func newSecretsSetup(t *testing.T) *secretsSetup {
	t.Helper()
	s := &secretsSetup{dir: t.TempDir(), hook: newHeaderHook(t), callbacks: newHeaderHook(t)}
	s.redis = redistest.StartWith(t, redistest.Options{Users: []string{"app on >" + secretRedis + " ~* &* +@all"}})
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("redis-password", secretRedis+"\n")
	write("api-key", secretKey+"\n")
	hookURL := strings.Replace(s.hook.srv.URL, "http://", "http://hookuser:"+secretURLPass+"@", 1) + "/send"
	down := freeAddr(t) // nothing listens there: sends to it fail
	write("config.yaml", fmt.Sprintf(`redis:
  url: redis://%s/0
  username: app
  password: {file: redis-password}
worker:
  concurrency: 4
  queues: {default: 1}
  http_addr: %s
  jitter: 0s
policies:
  open: [{limit: 100, per: 1h}]
providers:
  hook:
    type: webhook
    url: {env: HOOK_URL}
    headers:
      X-Auth-Token: {env: HOOK_AUTH}
      X-Api-Key: {file: api-key}
    rate: 100
    burst: 10
  down:
    type: webhook
    url: http://downuser:%s@%s/send
    headers: {Authorization: {env: HOOK_AUTH}}
    timeout: 1s
    rate: 100
    burst: 10
defaults: {policy: open, provider: hook, queue: default}
events:
  callbacks:
    "": {url: %s/events, secret: {env: CALLBACK_SECRET}}
`, s.redis.Addr, freeAddr(t), secretDownPass, down, s.callbacks.srv.URL))
	s.config = filepath.Join(s.dir, "config.yaml")
	s.env = []string{"HOOK_URL=" + hookURL, "HOOK_AUTH=" + secretAuth, "UNRELATED=" + secretUnused, "CALLBACK_SECRET=" + secretCallback}
	return s
}

// run runs a binary to completion with the setup's variables added to the
// environment, or replaced by env when it is not nil.
func (s *secretsSetup) run(t *testing.T, env []string, stdin string, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	if env == nil {
		env = s.env
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = s.dir
	cmd.Env = append(childEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: still running after a minute", filepath.Base(bin), strings.Join(args, " "))
	}
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestSecretsNeverLeave runs the worker and enqueue binaries on a config
// whose secrets come from the environment and files: the webhook sees
// them in its request headers and URL, and no output of the run shows any
// of them: not the worker's logs (a provider that is down included), not
// enqueue's or -check's output, not /metrics or the dashboard, not a byte
// stored in Redis (task payloads and their last errors).
func TestSecretsNeverLeave(t *testing.T) {
	s := newSecretsSetup(t)
	worker, enqueue := buildBinary(t, "worker"), buildBinary(t, "enqueue")
	var outputs []string // every output, to grep at the end
	show := func(what, out string) { outputs = append(outputs, what+":\n"+out) }

	out, errOut, code := s.run(t, nil, "", worker, "-check", "-connect", "-config", "config.yaml")
	show("worker -check -connect stdout", out)
	show("worker -check -connect stderr", errOut)
	if code != 0 || !strings.Contains(out, "config.yaml: ok: 1 policy, 2 providers, 0 campaigns\n") ||
		!strings.Contains(out, "config.yaml: redis: ok: redis://"+s.redis.Addr+"/0, user app: Redis ") {
		t.Fatalf("worker -check -connect: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	metrics := freeAddrOf(t, s.config)
	cmd := exec.Command(worker, "-config", "config.yaml")
	cmd.Dir, cmd.Env = s.dir, append(childEnv(), s.env...)
	var wout, werr syncBuffer
	cmd.Stdout, cmd.Stderr = &wout, &werr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // our own child, by its handle; a no-op once it exited
		<-done
	})

	lines := `{"recipient":"a@example.com","template":"t","idempotency_key":"s1"}` + "\n" +
		`{"recipient":"b@example.com","template":"t","provider":"down","idempotency_key":"s2"}` + "\n"
	out, errOut, code = s.run(t, nil, lines, enqueue, "-config", "config.yaml", "-file", "-")
	show("enqueue stdout", out)
	show("enqueue stderr", errOut)
	if code != 0 {
		t.Fatalf("enqueue: exit %d\n%s%s", code, out, errOut)
	}

	// The hook gets the message with every credential; the send to the
	// provider that is down fails and waits for a retry.
	rdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, Username: "app", Password: secretRedis})
	defer rdb.Close()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(30 * time.Second)
	for {
		retry, _ := insp.ListRetryTasks("default")
		if len(s.hook.requests()) > 0 && len(retry) > 0 && retry[0].LastErr != "" && len(s.callbacks.requests()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d requests at the hook, retry tasks %v\nworker:\n%s", len(s.hook.requests()), retry, werr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	h := s.hook.requests()[0]
	if user, pass, _ := (&http.Request{Header: h}).BasicAuth(); user != "hookuser" || pass != secretURLPass {
		t.Errorf("basic auth %q, %q; want the URL's user and password", user, pass)
	}
	if got := h.Get("X-Auth-Token"); got != secretAuth {
		t.Errorf("X-Auth-Token = %q, want the variable's secret", got)
	}
	if got := h.Get("X-Api-Key"); got != secretKey {
		t.Errorf("X-Api-Key = %q, want the file's secret", got)
	}
	if sig := s.callbacks.requests()[0].Get(lifecycle.SignatureHeader); !strings.HasPrefix(sig, "t=") || !strings.Contains(sig, ",v1=") {
		t.Errorf("a callback signed %q, want t=...,v1=... with the variable's secret", sig)
	}

	// What the worker serves: metrics, and the dashboard's pages and API.
	for _, page := range []string{"/metrics", "/throttle", "/throttle/api/providers", "/throttle/api/policies",
		"/throttle/api/recipients/b@example.com", "/throttle/api/campaigns"} {
		resp, err := http.Get("http://" + metrics + page)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d, %v", page, resp.StatusCode, err)
		}
		show(page, string(body))
	}

	show("redis", dumpRedis(t, rdb))

	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
		done <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("worker still running 30s after SIGINT")
	}
	show("worker stdout", wout.String())
	show("worker stderr", werr.String())
	if !strings.Contains(werr.String(), "job failed") || !strings.Contains(werr.String(), "downuser") {
		t.Errorf("the worker logged no failed send to the provider that is down:\n%s", werr.String())
	}
	for _, o := range outputs {
		for _, secret := range secrets {
			if strings.Contains(o, secret) {
				t.Errorf("a secret (%q) shows in %s", secret, o)
			}
		}
	}
}

// TestMissingSecretStopsTheWorker starts the worker and -check with one
// referenced variable unset: both fail naming the provider, the header and
// the variable, and show none of the secrets that did resolve.
func TestMissingSecretStopsTheWorker(t *testing.T) {
	s := newSecretsSetup(t)
	worker := buildBinary(t, "worker")
	env := []string{"HOOK_URL=http://u:" + secretURLPass + "@127.0.0.1:1/send", "UNRELATED=" + secretUnused, "CALLBACK_SECRET=" + secretCallback}
	want := "config.yaml:17: providers.hook.headers.X-Auth-Token: environment variable HOOK_AUTH is not set or empty\n" +
		"config.yaml:24: providers.down.headers.Authorization: environment variable HOOK_AUTH is not set or empty\n"
	for _, args := range [][]string{{"-config", "config.yaml"}, {"-check", "-config", "config.yaml"}, {"-check", "-connect", "-config", "config.yaml"}} {
		out, errOut, code := s.run(t, env, "", worker, args...)
		prefix := "worker: "
		if args[0] == "-check" {
			prefix = ""
		}
		if code != 1 || out != "" || errOut != prefix+want {
			t.Errorf("worker %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 and stderr:\n%s%s", strings.Join(args, " "), code, out, errOut, prefix, want)
		}
		for _, secret := range secrets {
			if strings.Contains(out+errOut, secret) {
				t.Errorf("worker %s shows a secret: %s", strings.Join(args, " "), errOut)
			}
		}
	}
	if err := os.Remove(filepath.Join(s.dir, "api-key")); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := s.run(t, nil, "", worker, "-check", "-config", "config.yaml")
	want = `config.yaml:18: providers.hook.headers.X-Api-Key: cannot read "api-key": no such file or directory` + "\n"
	if code != 1 || errOut != want {
		t.Errorf("worker -check without the key file: exit %d, stderr:\n%s\nwant:\n%s", code, errOut, want)
	}
}

// TestCheck runs worker -check on the repository's config.yaml and on
// every broken file of config/testdata: the summary and status 0, or
// status 1 and exactly the messages a start prints (without its "worker: ").
func TestCheck(t *testing.T) {
	bin := buildBinary(t, "worker")
	root := moduleRoot(t)
	stdout, stderr, code := runCommand(t, root, nil, bin, "-check")
	if want := "config.yaml: ok: 2 policies, 2 providers, 0 campaigns\n"; stdout != want || stderr != "" || code != 0 {
		t.Errorf("worker -check: exit %d, stdout %q, stderr %q; want 0 and %q", code, stdout, stderr, want)
	}
	dir := filepath.Join(root, "config")
	files, err := filepath.Glob(filepath.Join(dir, "testdata", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		name := filepath.Join("testdata", filepath.Base(f))
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, started, startCode := runCommand(t, dir, nil, bin, "-config", name)
			out, checked, checkCode := runCommand(t, dir, nil, bin, "-check", "-config", name)
			if checkCode != 1 || startCode != 1 || out != "" || "worker: "+checked != started || !strings.HasPrefix(checked, name+":") {
				t.Errorf("worker -check -config %s: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and what a start printed (exit %d):\n%s",
					name, checkCode, out, checked, startCode, started)
			}
		})
	}
}

// TestCheckConnect runs worker -check -connect against a server with a
// login and TLS, a cluster, and a server that has stopped.
func TestCheckConnect(t *testing.T) {
	bin := buildBinary(t, "worker")
	dir := t.TempDir()
	write := func(name, yaml string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const pw = "connect-SECRET-31"
	tlsServer := redistest.StartWith(t, redistest.Options{TLS: true, Users: []string{"app on >" + pw + " ~* &* +@all"}})
	write("tls.yaml", fmt.Sprintf("redis:\n  url: rediss://%s/0\n  username: app\n  password: {env: PW}\n  tls: {ca_file: %s}\n", tlsServer.Addr, tlsServer.TLS.CAFile))
	cluster := redistest.StartCluster(t, 3, 0)
	write("cluster.yaml", fmt.Sprintf("redis:\n  cluster: [%s]\n", strings.Join(cluster.Addrs(), ", ")))
	stopped := redistest.Start(t)
	write("stopped.yaml", fmt.Sprintf("redis:\n  url: redis://%s/0\n", stopped.Addr))
	stopped.Stop()

	env := append(childEnv(), "PW="+pw)
	tests := []struct {
		file       string
		code       int
		want       string // on stdout, or stderr when code is 1
		wantStdout string
	}{
		{"tls.yaml", 0, "tls.yaml: redis: ok: rediss://" + tlsServer.Addr + "/0, user app: Redis ", ""},
		{"cluster.yaml", 0, "cluster of 3 masters and 0 replicas serving 16384 of 16384 slots, user default\n", ""},
		{"stopped.yaml", 1, "stopped.yaml: redis: config: connect to redis redis://" + stopped.Addr + "/0: ", "stopped.yaml: ok: 0 policies, 0 providers, 0 campaigns\n"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cmd := exec.Command(bin, "-check", "-connect", "-config", tt.file)
			cmd.Dir, cmd.Env = dir, env
			var out, errb syncBuffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			got := out.String()
			if tt.code != 0 {
				got = errb.String()
			}
			wantLines := [2]int{2, 0} // on stdout and stderr: the summary and the report
			if tt.code != 0 {
				wantLines = [2]int{1, 1} // the summary and the connect error
			}
			lines := [2]int{strings.Count(out.String(), "\n"), strings.Count(errb.String(), "\n")}
			if code != tt.code || !strings.Contains(got, tt.want) || lines != wantLines ||
				(tt.wantStdout != "" && out.String() != tt.wantStdout) ||
				strings.Contains(out.String()+errb.String(), pw) {
				t.Errorf("worker -check -connect -config %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit %d and %q",
					tt.file, code, out.String(), errb.String(), tt.code, tt.want)
			}
		})
	}
}

// freeAddrOf returns the http_addr of the config at path.
func freeAddrOf(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "http_addr: "); ok {
			if _, _, err := net.SplitHostPort(v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("no http_addr in %s", path)
	return ""
}

// dumpRedis returns every key of rdb and its value, whatever its type.
func dumpRedis(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "list":
			v = rdb.LRange(ctx, k, 0, -1).Val()
		case "set":
			v = rdb.SMembers(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		default:
			v = rdb.Dump(ctx, k).Val()
		}
		fmt.Fprintf(&b, "%s (%s): %v\n", k, typ, v)
	}
	if len(keys) == 0 {
		t.Error("Redis holds no keys: nothing was checked")
	}
	return b.String()
}
