package redistest

import (
	"crypto/rand"
	"crypto/tls"
	"net/url"
	"path/filepath"
	"strconv"
)

// AdminUser is the ACL user, of a random password, that the helpers log in
// as on a server with Options.Users (whose default user is off).
const AdminUser = "redistest-admin"

// Options are the security settings of StartWith and StartClusterWith.
// The zero value is what Start does: no TLS, no ACL users.
type Options struct {
	// Users are ACL users as redis.conf's "user" directive takes them
	// ("app on >s3cret ~app:* +get"). With any, the default user is off
	// and AdminUser is added; neither may be redefined.
	Users       []string
	TLS         bool     // TLS only, between cluster nodes too, with a throwaway CA's certificates (Server.TLS)
	ClientCerts bool     // a TLS server requires a client certificate
	Extra       []string // more directives, as Start takes them
}

// security is what one StartWith or StartClusterWith call sets up, for
// every node of a cluster.
type security struct {
	opts          Options
	adminPassword string    // "" without Users
	files         *TLSFiles // nil without TLS
	clientTLS     *tls.Config
}

// StartWith is Start with ACL users and TLS as o says.
func StartWith(t TB, o Options) *Server {
	t.Helper()
	return start(t, false, newSecurity(t, o))
}

// StartClusterWith is StartCluster with ACL users and TLS as o says, on
// every node; replicas log in to their masters as AdminUser.
func StartClusterWith(t TB, masters, replicasPerMaster int, o Options) *Cluster {
	t.Helper()
	return startCluster(t, masters, replicasPerMaster, newSecurity(t, o))
}

// newSecurity sets up what o asks for, or fails t.
func newSecurity(t TB, o Options) *security {
	t.Helper()
	sec := &security{opts: o}
	if len(o.Users) > 0 {
		sec.adminPassword = rand.Text()
	}
	if o.ClientCerts && !o.TLS {
		t.Fatalf("redistest: Options.ClientCerts needs Options.TLS")
	}
	if o.TLS {
		dir, err := filepath.Abs(t.TempDir())
		if err == nil {
			sec.files, err = NewTLSFiles(dir)
		}
		if err == nil {
			sec.clientTLS, err = sec.files.ClientConfig()
		}
		if err != nil {
			t.Fatalf("%v", err)
		}
	}
	return sec
}

// lines returns the directives of a server on port, Extra last.
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

// access returns the helpers' login; password is a "requirepass" extra
// line's, used without ACL users.
func (sec *security) access(password string) access {
	a := access{password: password}
	if sec == nil {
		return a
	}
	if sec.adminPassword != "" {
		a.user, a.password = AdminUser, sec.adminPassword
	}
	a.tls = sec.clientTLS.Clone()
	return a
}

// URL returns the server's redis:// (rediss:// with TLS) URL, with user
// and password unless user is "". A client must still trust TLS.CAFile.
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
