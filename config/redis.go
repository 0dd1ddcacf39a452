package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Redacted replaces a password in what RedactURL returns.
const Redacted = "xxxxx"

// EnvRedisPassword is the environment variable that replaces
// redis.password and redis.password_file.
const EnvRedisPassword = "REDIS_PASSWORD"

// maxFileLen bounds the files redis settings name (password, CA,
// certificate, key): they are small, and a path to something else (a device,
// a log) should fail, not fill memory.
const maxFileLen = 1 << 20

// TLS says how to connect to Redis over TLS. It has no secrets: keys stay
// in files.
type TLS struct {
	// Enabled turns TLS on for a cluster; for a URL, rediss:// does, and
	// Enabled may only confirm it. Default false.
	Enabled bool
	// CAFile is a PEM file of the CA certificates to trust instead of the
	// system's, e.g. a private CA that signed the servers' certificates.
	// Default "": the system's.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// a server that requires one (tls-auth-clients yes). Default none.
	CertFile string
	KeyFile  string
	// ServerName is the name the server's certificate must be valid for.
	// Default "": the host of the URL, or of each cluster node.
	ServerName string
	// InsecureSkipVerify turns the check of the server's certificate off,
	// so anyone on the path can read and change the traffic, the password
	// included. For a test only; Warnings reports it. Default false.
	InsecureSkipVerify bool
}

// IsEmbedded reports whether r runs the in-process server (url: embedded).
func (r Redis) IsEmbedded() bool { return r.URL == Embedded && len(r.Cluster) == 0 }

// String describes where r connects, for logs, with the password redacted:
// "embedded (127.0.0.1:6390)", "redis://app:xxxxx@cache:6379/0" or
// "cluster 10.0.0.1:7000,10.0.0.2:7000, user app, TLS". A connection whose
// certificate is not verified ends in ", TLS NOT VERIFIED".
func (r Redis) String() string {
	var b strings.Builder
	switch {
	case len(r.Cluster) > 0:
		b.WriteString("cluster ")
		for i, a := range r.Cluster {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(RedactURL(a)) // a bad entry may hold user:password@
		}
	case r.IsEmbedded():
		return Embedded + " (" + r.EmbeddedAddr + ")"
	default:
		b.WriteString(RedactURL(r.URL))
	}
	if r.Username != "" {
		b.WriteString(", user " + r.Username)
	}
	if len(r.Cluster) > 0 && r.TLS.Enabled {
		b.WriteString(", TLS")
	}
	if r.TLS.InsecureSkipVerify && r.tlsOn() {
		b.WriteString(", TLS NOT VERIFIED")
	}
	return b.String()
}

// GoString is the %#v form of r, with the password redacted.
func (r Redis) GoString() string {
	pw := ""
	if r.Password != "" {
		pw = Redacted
	}
	var cluster []string
	for _, a := range r.Cluster {
		cluster = append(cluster, RedactURL(a))
	}
	return fmt.Sprintf("config.Redis{URL:%q, Cluster:%#v, Username:%q, Password:%q, PasswordFile:%q, TLS:%#v, EmbeddedAddr:%q, Prefix:%q}",
		RedactURL(r.URL), cluster, r.Username, pw, r.PasswordFile, r.TLS, r.EmbeddedAddr, r.Prefix)
}

// Warnings returns what a program should log loudly before connecting: for
// now, that TLS certificates are not verified.
func (r Redis) Warnings() []string {
	if r.TLS.InsecureSkipVerify && r.tlsOn() {
		return []string{"redis.tls.insecure_skip_verify is true: the Redis server's certificate is not checked, " +
			"so anyone on the network path can impersonate it and read the password and every job; use redis.tls.ca_file instead"}
	}
	return nil
}

// tlsOn reports whether r connects over TLS.
func (r Redis) tlsOn() bool {
	if len(r.Cluster) > 0 {
		return r.TLS.Enabled
	}
	scheme, _, _ := strings.Cut(r.URL, "://")
	return strings.EqualFold(scheme, "rediss")
}

