//go:build integration

package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartWithACL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartWith(t, Options{Users: []string{"app on >app-pw ~app:* -@all +get +set +ping"}})
	if err := s.Client(t).Set(ctx, "other:k", "v", 0).Err(); err != nil {
		t.Fatalf("admin set: %v", err)
	}
	tests := []struct {
		name, user, password, key, wantErr string
	}{
		{"app on its keys", "app", "app-pw", "app:k", ""},
		{"app on other keys", "app", "app-pw", "other:k", "NOPERM"},
		{"wrong password", "app", "nope", "app:k", "WRONGPASS"},
		{"default user is off", "", "", "app:k", "NOAUTH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: tt.user, Password: tt.password, MaxRetries: -1})
			defer c.Close()
			err := c.Set(ctx, tt.key, "v", 0).Err()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("set %s as %q: %v, want %q", tt.key, tt.user, err, tt.wantErr)
			}
		})
	}
	if got, want := s.URL("app", "p@ss"), "redis://app:p%40ss@"+s.Addr; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	s.Restart(t) // the probe logs in as the admin again
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
}

func TestStartWithTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartWith(t, Options{TLS: true})
	if s.TLS == nil || !strings.HasPrefix(s.URL("", ""), "rediss://127.0.0.1:") {
		t.Fatalf("TLS = %+v, URL = %q", s.TLS, s.URL("", ""))
	}
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping over TLS: %v", err)
	}
	s.Restart(t) // the probe speaks TLS again
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.TLS.CAPEM)
	other, err := NewTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherPool := x509.NewCertPool()
	otherPool.AppendCertsFromPEM(other.CAPEM)
	tests := []struct {
		name    string
		tls     *tls.Config
		wantErr string
	}{
		{"CA trusted, no client certificate", &tls.Config{RootCAs: pool}, ""},
		{"by server name", &tls.Config{RootCAs: pool, ServerName: ServerName}, ""},
		{"wrong server name", &tls.Config{RootCAs: pool, ServerName: "db.example"}, "not db.example"},
		{"another CA", &tls.Config{RootCAs: otherPool}, "certificate signed by unknown authority"},
		{"plain TCP", nil, "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: tt.tls, MaxRetries: -1, ReadTimeout: time.Second})
			defer c.Close()
			err := c.Ping(ctx).Err()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("ping: %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestStartWithClientCerts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartWith(t, Options{TLS: true, ClientCerts: true, Users: []string{"app on >pw +ping"}})
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping with the client certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.TLS.CAPEM)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "app", Password: "pw",
		TLSConfig: &tls.Config{RootCAs: pool}, MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping without a client certificate answered")
	}
	if msg := fatalMessage(t, func(tb TB) { StartWith(tb, Options{ClientCerts: true}) }); !strings.Contains(msg, "needs Options.TLS") {
		t.Errorf("ClientCerts without TLS: %q", msg)
	}
}

func TestClusterWithACLAndTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartClusterWith(t, 3, 1, Options{TLS: true, Users: []string{"app on >pw ~k:* -@all +get +set +cluster|slots +cluster|shards +ping"}})
	cc := c.Client(t)
	setKeys(ctx, t, cc, 20)
	cfg, err := c.Masters[0].TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	app := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Username: "app", Password: "pw", TLSConfig: cfg})
	defer app.Close()
	for _, key := range []string{"k:a", "k:b", "k:c", "k:d"} {
		if err := app.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("app set %s: %v", key, err)
		}
	}
	if err := app.Get(ctx, "key:1").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("app get key:1: %v, want NOPERM", err)
	}
}
