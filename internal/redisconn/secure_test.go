//go:build integration

package redisconn_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/redisconn"
	"github.com/notify-throttle/throttler/internal/redistest"
)

// connectCase is one way of connecting and what should come of it: a PING
// that answers (wantErr "") or an error holding every wantErr part, and in
// no case a secret.
type connectCase struct {
	name    string
	redis   redisconn.Config
	wantErr []string
}

// runConnect runs the cases, checking errors and String for the secrets.
func runConnect(t *testing.T, tests []connectCase, secrets ...string) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rdb, closeRedis, err := redisconn.Connect(ctx, tt.redis)
			if err == nil {
				defer closeRedis()
			}
			noSecret(t, "String()", tt.redis.String(), secrets...)
			switch {
			case len(tt.wantErr) == 0 && err != nil:
				t.Fatalf("Connect: %v", err)
			case len(tt.wantErr) == 0:
				if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
					t.Errorf("SET after Connect: %v", err)
				}
			case err == nil:
				t.Fatalf("Connect succeeded, want an error with %q", tt.wantErr)
			default:
				t.Logf("Connect error: %v", err)
				for e := err; e != nil; e = errors.Unwrap(e) {
					noSecret(t, "Connect error or its cause", e.Error(), secrets...)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Connect error lacks %q:\n%v", w, err)
					}
				}
			}
		})
	}
}

// noSecret fails the test if s shows any of the secrets, escaped or not.
func noSecret(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, secret := range secrets {
		for _, form := range []string{secret, url.PathEscape(secret), url.QueryEscape(secret)} {
			if strings.Contains(s, form) {
				t.Errorf("%s shows the password %q: %s", what, secret, s)
			}
		}
	}
}

func writeSecret(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "redis-password")
	writeFile(t, path, content)
	return path
}

// TestConnectACLUser logs in to a server whose default user is off, every
// way the config allows, and with wrong or missing passwords.
func TestConnectACLUser(t *testing.T) {
	t.Parallel()
	const (
		pw  = "app-Pa55word"
		odd = "p@ss:w/rd%41?&=x" // needs escaping in a URL
	)
	s := redistest.StartWith(t, redistest.Options{Users: []string{
		"app on >" + pw + " ~* &* +@all",
		"odd on >" + odd + " ~* &* +@all",
	}})
	base := func(url, user, password, file string) redisconn.Config {
		r := redisconn.Config{URL: redisconn.Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: "throttle:"}
		r.URL, r.Username, r.Password, r.PasswordFile = url, user, password, file
		return r
	}
	runConnect(t, []connectCase{
		{"user and password in the URL", base(s.URL("app", pw), "", "", ""), nil},
		{"password in the URL, escaped", base(s.URL("odd", odd), "", "", ""), nil},
		{"username and password settings", base(s.URL("", ""), "odd", odd, ""), nil},
		{"user in the URL, password setting", base(s.URL("", "")[:len("redis://")]+"app@"+s.Addr, "", pw, ""), nil},
		{"password file", base(s.URL("", ""), "app", "", writeSecret(t, pw+"\n")), nil},
		{"password file, CRLF", base(s.URL("", ""), "app", "", writeSecret(t, pw+"\r\n")), nil},
		{"wrong password in the URL", base(s.URL("app", "wrong-"+pw), "", "", ""),
			[]string{"config: connect to redis redis://app:xxxxx@" + s.Addr, "WRONGPASS", "(the user or password is wrong, or the user is disabled)"}},
		{"wrong password setting", base(s.URL("", ""), "app", "wrong-"+pw, ""),
			[]string{"config: connect to redis redis://" + s.Addr + ", user app", "WRONGPASS"}},
		{"wrong user", base(s.URL("", ""), "nobody", pw, ""), []string{"WRONGPASS"}},
		{"no password", base(s.URL("", ""), "", "", ""), []string{"NOAUTH", "(the server wants a login: "}},
		{"password file missing", base(s.URL("", ""), "app", "", "/nonexistent/redis-password"),
			[]string{`config: redis.password_file: cannot read "/nonexistent/redis-password": no such file or directory`}},
		{"password file of two lines", base(s.URL("", ""), "app", "", writeSecret(t, pw+"\n"+pw+"\n")),
			[]string{"holds more than one line"}},
	}, pw, odd, "wrong-"+pw)

	t.Run("REDIS_URL and REDIS_PASSWORD", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config.yaml")
		writeFile(t, path, "redis:\n  url: redis://elsewhere:6379\n  username: app\n  password_file: missing-file\n")
		c, err := config.LoadWithEnv(path, env(map[string]string{config.EnvRedisURL: s.URL("", ""), config.EnvRedisPassword: pw}))
		if err != nil {
			t.Fatalf("LoadWithEnv: %v", err)
		}
		ctx := context.Background()
		rdb, closeRedis, err := redisconn.Connect(ctx, c.Redis)
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		defer closeRedis()
		if who, err := rdb.Do(ctx, "acl", "whoami").Text(); err != nil || who != "app" {
			t.Errorf("ACL WHOAMI = %q, %v; want app", who, err)
		}
		noSecret(t, "%+v of the Config", fmt.Sprintf("%+v", c), pw)
		noSecret(t, "%#v of the Config", fmt.Sprintf("%#v", c), pw)
	})
}

