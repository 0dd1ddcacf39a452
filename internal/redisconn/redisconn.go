// Package redisconn connects to the Redis a Config names (the config
// file's redis section): a URL or a cluster, with its login and TLS, or the
// embedded server of the worker's process. It checks those settings and
// hides the password in every message: docs/design.md#security-login-tls-acl-redaction.
package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Connect returns a client of the Redis r names, after a PING answered
// within ctx, and the function that closes it (after asynq's shutdown:
// asynq does not close a client it is given). A cluster's client follows
// failovers (failover.go); url: embedded connects to a worker's (Serve).
func Connect(ctx context.Context, r Config) (rdb redis.UniversalClient, close func() error, err error) {
	password, err := r.LoginPassword()
	if err != nil {
		return nil, nil, err
	}
	// DisableIdentity: no CLIENT SETINFO, which the least-privilege ACL
	// cannot name where Redis < 7.2 does not know it.
	switch {
	case len(r.Cluster) > 0:
		opts := &redis.ClusterOptions{Addrs: r.Cluster, Username: r.Username, Password: password, DisableIdentity: true,
			DialTimeout: clusterDialTimeout, DialerRetries: clusterDialRetries, ReadTimeout: clusterReadTimeout}
		if r.TLS.Enabled {
			if opts.TLSConfig, err = tlsConfig(r.TLS, &tls.Config{}); err != nil {
				return nil, nil, err
			}
		}
		cc := redis.NewClusterClient(opts)
		followFailovers(cc, ReloadGap)
		rdb = cc
	case r.IsEmbedded():
		rdb = redis.NewClient(&redis.Options{Addr: r.EmbeddedAddr, DisableIdentity: true})
	default:
		opts, err := ParseURL(r.URL)
		if err != nil {
			return nil, nil, fmt.Errorf("config: redis.url: %w", err)
		}
		opts.DisableIdentity = true
		if r.Username != "" {
			opts.Username = r.Username
		}
		if password != "" {
			opts.Password = password
		}
		if opts.TLSConfig != nil {
			if opts.TLSConfig, err = tlsConfig(r.TLS, opts.TLSConfig); err != nil {
				return nil, nil, err
			}
		}
		rdb = redis.NewClient(opts)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		text := scrub(r, err.Error(), password)
		cause := err
		if text != err.Error() {
			cause = nil // its text shows a secret
		}
		return nil, nil, &scrubbedError{msg: fmt.Sprintf("config: connect to redis %s%s: %s", r, hint(r, err), text), err: cause}
	}
	return rdb, sync.OnceValue(rdb.Close), nil
}

// Serve is Connect for the worker: with url: embedded it first starts the
// in-process server on r.EmbeddedAddr (an error if another process has
// it), which close stops, its data lost. ctx bounds the start.
func Serve(ctx context.Context, r Config) (rdb redis.UniversalClient, close func() error, err error) {
	if !r.IsEmbedded() {
		return Connect(ctx, r)
	}
	srv, err := startEmbedded(r.EmbeddedAddr)
	if err != nil {
		return nil, nil, err
	}
	rdb, closeClient, err := Connect(ctx, r)
	if err != nil {
		srv.close()
		return nil, nil, err
	}
	return rdb, sync.OnceValue(func() error {
		err := closeClient()
		srv.close()
		return err
	}), nil
}

// tlsConfig returns base completed with t's settings.
func tlsConfig(t TLS, base *tls.Config) (*tls.Config, error) {
	c := base.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	if t.CAFile != "" {
		c.RootCAs = x509.NewCertPool()
		if msg := AppendCAFile(c.RootCAs, t.CAFile); msg != "" {
			return nil, fmt.Errorf("config: redis.tls.ca_file: %s", msg)
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, msg := readKeyPair(t.CertFile, t.KeyFile)
		if msg != "" {
			return nil, fmt.Errorf("config: redis.tls.cert_file: %s", msg)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if t.ServerName != "" {
		c.ServerName = t.ServerName
	}
	c.InsecureSkipVerify = t.InsecureSkipVerify
	return c, nil
}

// scrubbedError is an error whose text had a password taken out; it wraps
// its cause unless the cause's own text shows it.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrub hides r's secrets in msg: the URL's, the password in use, and any
// a bad cluster entry holds.
func scrub(r Config, msg, password string) string {
	msg = Scrub(msg, r.URL)
	for _, a := range r.Cluster {
		msg = Scrub(msg, a)
	}
	for _, pw := range []string{password, r.Password} {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, Redacted)
		}
	}
	return msg
}

// hint says what to do about a failed PING, or "".
func hint(r Config, err error) string {
	var unknownCA x509.UnknownAuthorityError
	var badName x509.HostnameError
	switch {
	case r.IsEmbedded():
		return " (a worker runs the embedded server: start one first)"
	case errors.As(err, &unknownCA):
		return " (its TLS certificate is not signed by a CA the client trusts: set redis.tls.ca_file to the CA that signed it)"
	case errors.As(err, &badName):
		return " (its TLS certificate is not valid for the name the client expects: set redis.tls.server_name to one it holds)"
	case r.TLSOn() && strings.Contains(err.Error(), "tls: certificate required"):
		// crypto/tls exposes a received alert only as text.
		return " (the server wants a client certificate: set redis.tls.cert_file and key_file)"
	case !r.TLSOn() && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		if len(r.Cluster) > 0 {
			return " (if the server speaks TLS only, set redis.tls.enabled: true)"
		}
		return " (if the server speaks TLS only, use a rediss:// URL)"
	case strings.Contains(err.Error(), "NOAUTH"):
		return " (the server wants a login: give a user and password in the URL, or redis.username and REDIS_PASSWORD or redis.password_file)"
	case strings.Contains(err.Error(), "WRONGPASS"):
		return " (the user or password is wrong, or the user is disabled)"
	}
	return ""
}
