package config

import (
	"fmt"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
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
func (Secret) String() string { return Redacted }

// GoString returns Redacted, quoted.
func (Secret) GoString() string { return `"` + Redacted + `"` }

// secret decodes a string or an {env: NAME} / {file: PATH} reference and
// returns the value. what names the secret in messages about a file's
// contents ("password", "secret"). A reference that cannot be resolved is
// an error naming the variable or the file, never a value.
func (d *decoder) secret(n *yaml.Node, path, what string) (string, bool) {
	if resolve(n).Kind != yaml.MappingNode {
		return d.str(n, path)
	}
	var env, file string
	has := d.mapping(n, path, []field{
		{"env", d.setString(&env)},
		{"file", d.setString(&file)},
	})
	line := resolve(n)
	switch {
	case d.src.failedAt(path) || d.failedUnder(path):
		d.src.failed[path] = true // reported inside: not "required" too
	case has["env"] == has["file"]:
		d.fail(line, path, "give one of {env: NAME} and {file: PATH}")
	case has["env"] && env == "":
		d.fail(line, path+".env", "must name an environment variable")
	case has["env"]:
		if v := d.lookupEnv(env); v != "" {
			d.src.refs[path] = "{env: " + env + "}"
			return v, true
		}
		d.fail(line, path, "environment variable %s is not set or empty", env)
	case file == "":
		d.fail(line, path+".file", "must name a file")
	default:
		if !filepath.IsAbs(file) {
			file = filepath.Join(filepath.Dir(d.src.file), file)
		}
		if v, msg := readSecretFile(file, what); msg == "" {
			d.src.refs[path] = "{file: " + file + "}"
			return v, true
		} else {
			d.fail(line, path, "%s", msg)
		}
	}
	return "", false
}

func (d *decoder) lookupEnv(name string) string {
	if d.getenv == nil {
		return ""
	}
	return d.getenv(name)
}

// failedUnder reports whether decoding reported a problem inside path.
func (d *decoder) failedUnder(path string) bool {
	for p := range d.src.failed {
		if strings.HasPrefix(p, path+".") {
			return true
		}
	}
	return false
}

// readSecretFile returns the one line the file at path holds, or what is
// wrong with the file. The message never shows what the file holds.
func readSecretFile(path, what string) (value, msg string) {
	data, msg := readSmallFile(path)
	if msg != "" {
		return "", msg
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	switch {
	case v == "":
		return "", fmt.Sprintf("%s is empty", quote(path))
	case strings.ContainsAny(v, "\r\n"):
		return "", fmt.Sprintf("%s holds more than one line: put the %s alone on one line", quote(path), what)
	}
	return v, ""
}

// shown is how a message quotes the value of the setting at path: u with
// its password redacted, or, for a value from a secret reference, the
// reference.
func (s *source) shown(path, u string) string {
	if s != nil && s.refs[path] != "" {
		return "the value of " + s.refs[path]
	}
	return quote(RedactURL(u))
}