// TestConnectTLS connects to a TLS-only server with its CA, without it,
// with another CA and by various names.
func TestConnectTLS(t *testing.T) {
	t.Parallel()
	s := redistest.StartWith(t, redistest.Options{TLS: true, Users: []string{"app on >tls-pw ~* &* +@all"}})
	other, err := redistest.NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	at := func(u string, tls redisconn.TLS) redisconn.Config {
		r := redisconn.Config{URL: redisconn.Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: "throttle:"}
		r.URL, r.TLS = u, tls
		return r
	}
	rediss := s.URL("app", "tls-pw")
	byName := strings.Replace(rediss, "127.0.0.1", "localhost", 1)
	runConnect(t, []connectCase{
		{"CA file", at(rediss, redisconn.TLS{CAFile: s.TLS.CAFile}), nil},
		{"CA file, host name", at(byName, redisconn.TLS{CAFile: s.TLS.CAFile}), nil},
		{"CA file, server name", at(rediss, redisconn.TLS{CAFile: s.TLS.CAFile, ServerName: redistest.ServerName}), nil},
		{"not verified", at(rediss, redisconn.TLS{InsecureSkipVerify: true}), nil},
		{"system CAs only", at(rediss, redisconn.TLS{}), []string{
			"config: connect to redis rediss://app:xxxxx@" + s.Addr,
			"certificate signed by unknown authority",
			"(its TLS certificate is not signed by a CA the client trusts: set redis.tls.ca_file to the CA that signed it)"}},
		{"another CA", at(rediss, redisconn.TLS{CAFile: other.CAFile}), []string{"certificate signed by unknown authority", "set redis.tls.ca_file"}},
		{"wrong server name", at(rediss, redisconn.TLS{CAFile: s.TLS.CAFile, ServerName: "db.example"}), []string{
			"not db.example",
			"(its TLS certificate is not valid for the name the client expects: set redis.tls.server_name to one it holds)"}},
		{"plain redis:// to a TLS port", at(strings.Replace(rediss, "rediss://", "redis://", 1), redisconn.TLS{}), []string{"config: connect to redis redis://app:xxxxx@",
			"(if the server speaks TLS only, use a rediss:// URL)"}},
		{"CA file not PEM", at(rediss, redisconn.TLS{CAFile: "../../config/testdata/tls_not_a_cert.pem"}),
			[]string{`config: redis.tls.ca_file: no PEM certificate in "../../config/testdata/tls_not_a_cert.pem"`}},
	}, "tls-pw")

	insecure := at(rediss, redisconn.TLS{InsecureSkipVerify: true})
	if got := insecure.String(); !strings.HasSuffix(got, ", TLS NOT VERIFIED") {
		t.Errorf("String() = %q, want it to end in a warning", got)
	}
	if w := insecure.Warnings(); len(w) != 1 || !strings.Contains(w[0], "insecure_skip_verify") {
		t.Errorf("Warnings() = %q", w)
	}
	if w := at(rediss, redisconn.TLS{CAFile: s.TLS.CAFile}).Warnings(); len(w) != 0 {
		t.Errorf("Warnings() of a verified connection = %q", w)
	}
}

