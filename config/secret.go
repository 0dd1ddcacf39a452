package config

import (
	"reflect"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/internal/redisconn"
)

// Secret is a value that must not leave the process (a webhook's URL or
// header): fmt shows it as Redacted. In the file it is a string, or a
// reference resolved on loading: {env: NAME} or {file: PATH}
// (docs/design.md#security-login-tls-acl-redaction).
type Secret string

// String returns Redacted.
func (Secret) String() string { return redisconn.Redacted }

// GoString returns Redacted, quoted.
func (Secret) GoString() string { return `"` + redisconn.Redacted + `"` }

// secret decodes a string or a reference and returns the value. An error
// names the variable or file, never a value; what names the secret.
func (d *decoder) secret(n *yaml.Node, path, what string) (string, bool) {
	if n.Kind != yaml.MappingNode {
		var s string
		d.scalar(n, path, reflect.ValueOf(&s).Elem(), "")
		return s, !d.src.failed[path]
	}
	var ref struct {
		Env  string `yaml:"env"`
		File string `yaml:"file,path"`
	}
	problems := len(d.errs)
	d.fields(n, path, n.Line, reflect.ValueOf(&ref).Elem())
	hasEnv, hasFile := d.src.has(path+".env"), d.src.has(path+".file")
	switch {
	case len(d.errs) > problems:
		d.src.failed[path] = true // reported inside: not "required" too
	case hasEnv == hasFile:
		d.fail(n, path, "give one of {env: NAME} and {file: PATH}")
	case hasEnv && ref.Env == "":
		d.fail(n, path+".env", "must name an environment variable")
	case hasFile && ref.File == "":
		d.fail(n, path+".file", "must name a file")
	case d.src.unresolvedUnder(path):
		// A producer never delivers: the reference stays unresolved, and
		// the checks of its value are skipped (see source.unresolved).
		d.src.unresolved[path] = true
	case hasEnv:
		if d.getenv(ref.Env) != "" {
			d.src.refs[path] = "{env: " + ref.Env + "}"
			return d.getenv(ref.Env), true
		}
		d.fail(n, path, "environment variable %s is not set or empty", ref.Env)
	default:
		v, msg := redisconn.ReadSecretFile(ref.File, what)
		if msg == "" {
			d.src.refs[path] = "{file: " + ref.File + "}"
			return v, true
		}
		d.fail(n, path, "%s", msg)
	}
	return "", false
}
