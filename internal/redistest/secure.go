package redistest

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
)

// AdminUser is the ACL user the helpers (the readiness probe, Client,
// cluster setup) log in as on a server started with Options.Users, whose
// default user is off. Its password is random; it may do anything.
const AdminUser = "redistest-admin"

// Options are the security settings of StartWith and StartClusterWith.
// The zero value is what Start does: no TLS, no ACL users.
type Options struct {
	// Users are ACL users, each as redis.conf's "user" directive takes it
	// after the keyword, e.g. "app on >s3cret ~app:* +get". When any are
	// given, the default user is turned off (so a client that does not log
	// in can do nothing) and AdminUser is added. Neither may be redefined.
	Users []string
	// TLS makes the server accept TLS connections only (port 0, tls-port
	// on the chosen port), with certificates from a throwaway CA, which
	// Server.TLS names. Cluster nodes then also talk TLS to each other.
	TLS bool
	// ClientCerts makes a TLS server require a client certificate signed
	// by its CA (tls-auth-clients yes); by default it asks for none (no).
	ClientCerts bool
	// Extra are more config directives, as Start takes them.
	Extra []string
}

// security is what one StartWith or StartClusterWith call sets up, shared
// by all the nodes of a cluster.
type security struct {
	opts          Options
	adminPassword string    // "" without Users
	files         *TLSFiles // nil without TLS
	clientTLS     *tls.Config
}

// StartWith is Start with ACL users and TLS: it starts a standalone
// redis-server as o says, waits until it answers PING (as AdminUser, over
// TLS, as configured) and stops it at cleanup. Server.TLS names the
// certificate files, which are in a temp dir of their own.
func StartWith(t TB, o Options) *Server {
	t.Helper()
	sec, err := newSecurity(t, o)
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	return start(t, false, sec)
}

// StartClusterWith is StartCluster with ACL users and TLS: every node gets
// the users, and with TLS the certificates of one CA, and replicas log in to
// their masters as AdminUser.
func StartClusterWith(t TB, masters, replicasPerMaster int, o Options) *Cluster {
	t.Helper()
	sec, err := newSecurity(t, o)
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	return startCluster(t, masters, replicasPerMaster, sec)
}

// newSecurity makes the admin password and, for TLS, the certificates.
func newSecurity(t TB, o Options) (*security, error) {
	sec := &security{opts: o}
	if len(o.Users) > 0 {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("redistest: admin password: %w", err)
		}
		sec.adminPassword = hex.EncodeToString(b)
	}
	if o.TLS {
		dir, err := filepath.Abs(t.TempDir())
		if err != nil {
			return nil, fmt.Errorf("redistest: temp dir: %w", err)
		}
		if sec.files, err = NewTLSFiles(dir); err != nil {
			return nil, err
		}
		if sec.clientTLS, err = sec.files.ClientConfig(); err != nil {
			return nil, err
		}
	} else if o.ClientCerts {
		return nil, fmt.Errorf("redistest: Options.ClientCerts needs Options.TLS")
	}
	return sec, nil
}

// lines returns the config directives for a server on port, before Extra.
func (sec *security) lines(port int, cluster bool) []string {
	if sec == nil {
		return nil
	}
	var lines []string
	if sec.files != nil {
		auth := "no"
		if sec.opts.ClientCerts {
			auth = "yes"
		}
		lines = append(lines,
			"port 0",
			"tls-port "+strconv.Itoa(port),
			"tls-cert-file "+quote(sec.files.CertFile),
			"tls-key-file "+quote(sec.files.KeyFile),
			"tls-ca-cert-file "+quote(sec.files.CAFile),
			"tls-auth-clients "+auth,
		)
		if cluster {
			lines = append(lines, "tls-cluster yes", "tls-replication yes")
		}
	}
	if sec.adminPassword != "" {
		lines = append(lines,
			"user default off",
			"user "+AdminUser+" on >"+sec.adminPassword+" ~* &* +@all",
		)
		for _, u := range sec.opts.Users {
			lines = append(lines, "user "+u)
		}
		if cluster {
			lines = append(lines, "masteruser "+AdminUser, "masterauth "+sec.adminPassword)
		}
	}
	return append(lines, sec.opts.Extra...)
}

// access is how the helpers log in to a server.
type access struct {
	user, password string
	tls            *tls.Config // nil for plain TCP
}

// access returns the helpers' login; password is that of a "requirepass"
// extra line, used when there are no ACL users.
func (sec *security) access(password string) access {
	a := access{password: password}
	if sec == nil {
		return a
	}
	if sec.adminPassword != "" {
		a.user, a.password = AdminUser, sec.adminPassword
	}
	if sec.clientTLS != nil {
		a.tls = sec.clientTLS.Clone()
	}
	return a
}

// URL returns a redis:// URL of the server, rediss:// if it speaks TLS,
// with user and password if user is not empty. A client of a TLS server
// must still be told to trust TLS.CAFile.
func (s *Server) URL(user, password string) string {
	u := url.URL{Scheme: "redis", Host: s.Addr}
	if s.TLS != nil {
		u.Scheme = "rediss"
	}
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}