// TestConnectClientCertificate connects to a server that requires a client
// certificate, with and without one.
func TestConnectClientCertificate(t *testing.T) {
	t.Parallel()
	s := redistest.StartWith(t, redistest.Options{TLS: true, ClientCerts: true})
	at := func(tls redisconn.TLS) redisconn.Config {
		r := redisconn.Config{URL: redisconn.Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: "throttle:"}
		r.URL, r.TLS = s.URL("", ""), tls
		return r
	}
	f := s.TLS
	runConnect(t, []connectCase{
		{"client certificate", at(redisconn.TLS{CAFile: f.CAFile, CertFile: f.ClientCertFile, KeyFile: f.ClientKeyFile}), nil},
		{"no client certificate", at(redisconn.TLS{CAFile: f.CAFile}), []string{"config: connect to redis rediss://" + s.Addr,
			"(the server wants a client certificate: set redis.tls.cert_file and key_file)"}},
		{"key of another certificate", at(redisconn.TLS{CAFile: f.CAFile, CertFile: f.ClientCertFile, KeyFile: f.KeyFile}),
			[]string{"config: redis.tls.cert_file: ", "are not a certificate and its key: private key does not match public key"}},
	})
	c := config.Default()
	c.Redis = at(redisconn.TLS{CAFile: f.CAFile, CertFile: f.ClientCertFile, KeyFile: f.ClientKeyFile})
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	c.Redis.TLS.KeyFile = f.KeyFile
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "redis.tls.cert_file: ") {
		t.Errorf("Validate with a mismatched key: %v", err)
	}
}

// TestConnectClusterLoginTLS connects to a cluster whose nodes require a
// login and speak TLS only.
func TestConnectClusterLoginTLS(t *testing.T) {
	t.Parallel()
	const pw = "cluster-Pa55"
	c := redistest.StartClusterWith(t, 3, 0, redistest.Options{TLS: true, Users: []string{"app on >" + pw + " ~* &* +@all"}})
	cluster := func(user, password string, tls redisconn.TLS) redisconn.Config {
		r := redisconn.Config{URL: redisconn.Embedded, EmbeddedAddr: redisconn.DefaultEmbeddedAddr, Prefix: "throttle:"}
		r.URL, r.Cluster, r.Username, r.Password, r.TLS = "", c.Addrs(), user, password, tls
		return r
	}
	ca := c.Masters[0].TLS.CAFile
	ok := cluster("app", pw, redisconn.TLS{Enabled: true, CAFile: ca})
	cfg := config.Default()
	cfg.Redis = ok
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	runConnect(t, []connectCase{
		{"login and CA", ok, nil},
		{"wrong password", cluster("app", "wrong-"+pw, redisconn.TLS{Enabled: true, CAFile: ca}),
			[]string{"config: connect to redis cluster " + strings.Join(c.Addrs(), ",") + ", user app, TLS", "WRONGPASS"}},
		{"no CA", cluster("app", pw, redisconn.TLS{Enabled: true}), []string{"certificate signed by unknown authority", "set redis.tls.ca_file"}},
		{"no TLS", cluster("app", pw, redisconn.TLS{}), []string{"config: connect to redis cluster ", "(if the server speaks TLS only, set redis.tls.enabled: true)"}},
		{"entry holding a password", func() redisconn.Config {
			r := cluster("", "", redisconn.TLS{Enabled: true, CAFile: ca})
			r.Cluster = []string{"app:" + pw + "@" + c.Addrs()[0]}
			return r
		}(), []string{"config: connect to redis cluster app:xxxxx@"}},
	}, pw, "wrong-"+pw)

	ctx := context.Background()
	rdb, closeRedis, err := redisconn.Connect(ctx, ok)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	for i := range 20 { // keys on every master
		if err := rdb.Set(ctx, fmt.Sprint("key:", i), i, 0).Err(); err != nil {
			t.Fatalf("SET key:%d: %v", i, err)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// env returns a getenv that knows only vars.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}
