package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Config says where Redis is (embedded, a URL or a cluster) and how to log
// in: the config file's redis section, which config.yaml documents. String,
// GoString and every error hide the password.
type Config struct {
	URL          string   `yaml:"url,secret=URL"`           // Embedded, redis://, rediss:// (TLS) or unix://; "" with Cluster
	Cluster      []string `yaml:"cluster"`                  // some nodes' host:port, instead of URL
	Username     string   `yaml:"username"`                 // for a cluster, or a URL that names none
	PasswordFile string   `yaml:"password_file,path"`       // holds the password, read when connecting
	Password     string   `yaml:"password,secret=password"` // for a cluster, or a URL that holds none
	TLS          TLS      `yaml:"tls"`                      // on with a rediss:// URL or, for a cluster, TLS.Enabled
	EmbeddedAddr string   `yaml:"embedded_addr"`            // the embedded server's loopback host:port
	Prefix       string   `yaml:"prefix"`                   // starts every throttle key; no '{' or '}'
	Shards       int      `yaml:"shards"`                   // asynq queues per queue, 0 to MaxShards (0: see Shards)
}

// TLS says how to connect to Redis over TLS. Keys stay in files.
type TLS struct {
	Enabled            bool   `yaml:"enabled"`              // for a cluster; a URL's rediss:// may only be confirmed
	CAFile             string `yaml:"ca_file,path"`         // PEM CAs to trust instead of the system's
	CertFile           string `yaml:"cert_file,path"`       // a client certificate (PEM), for tls-auth-clients yes
	KeyFile            string `yaml:"key_file,path"`        // its key
	ServerName         string `yaml:"server_name"`          // default the host of the URL, or of each node
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"` // for a test only: Warnings says why
}

// Redacted replaces a password in what RedactURL returns.
const Redacted = "xxxxx"

// Embedded is the URL that runs an in-process server (miniredis) instead
// of connecting to Redis.
const Embedded = "embedded"

// DefaultEmbeddedAddr is where the embedded server listens by default.
const DefaultEmbeddedAddr = "127.0.0.1:6390"

// Fill makes a cluster replace the default embedded URL, in a file.
func (r *Config) Fill(has func(key string) bool, _ func(key, why string)) {
	if has("cluster") && !has("url") {
		r.URL = ""
	}
}

// IsEmbedded reports whether r runs the in-process server (url: embedded).
func (r Config) IsEmbedded() bool { return r.URL == Embedded && len(r.Cluster) == 0 }

// TLSOn reports whether r connects over TLS.
func (r Config) TLSOn() bool {
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
func (r Config) String() string {
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

func (r Config) redactedCluster() []string {
	var out []string
	for _, a := range r.Cluster {
		out = append(out, RedactURL(a))
	}
	return out
}

// GoString is the %#v form of r, with the password redacted.
func (r Config) GoString() string {
	pw := ""
	if r.Password != "" {
		pw = Redacted
	}
	return fmt.Sprintf("config.Redis{URL:%q, Cluster:%#v, Username:%q, Password:%q, PasswordFile:%q, TLS:%#v, EmbeddedAddr:%q, Prefix:%q}",
		RedactURL(r.URL), r.redactedCluster(), r.Username, pw, r.PasswordFile, r.TLS, r.EmbeddedAddr, r.Prefix)
}

// Warnings returns what a program should log loudly before connecting.
func (r Config) Warnings() []string {
	if r.TLS.InsecureSkipVerify && r.TLSOn() {
		return []string{"redis.tls.insecure_skip_verify is true: the Redis server's certificate is not checked, " +
			"so anyone on the network path can impersonate it and read the password and every job; use redis.tls.ca_file instead"}
	}
	return nil
}

// LoginPassword returns the password to log in with, besides one in the
// URL: Password, or what PasswordFile holds. The error never shows it.
func (r Config) LoginPassword() (string, error) {
	if r.PasswordFile == "" {
		return r.Password, nil
	}
	pw, msg := ReadSecretFile(r.PasswordFile, "password")
	if msg != "" {
		return "", fmt.Errorf("config: redis.password_file: %s", msg)
	}
	return pw, nil
}

// AppendCAFile adds the certificates of the PEM file at path (a ca_file)
// to pool, or says what is wrong: "" if nothing.
func AppendCAFile(pool *x509.CertPool, path string) string {
	data, msg := readSmallFile(path)
	if msg != "" {
		return msg
	}
	if !pool.AppendCertsFromPEM(data) {
		return fmt.Sprintf("no PEM certificate in %s", Quote(path))
	}
	return ""
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
			Quote(certFile), Quote(keyFile), strings.TrimPrefix(err.Error(), "tls: "))
	}
	return cert, ""
}

// ParseURL parses a redis.url other than Embedded into go-redis options.
// Its errors quote the URL redacted: net/url's, which echo it whole, are
// replaced, and go-redis's scrubbed.
func ParseURL(u string) (*redis.Options, error) {
	scheme, _, ok := strings.Cut(u, "://")
	switch s := strings.ToLower(scheme); {
	case !ok || s != "redis" && s != "rediss" && s != "unix":
		return nil, fmt.Errorf("must be %s or a redis://, rediss:// or unix:// URL (got %s)", Embedded, Quote(RedactURL(u)))
	}
	opts, err := redis.ParseURL(u)
	var ue *url.Error
	switch {
	case errors.As(err, &ue):
		return nil, fmt.Errorf("not a valid URL (got %s)", Quote(RedactURL(u)))
	case err != nil:
		return nil, fmt.Errorf("%s (got %s)", Scrub(strings.TrimPrefix(err.Error(), "redis: "), u), Quote(RedactURL(u)))
	case opts.TLSConfig != nil && opts.TLSConfig.InsecureSkipVerify:
		return nil, fmt.Errorf("skip_verify is not taken in the URL: set redis.tls.insecure_skip_verify: true, which is logged as a warning (got %s)",
			Quote(RedactURL(u)))
	}
	return opts, nil
}

// RedactURL returns u with its password, and the values of query
// parameters named like "pass", replaced by Redacted. It works on the
// text, so it also hides the password of a URL that does not parse,
// erring on the side of hiding too much.
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

// secretSpans returns the [start, end) byte ranges of u's secrets, in
// order: the password (from the first ':' after "://" to the last '@') and
// the values of query parameters named like a password.
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
