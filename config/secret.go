package config

import (
	"reflect"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/internal/redisconn"
)

// Secret is a setting's value that must not leave the process: a webhook
// header or URL. fmt shows it as Redacted with every verb, so a Config
// printed in a log or a test failure hides it.
//
// In the file a secret is a string, or a reference that keeps it out of the
// file, resolved when the file is loaded:
//
//	{env: NAME}   the value of the environment variable NAME
//	{file: PATH}  what the file holds, without a final line break (a
//	              relative PATH is relative to the config file's directory)
//
// redis.password and redis.url take the same references.
type Secret string

// String returns Redacted.
func (Secret) String() string { return redisconn.Redacted }

// GoString returns Redacted, quoted.
func (Secret) GoString() string { return `"` + redisconn.Redacted + `"` }

// secret decodes a string or an {env: NAME} / {file: PATH} reference and
// returns the value. A reference that cannot be resolved is an error naming
// the variable or the file, never a value; what names the secret in it.
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
	case hasEnv:
		if d.getenv(ref.Env) != "" {
			d.src.refs[path] = "{env: " + ref.Env + "}"
			return d.getenv(ref.Env), true
		}
		d.fail(n, path, "environment variable %s is not set or empty", ref.Env)
	case ref.File == "":
		d.fail(n, path+".file", "must name a file")
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
