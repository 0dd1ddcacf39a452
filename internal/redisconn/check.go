package redisconn

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

type checker struct {
	r     Config
	url   string
	failf func(path, format string, args ...any)
}

// ValidAddr reports whether a is host:port with a port from 1 to 65535.
func ValidAddr(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || strings.ContainsAny(host, " /") {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p >= 1 && p <= 65535
}

// Loopback reports whether host:port a listens on loopback only.
func Loopback(a string) bool {
	host, _, err := net.SplitHostPort(a)
	ip := net.ParseIP(host)
	return err == nil && (host == "localhost" || ip != nil && ip.IsLoopback())
}

// Check reports through fail every problem of r's settings by path
// (redis.tls.ca_file): values, contradictions, and files that cannot be
// read or do not hold what they should. urlName names where the URL came
// from: redis.url, or the variable that replaced it.
func (r Config) Check(urlName string, fail func(path, format string, args ...any)) {
	c := checker{r: r, url: urlName, failf: fail}
	switch {
	case r.Cluster != nil && r.URL != "":
		c.failf("redis.cluster", "cannot be used with redis.url: give one of them")
	case r.Cluster != nil && len(r.Cluster) == 0:
		c.failf("redis.cluster", "needs at least one node's host:port")
	case r.Cluster == nil && r.URL != Embedded:
		if _, err := ParseURL(r.URL); err != nil {
			c.failf("redis.url", "%s", err)
		}
	}
	for i, a := range r.Cluster {
		if !ValidAddr(a) {
			c.failf(fmt.Sprintf("redis.cluster[%d]", i), "must be host:port (got %s)", Quote(RedactURL(a)))
		}
	}
	c.login()
	if !ValidAddr(r.EmbeddedAddr) || !Loopback(r.EmbeddedAddr) {
		c.failf("redis.embedded_addr", "must be a loopback host:port such as %s, as the embedded server has no password (got %s)",
			DefaultEmbeddedAddr, Quote(r.EmbeddedAddr))
	}
	if r.Shards < 0 || r.Shards > MaxShards {
		c.failf("redis.shards", "must be 0 (the default: 1 on one Redis, the number of masters on a cluster) to %d (got %d)", MaxShards, r.Shards)
	}
	switch {
	case r.Prefix == "":
		c.failf("redis.prefix", "must not be empty")
	case strings.ContainsAny(r.Prefix, "{}"):
		c.failf("redis.prefix", "must not contain '{' or '}' (got %s)", Quote(r.Prefix))
	}
}

// login checks the user, password and TLS settings against each other and
// the URL, and the files they name.
func (c checker) login() {
	r := c.r
	if r.IsEmbedded() {
		for _, s := range []struct {
			path string
			set  bool
		}{{"redis.username", r.Username != ""}, {"redis.password", r.Password != ""},
			{"redis.password_file", r.PasswordFile != ""}, {"redis.tls", r.TLS != (TLS{})}} {
			if s.set {
				c.failf(s.path, "only for a Redis server: the embedded one has no users, passwords or TLS")
			}
		}
		return
	}
	opts, err := ParseURL(r.URL)
	if r.Cluster != nil && r.URL != "" || r.Cluster == nil && err != nil {
		return // reported by redis()
	}
	if r.Password != "" && r.PasswordFile != "" {
		c.failf("redis.password_file", "cannot be used with redis.password: give one of them")
	}
	if r.Cluster == nil {
		url := c.url
		if r.Username != "" && opts.Username != "" {
			c.failf("redis.username", "cannot be used with a user in %s: give it once", url)
		}
		if opts.Password != "" && r.Password != "" {
			c.failf("redis.password", "cannot be used with a password in %s: give it once", url)
		}
		if opts.Password != "" && r.PasswordFile != "" {
			c.failf("redis.password_file", "cannot be used with a password in %s: give it once", url)
		}
	}
	if r.PasswordFile != "" {
		if _, msg := ReadSecretFile(r.PasswordFile, "password"); msg != "" {
			c.failf("redis.password_file", "%s", msg)
		}
	}
	c.tlsSettings()
}

// tlsSettings checks that TLS settings are given only with TLS on, agree,
// and name files that hold what they should.
func (c checker) tlsSettings() {
	r := c.r
	t := r.TLS
	if r.Cluster == nil && t.Enabled && !r.TLSOn() {
		scheme, _, _ := strings.Cut(r.URL, "://")
		c.failf("redis.tls.enabled", "%s is a %s:// URL, which does not use TLS: use rediss:// instead", c.url, scheme)
		return
	}
	if !r.TLSOn() {
		off := "TLS is off: use a rediss:// URL"
		if r.Cluster != nil {
			off = "TLS is off: set redis.tls.enabled: true"
		}
		for _, s := range []struct {
			key string
			set bool
		}{{"ca_file", t.CAFile != ""}, {"cert_file", t.CertFile != ""}, {"key_file", t.KeyFile != ""},
			{"server_name", t.ServerName != ""}, {"insecure_skip_verify", t.InsecureSkipVerify}} {
			if s.set {
				c.failf("redis.tls."+s.key, "%s", off)
			}
		}
		return
	}
	if t.InsecureSkipVerify && (t.CAFile != "" || t.ServerName != "") {
		c.failf("redis.tls.insecure_skip_verify", "cannot be used with redis.tls.ca_file or server_name, which it would ignore")
	}
	if t.CAFile != "" {
		if msg := AppendCAFile(x509.NewCertPool(), t.CAFile); msg != "" {
			c.failf("redis.tls.ca_file", "%s", msg)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		c.failf("redis.tls.key_file", "required with redis.tls.cert_file")
	case t.KeyFile != "" && t.CertFile == "":
		c.failf("redis.tls.cert_file", "required with redis.tls.key_file")
	case t.CertFile != "":
		if _, msg := readKeyPair(t.CertFile, t.KeyFile); msg != "" {
			c.failf("redis.tls.cert_file", "%s", msg)
		}
	}
}

// maxFileLen bounds the files settings name: they are small, and a path to
// something else (a device, a log) should fail, not fill memory.
const maxFileLen = 1 << 20

// ReadSecretFile returns the one line the file at path holds, or what is
// wrong with the file. The message never shows what the file holds.
func ReadSecretFile(path, what string) (value, msg string) {
	data, msg := readSmallFile(path)
	if msg != "" {
		return "", msg
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	switch {
	case v == "":
		return "", fmt.Sprintf("%s is empty", Quote(path))
	case strings.ContainsAny(v, "\r\n"):
		return "", fmt.Sprintf("%s holds more than one line: put the %s alone on one line", Quote(path), what)
	}
	return v, ""
}

func readSmallFile(path string) ([]byte, string) {
	// Stat before Open: opening a FIFO would block until a writer comes.
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Sprintf("cannot read %s: %s", Quote(path), pathErr(err))
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Sprintf("%s is not a regular file", Quote(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Sprintf("cannot read %s: %s", Quote(path), pathErr(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileLen+1))
	switch {
	case err != nil:
		return nil, fmt.Sprintf("cannot read %s: %s", Quote(path), pathErr(err))
	case len(data) > maxFileLen:
		return nil, fmt.Sprintf("%s is larger than %d bytes", Quote(path), maxFileLen)
	}
	return data, ""
}

// pathErr is an os error without the path, which messages quote already.
func pathErr(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// Quote quotes s for a message, shortened to 80 bytes: config's messages
// quote bad values with it too.
func Quote(s string) string {
	const maxShown = 80
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	cut := maxShown
	for cut > 0 && s[cut]&0xC0 == 0x80 { // not the start of a rune
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}
