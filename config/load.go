package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Load is LoadWithEnv reading the environment with os.Getenv.
func Load(path string) (*Config, error) {
	return LoadWithEnv(path, os.Getenv)
}

// LoadWithEnv reads and validates the configuration file at path, a
// non-empty REDIS_URL or REDIS_PASSWORD from getenv replacing the file's
// (errors about it name the variable). The error is an *Error or several
// joined, or wraps the os error.
func LoadWithEnv(path string, getenv func(string) string) (*Config, error) {
	return load(path, getenv, nil)
}

// LoadProducer is LoadWithEnv for enqueue, which never delivers: the secret
// references of the providers, the API's keys and the callbacks are checked
// for their form only and left empty; Redis's password is resolved.
func LoadProducer(path string, getenv func(string) string) (*Config, error) {
	return load(path, getenv, []string{"providers.", "api.keys.", "events.callbacks."})
}

// LoadAPI is LoadProducer for worker -api-only: the API's keys and the
// providers' feedback blocks are resolved as well.
func LoadAPI(path string, getenv func(string) string) (*Config, error) {
	return load(path, getenv, []string{"providers.", "events.callbacks."}, ".feedback.")
}

func load(path string, getenv func(string) string, unresolved []string, resolvedInside ...string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parse(path, data, getenv, unresolved, resolvedInside...)
}

// Environment variables that replace settings.
const (
	EnvRedisURL      = "REDIS_URL"      // redis.url and redis.cluster
	EnvRedisPassword = "REDIS_PASSWORD" // redis.password and redis.password_file
)

// Parse is LoadWithEnv of a file's contents, named name, with no environment.
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, func(string) string { return "" }, nil)
}

// parse decodes and validates a file, leaving the secret references under
// the unresolved path prefixes unresolved, but for those whose path holds
// resolvedInside.
func parse(name string, data []byte, getenv func(string) string, unresolved []string, resolvedInside ...string) (*Config, error) {
	root, err := parseYAML(name, data)
	if err != nil {
		return nil, err
	}
	c := Default()
	c.src = newSource(name)
	c.src.unresolvedPrefixes, c.src.resolvedInside = unresolved, resolvedInside
	d := decoder{src: c.src, getenv: getenv}
	d.decode(root, "", root.Line, reflect.ValueOf(c).Elem(), "")
	if u := getenv(EnvRedisURL); u != "" {
		c.Redis.URL, c.Redis.Cluster = u, nil
		c.src.env["redis.url"] = EnvRedisURL // errors about it name the variable
	}
	if pw := getenv(EnvRedisPassword); pw != "" {
		c.Redis.Password, c.Redis.PasswordFile = pw, ""
		c.src.env["redis.password"] = EnvRedisPassword
	}
	c.validate(&d.errs)
	if err := d.errs.err(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseYAML returns the root node of the file's one YAML document.
func parseYAML(name string, data []byte) (*yaml.Node, error) {
	var doc, next yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	err := dec.Decode(&doc)
	if err == nil {
		if err = dec.Decode(&next); err == nil {
			return nil, &Error{File: name, Line: max(next.Line, 1), Msg: "a second YAML document: put every setting in one"}
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(name, data, err)
	}
	if len(doc.Content) == 0 || isNull(resolve(doc.Content[0])) { // no document, or an empty one
		return nil, &Error{File: name, Line: max(doc.Line, 1), Msg: "empty: no settings (see the example config.yaml)"}
	}
	return doc.Content[0], nil
}

var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// syntaxError turns a YAML parser error into an *Error on yaml's line;
// yaml gives none on line 1 or for unreadable bytes, so we find the first.
func syntaxError(name string, data []byte, err error) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		if tab := tabIndented(data, line); tab > 0 {
			return &Error{File: name, Line: tab, Msg: "tabs are not allowed for indentation in YAML; use spaces (" + m[2] + ")"}
		}
		return &Error{File: name, Line: line, Msg: m[2]}
	}
	return &Error{File: name, Line: unreadableLine(data), Msg: yamlMessage(err)}
}

// tabIndented returns the first line up to line whose indentation holds a
// tab, or 0: YAML's parser, meeting one, says only "found character that
// cannot start any token", on that line or a later one.
func tabIndented(data []byte, line int) int {
	for i, l := range bytes.SplitN(data, []byte("\n"), line+1) {
		if i >= line {
			break
		}
		indent := l[:len(l)-len(bytes.TrimLeft(l, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 && len(bytes.TrimSpace(l)) > 0 && l[len(indent)] != '#' {
			return i + 1
		}
	}
	return 0
}

// yamlMessage is a yaml error on one line without its "yaml: " prefix.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return strings.Join(te.Errors, "; ")
	}
	return strings.ReplaceAll(strings.TrimPrefix(err.Error(), "yaml: "), "\n", " ")
}

// unreadableLine returns the line of the first byte that is not UTF-8 or is
// a character YAML 1.2 does not allow (a BOM only first), or 1.
func unreadableLine(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		ok := r == '\t' || r == '\n' || r == '\r' || r == 0x85 || r >= 0x20 && r <= 0x7E || r >= 0xA0 && r <= 0xD7FF ||
			r >= 0xE000 && r <= 0xFFFD && (r != '\uFEFF' || i == 0) || r >= 0x10000 && r <= 0x10FFFF
		if !ok || r == utf8.RuneError && size == 1 {
			return 1 + bytes.Count(data[:i], []byte("\n"))
		}
		i += size
	}
	return 1
}