// Connect returns a client of the Redis r names, after a PING has answered
// within ctx, and the function that closes it. It never starts a server:
// with url: embedded it connects to the embedded server of a worker (see
// Serve) on EmbeddedAddr, which is what a separate enqueue process needs.
//
// The client is a *redis.Client, or a *redis.ClusterClient for a cluster.
// To run asynq on it, pass it to asynq.NewClientFromRedisClient,
// NewServerFromRedisClient or NewInspectorFromRedisClient; asynq does not
// close such a client, so call close after shutting asynq down.
func (r Redis) Connect(ctx context.Context) (rdb redis.UniversalClient, close func() error, err error) {
	password, err := r.password()
	if err != nil {
		return nil, nil, err
	}
	// DisableIdentity: no CLIENT SETINFO on each connection, so the
	// least-privilege ACL (config.yaml) need not name a command that
	// Redis < 7.2 does not know, and an ACL naming it fails to load there.
	switch {
	case len(r.Cluster) > 0:
		opts := &redis.ClusterOptions{Addrs: r.Cluster, Username: r.Username, Password: password, DisableIdentity: true}
		if r.TLS.Enabled {
			if opts.TLSConfig, err = r.TLS.config(&tls.Config{MinVersion: tls.VersionTLS12}); err != nil {
				return nil, nil, err
			}
		}
		rdb = redis.NewClusterClient(opts)
	case r.IsEmbedded():
		rdb = redis.NewClient(&redis.Options{Addr: r.EmbeddedAddr, DisableIdentity: true})
	default:
		if msg := checkRedisURL(r.URL); msg != "" {
			return nil, nil, fmt.Errorf("config: redis.url: %s", msg)
		}
		opts, err := parseRedisURL(r.URL)
		if err != nil {
			return nil, nil, fmt.Errorf("config: redis.url: %s", err)
		}
		opts.DisableIdentity = true
		if r.Username != "" {
			opts.Username = r.Username
		}
		if password != "" {
			opts.Password = password
		}
		if opts.TLSConfig != nil {
			if opts.TLSConfig, err = r.TLS.config(opts.TLSConfig); err != nil {
				return nil, nil, err
			}
		}
		rdb = redis.NewClient(opts)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		text := r.scrub(err.Error(), password)
		cause := err
		if text != err.Error() {
			cause = nil // its text shows a secret: do not hand it on
		}
		msg := fmt.Sprintf("config: connect to redis %s%s: %s", r, r.hint(err), text)
		return nil, nil, &scrubbedError{msg: msg, err: cause}
	}
	return rdb, onceFunc(rdb.Close), nil
}

// Serve is Connect for the process that owns the data, the worker: with
// url: embedded it first starts the in-process server on EmbeddedAddr (an
// error if that address is taken, by another worker for instance), and close
// stops it after closing the client. Otherwise it is Connect. Embedded data
// lives in memory only and is lost when the server stops; ctx bounds the
// start, not the server's life.
func (r Redis) Serve(ctx context.Context) (rdb redis.UniversalClient, close func() error, err error) {
	if !r.IsEmbedded() {
		return r.Connect(ctx)
	}
	srv, err := startEmbedded(r.EmbeddedAddr)
	if err != nil {
		return nil, nil, err
	}
	rdb, closeClient, err := r.Connect(ctx)
	if err != nil {
		srv.close()
		return nil, nil, err
	}
	return rdb, onceFunc(func() error {
		err := closeClient()
		srv.close()
		return err
	}), nil
}

// scrubbedError is an error whose text had a password taken out; errors.Is
// and errors.As still see the cause, unless the cause's own text shows it.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// onceFunc makes close safe to call more than once.
func onceFunc(f func() error) func() error {
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { err = f() })
		return err
	}
}

