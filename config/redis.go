package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redacted replaces a password in what RedactURL returns.
const Redacted = "xxxxx"

// Environment variables that replace settings (see LoadWithEnv).
const (
	EnvRedisURL      = "REDIS_URL"      // redis.url and redis.cluster
	EnvRedisPassword = "REDIS_PASSWORD" // redis.password and redis.password_file
)

// fill makes a cluster replace the default embedded URL.
func (r *Redis) fill(has func(key string) bool, _ func(key, why string)) {
	if has("cluster") && !has("url") {
		r.URL = ""
	}
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

// IsEmbedded reports whether r runs the in-process server (url: embedded).
func (r Redis) IsEmbedded() bool { return r.URL == Embedded && len(r.Cluster) == 0 }

// TLSOn reports whether r connects over TLS.
func (r Redis) TLSOn() bool {
	if len(r.Cluster) > 0 {
		return r.TLS.Enabled
	}
	scheme, _, _ := strings.Cut(r.URL, "://")
	return strings.EqualFold(scheme, "rediss")
}

// String describes where r connects, for logs, with the password redacted:
// "embedded (127.0.0.1:6390)", "redis://app:xxxxx@cache:6379/0" or
// "cluster 10.0.0.1:7000,10.0.0.2:7000, user app, TLS". A connection whose
// certificate is not verified ends in ", TLS NOT VERIFIED".
func (r Redis) String() string {
	if r.IsEmbedded() {
		return Embedded + " (" + r.EmbeddedAddr + ")"
	}
	s := RedactURL(r.URL)
	if len(r.Cluster) > 0 {
		s = "cluster " + strings.Join(r.redactedCluster(), ",") // a bad entry may hold user:password@
	}
	if r.Username != "" {
		s += ", user " + r.Username
	}
	if len(r.Cluster) > 0 && r.TLS.Enabled {
		s += ", TLS"
	}
	if r.TLS.InsecureSkipVerify && r.TLSOn() {
		s += ", TLS NOT VERIFIED"
	}
	return s
}

func (r Redis) redactedCluster() []string {
	var out []string
	for _, a := range r.Cluster {
		out = append(out, RedactURL(a))
	}
	return out
}

// GoString is the %#v form of r, with the password redacted.
func (r Redis) GoString() string {
	pw := ""
	if r.Password != "" {
		pw = Redacted
	}
	return fmt.Sprintf("config.Redis{URL:%q, Cluster:%#v, Username:%q, Password:%q, PasswordFile:%q, TLS:%#v, EmbeddedAddr:%q, Prefix:%q}",
		RedactURL(r.URL), r.redactedCluster(), r.Username, pw, r.PasswordFile, r.TLS, r.EmbeddedAddr, r.Prefix)
}

// Warnings returns what a program should log loudly before connecting: for
// now, that TLS certificates are not verified.
func (r Redis) Warnings() []string {
	if r.TLS.InsecureSkipVerify && r.TLSOn() {
		return []string{"redis.tls.insecure_skip_verify is true: the Redis server's certificate is not checked, " +
			"so anyone on the network path can impersonate it and read the password and every job; use redis.tls.ca_file instead"}
	}
	return nil
}

// LoginPassword returns the password to log in with, besides one in the
// URL: Password, or what PasswordFile holds. The error never shows it.
func (r Redis) LoginPassword() (string, error) {
	if r.PasswordFile == "" {
		return r.Password, nil
	}
	pw, msg := readSecretFile(r.PasswordFile, "password")
	if msg != "" {
		return "", fmt.Errorf("config: redis.password_file: %s", msg)
	}
	return pw, nil
}

// CAs returns the certificates of CAFile, or nil for the system's.
func (t TLS) CAs() (*x509.CertPool, error) {
	if t.CAFile == "" {
		return nil, nil
	}
	pool, msg := readCAFile(t.CAFile)
	if msg != "" {
		return nil, fmt.Errorf("config: redis.tls.ca_file: %s", msg)
	}
	return pool, nil
}

// ClientCertificates returns the client certificate of CertFile and
// KeyFile, or none.
func (t TLS) ClientCertificates() ([]tls.Certificate, error) {
	if t.CertFile == "" && t.KeyFile == "" {
		return nil, nil
	}
	cert, msg := readKeyPair(t.CertFile, t.KeyFile)
	if msg != "" {
		return nil, fmt.Errorf("config: redis.tls.cert_file: %s", msg)
	}
	return []tls.Certificate{cert}, nil
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

// ParseURL parses a redis.url other than Embedded into go-redis options.
// Its errors quote the URL redacted and never its password: net/url's
// errors echo the whole URL, so they are replaced, and go-redis's are
// scrubbed.
func ParseURL(u string) (*redis.Options, error) {
	scheme, _, ok := strings.Cut(u, "://")
	switch s := strings.ToLower(scheme); {
	case !ok || s != "redis" && s != "rediss" && s != "unix":
		return nil, fmt.Errorf("must be %s or a redis://, rediss:// or unix:// URL (got %s)", Embedded, quote(RedactURL(u)))
	}
	opts, err := redis.ParseURL(u)
	var ue *url.Error
	switch {
	case errors.As(err, &ue):
		return nil, fmt.Errorf("not a valid URL (got %s)", quote(RedactURL(u)))
	case err != nil:
		return nil, fmt.Errorf("%s (got %s)", Scrub(strings.TrimPrefix(err.Error(), "redis: "), u), quote(RedactURL(u)))
	case opts.TLSConfig != nil && opts.TLSConfig.InsecureSkipVerify:
		return nil, fmt.Errorf("skip_verify is not taken in the URL: set redis.tls.insecure_skip_verify: true, which is logged as a warning (got %s)",
			quote(RedactURL(u)))
	}
	return opts, nil
}

// RedactURL returns u with its password, if any, replaced by xxxxx:
// "redis://app:s3cret@cache:6379/0" becomes "redis://app:xxxxx@cache:6379/0".
// It works on the text, so it also hides the password of a URL that does
// not parse (one with an unescaped '/' or '@' in it, say), erring on the
// side of hiding too much; query parameters whose name contains "pass" are
// hidden too. Every log line and error that shows a URL uses it.
func RedactURL(u string) string {
	var b strings.Builder
	last := 0
	for _, s := range secretSpans(u) {
		b.WriteString(u[last:s[0]] + Redacted)
		last = s[1]
	}
	b.WriteString(u[last:])
	return b.String()
}

// Scrub hides any of u's secrets that appear in msg, decoded or not.
func Scrub(msg, u string) string {
	for _, s := range secretSpans(u) {
		secret := u[s[0]:s[1]]
		if secret == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, secret, Redacted)
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if dec, err := unescape(secret); err == nil && dec != "" {
				msg = strings.ReplaceAll(msg, dec, Redacted)
			}
		}
	}
	return msg
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
	if at := strings.LastIndexByte(u[start:], '@'); at >= 0 {
		at += start
		if colon := strings.IndexByte(u[start:at], ':'); colon >= 0 {
			spans = append(spans, [2]int{start + colon + 1, at})
			start = at
		}
	}
	q := strings.IndexByte(u[start:], '?')
	for i := start + q + 1; q >= 0 && i < len(u); {
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
	return spans
}
