package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
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
// returns the value. A reference that cannot be resolved is an error naming
// the variable or the file, never a value.
func (d *decoder) secret(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.MappingNode {
		var s string
		d.scalar(n, path, reflect.ValueOf(&s).Elem(), "")
		return s, !d.src.failed[path]
	}
	var ref struct {
		Env  string `yaml:"env"`
		File string `yaml:"file,path"`
	}
	d.fields(n, path, n.Line, reflect.ValueOf(&ref).Elem())
	hasEnv, hasFile := d.src.has(path+".env"), d.src.has(path+".file")
	switch {
	case d.src.failedAt(path) || d.src.failedUnder(path):
		d.src.failed[path] = true // reported inside: not "required" too
	case hasEnv == hasFile:
		d.fail(n, path, "give one of {env: NAME} and {file: PATH}")
	case hasEnv && ref.Env == "":
		d.fail(n, path+".env", "must name an environment variable")
	case hasEnv:
		if d.getenv != nil && d.getenv(ref.Env) != "" {
			d.src.refs[path] = "{env: " + ref.Env + "}"
			return d.getenv(ref.Env), true
		}
		d.fail(n, path, "environment variable %s is not set or empty", ref.Env)
	case ref.File == "":
		d.fail(n, path+".file", "must name a file")
	default:
		v, msg := readSecretFile(ref.File, secretWhat(path))
		if msg == "" {
			d.src.refs[path] = "{file: " + ref.File + "}"
			return v, true
		}
		d.fail(n, path, "%s", msg)
	}
	return "", false
}

// secretWhat names the secret at path for a message about its file.
func secretWhat(path string) string {
	switch {
	case strings.HasSuffix(path, ".password"):
		return "password"
	case strings.HasSuffix(path, ".url"):
		return "URL"
	}
	return "header value"
}

// maxFileLen bounds the files settings name (secrets, CA, certificate,
// key): they are small, and a path to something else (a device, a log)
// should fail, not fill memory.
const maxFileLen = 1 << 20

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