// hint says what to do about a failed PING, or "".
func (r Redis) hint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var badName x509.HostnameError
	switch {
	case r.IsEmbedded():
		return " (a worker runs the embedded server: start one first)"
	case errors.As(err, &unknownCA):
		return " (its TLS certificate is not signed by a CA the client trusts: set redis.tls.ca_file to the CA that signed it)"
	case errors.As(err, &badName):
		return " (its TLS certificate is not valid for the name the client expects: set redis.tls.server_name to one it holds)"
	case r.tlsOn() && strings.Contains(err.Error(), "tls: certificate required"):
		// crypto/tls exposes a received alert only as text.
		return " (the server wants a client certificate: set redis.tls.cert_file and key_file)"
	case !r.tlsOn() && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
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

// scrub hides r's secrets in msg: those of the URL, password (the one in
// use, perhaps read from a file) and any a bad cluster entry holds.
func (r Redis) scrub(msg, password string) string {
	msg = scrub(msg, r.URL)
	for _, a := range r.Cluster {
		msg = scrub(msg, a)
	}
	for _, pw := range []string{password, r.Password} {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, Redacted)
		}
	}
	return msg
}

// password returns the password to log in with, besides one in the URL:
// Password, or what PasswordFile holds.
func (r Redis) password() (string, error) {
	if r.PasswordFile == "" {
		return r.Password, nil
	}
	pw, msg := readPasswordFile(r.PasswordFile)
	if msg != "" {
		return "", fmt.Errorf("config: redis.password_file: %s", msg)
	}
	return pw, nil
}

// readPasswordFile returns the password in the file at path, without a final
// line break, or what is wrong with the file. The message never shows what
// the file holds.
func readPasswordFile(path string) (password, msg string) {
	return readSecretFile(path, "password")
}

// readSmallFile reads a regular file of at most maxFileLen bytes, or says
// why it cannot.
func readSmallFile(path string) ([]byte, string) {
	// Stat before Open: opening a FIFO would block until a writer comes.
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Sprintf("cannot read %s: %s", quote(path), pathErr(err))
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Sprintf("%s is not a regular file", quote(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Sprintf("cannot read %s: %s", quote(path), pathErr(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileLen+1))
	switch {
	case err != nil:
		return nil, fmt.Sprintf("cannot read %s: %s", quote(path), pathErr(err))
	case len(data) > maxFileLen:
		return nil, fmt.Sprintf("%s is larger than %d bytes", quote(path), maxFileLen)
	}
	return data, ""
}

// pathErr is an os error without the path, which the message quotes already.
func pathErr(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// config returns base completed with t's CA, client certificate, server
// name and verification setting.
func (t TLS) config(base *tls.Config) (*tls.Config, error) {
	c := base.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	if t.CAFile != "" {
		pool, msg := readCAFile(t.CAFile)
		if msg != "" {
			return nil, fmt.Errorf("config: redis.tls.ca_file: %s", msg)
		}
		c.RootCAs = pool
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

// readCAFile returns the certificates of a PEM file, or what is wrong.
func readCAFile(path string) (*x509.CertPool, string) {
	data, msg := readSmallFile(path)
	if msg != "" {
		return nil, msg
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Sprintf("no PEM certificate in %s", quote(path))
	}
	return pool, ""
}

// readKeyPair loads a client certificate and its key, or says what is
// wrong. The message never shows the key.
func readKeyPair(certFile, keyFile string) (tls.Certificate, string) {
	certPEM, msg := readSmallFile(certFile)
	if msg != "" {
		return tls.Certificate{}, msg
	}
	keyPEM, msg := readSmallFile(keyFile)
	if msg != "" {
		return tls.Certificate{}, msg
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Sprintf("%s and %s are not a certificate and its key: %s",
			quote(certFile), quote(keyFile), strings.TrimPrefix(err.Error(), "tls: "))
	}
	return cert, ""
}

// checkRedisURL returns what is wrong with a redis.url, or "".
func checkRedisURL(u string) string {
	if u == Embedded {
		return ""
	}
	scheme, _, ok := strings.Cut(u, "://")
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		if !ok {
			break
		}
		opts, err := parseRedisURL(u)
		if err != nil {
			return err.Error()
		}
		if opts.TLSConfig != nil && opts.TLSConfig.InsecureSkipVerify {
			return fmt.Sprintf("skip_verify is not taken in the URL: set redis.tls.insecure_skip_verify: true, which is logged as a warning (got %s)",
				quote(RedactURL(u)))
		}
		return ""
	}
	return fmt.Sprintf("must be %s or a redis://, rediss:// or unix:// URL (got %s)", Embedded, quote(RedactURL(u)))
}

// parseRedisURL is redis.ParseURL with errors that quote the URL redacted
// and never its password: net/url's errors echo the whole URL, so they are
// replaced, and go-redis's are scrubbed.
func parseRedisURL(u string) (*redis.Options, error) {
	opts, err := redis.ParseURL(u)
	if err == nil {
		return opts, nil
	}
	msg := "not a valid URL"
	var ue *url.Error
	if !errors.As(err, &ue) {
		msg = scrub(strings.TrimPrefix(err.Error(), "redis: "), u)
	}
	return nil, fmt.Errorf("%s (got %s)", msg, quote(RedactURL(u)))
}

// RedactURL returns u with its password, if any, replaced by xxxxx:
// "redis://app:s3cret@cache:6379/0" becomes "redis://app:xxxxx@cache:6379/0".
// It works on the text, so it also hides the password of a URL that does
// not parse (one with an unescaped '/' or '@' in it, say), erring on the
// side of hiding too much; query parameters whose name contains "pass" are
// hidden too. Every log line and error that shows a Redis URL uses it.
func RedactURL(u string) string {
	var b strings.Builder
	last := 0
	for _, s := range secretSpans(u) {
		b.WriteString(u[last:s[0]])
		b.WriteString(Redacted)
		last = s[1]
	}
	b.WriteString(u[last:])
	return b.String()
}

// secretSpans returns the [start, end) byte ranges of u's secrets, in order:
// the password (between the first ':' of the part after "://" and its last
// '@') and the values of query parameters named like a password.
func secretSpans(u string) [][2]int {
	var spans [][2]int
	start := 0
	if i := strings.Index(u, "://"); i >= 0 {
		start = i + 3
	}
	at := strings.LastIndexByte(u[start:], '@')
	if at >= 0 {
		at += start
		if colon := strings.IndexByte(u[start:at], ':'); colon >= 0 {
			spans = append(spans, [2]int{start + colon + 1, at})
			start = at
		}
	}
	if q := strings.IndexByte(u[start:], '?'); q >= 0 {
		for i := start + q + 1; i < len(u); {
			end := strings.IndexAny(u[i:], "&;#")
			if end < 0 {
				end = len(u)
			} else {
				end += i
			}
			if name, _, ok := strings.Cut(u[i:end], "="); ok && strings.Contains(strings.ToLower(name), "pass") {
				spans = append(spans, [2]int{i + len(name) + 1, end})
			}
			if end < len(u) && u[end] == '#' {
				break
			}
			i = end + 1
		}
	}
	return spans
}

// scrub hides any of u's secrets that appear in msg, decoded or not.
func scrub(msg, u string) string {
	for _, s := range secretSpans(u) {
		secret := u[s[0]:s[1]]
		if secret == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, secret, Redacted)
		if dec, err := url.PathUnescape(secret); err == nil && dec != "" {
			msg = strings.ReplaceAll(msg, dec, Redacted)
		}
		if dec, err := url.QueryUnescape(secret); err == nil && dec != "" {
			msg = strings.ReplaceAll(msg, dec, Redacted)
		}
	}
	return msg
}

// fromEnv lets a non-empty REDIS_URL replace URL and Cluster, and a
// non-empty REDIS_PASSWORD replace Password and PasswordFile, recording in
// src that errors about them name the variable.
func (r *Redis) fromEnv(getenv func(string) string, src *source) {
	if u := getenv(EnvRedisURL); u != "" {
		r.URL, r.Cluster = u, nil
		src.env["redis.url"] = EnvRedisURL
	}
	if pw := getenv(EnvRedisPassword); pw != "" {
		r.Password, r.PasswordFile = pw, ""
		src.env["redis.password"] = EnvRedisPassword
	}
}

// redisLogin checks the user, password and TLS settings against each other
// and the URL, and that the files they name can be read.
func (v *validator) redisLogin() {
	r := v.c.Redis
	if r.IsEmbedded() {
		for _, s := range []struct {
			path string
			set  bool
		}{
			{"redis.username", r.Username != ""},
			{"redis.password", r.Password != ""},
			{"redis.password_file", r.PasswordFile != ""},
			{"redis.tls", r.TLS != TLS{}},
		} {
			if s.set {
				v.failf(s.path, "only for a Redis server: the embedded one has no users, passwords or TLS")
			}
		}
		return
	}
	if r.Cluster != nil && r.URL != "" || r.Cluster == nil && checkRedisURL(r.URL) != "" {
		return // reported by redis()
	}
	if r.Password != "" && r.PasswordFile != "" {
		v.failf("redis.password_file", "cannot be used with redis.password: give one of them")
	}
	if r.Cluster == nil {
		opts, _ := parseRedisURL(r.URL)
		url := v.urlName()
		if r.Username != "" && opts.Username != "" {
			v.failf("redis.username", "cannot be used with a user in %s: give it once", url)
		}
		if opts.Password != "" {
			if r.Password != "" {
				v.failf("redis.password", "cannot be used with a password in %s: give it once", url)
			}
			if r.PasswordFile != "" {
				v.failf("redis.password_file", "cannot be used with a password in %s: give it once", url)
			}
		}
	}
	if r.PasswordFile != "" {
		if _, msg := readPasswordFile(r.PasswordFile); msg != "" {
			v.failf("redis.password_file", "%s", msg)
		}
	}
	v.redisTLS()
}

// urlName names where redis.url came from: the file or REDIS_URL.
func (v *validator) urlName() string {
	if v.c.src != nil && v.c.src.env["redis.url"] != "" {
		return v.c.src.env["redis.url"]
	}
	return "redis.url"
}

// redisTLS checks that TLS settings are given only when TLS is on, agree
// with each other, and name files that hold what they should.
func (v *validator) redisTLS() {
	r := v.c.Redis
	t := r.TLS
	if r.Cluster == nil && t.Enabled && !r.tlsOn() {
		scheme, _, _ := strings.Cut(r.URL, "://")
		v.failf("redis.tls.enabled", "%s is a %s:// URL, which does not use TLS: use rediss:// instead", v.urlName(), scheme)
		return
	}
	if !r.tlsOn() {
		off := "TLS is off: use a rediss:// URL"
		if r.Cluster != nil {
			off = "TLS is off: set redis.tls.enabled: true"
		}
		for _, s := range []struct {
			key string
			set bool
		}{
			{"ca_file", t.CAFile != ""},
			{"cert_file", t.CertFile != ""},
			{"key_file", t.KeyFile != ""},
			{"server_name", t.ServerName != ""},
			{"insecure_skip_verify", t.InsecureSkipVerify},
		} {
			if s.set {
				v.failf("redis.tls."+s.key, "%s", off)
			}
		}
		return
	}
	if t.InsecureSkipVerify && (t.CAFile != "" || t.ServerName != "") {
		v.failf("redis.tls.insecure_skip_verify", "cannot be used with redis.tls.ca_file or server_name, which it would ignore")
	}
	if t.CAFile != "" {
		if _, msg := readCAFile(t.CAFile); msg != "" {
			v.failf("redis.tls.ca_file", "%s", msg)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.failf("redis.tls.key_file", "required with redis.tls.cert_file")
	case t.KeyFile != "" && t.CertFile == "":
		v.failf("redis.tls.cert_file", "required with redis.tls.key_file")
	case t.CertFile != "":
		if _, msg := readKeyPair(t.CertFile, t.KeyFile); msg != "" {
			v.failf("redis.tls.cert_file", "%s", msg)
		}
	}
}
