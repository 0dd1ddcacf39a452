package config

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/internal/textdist"
)

// decoder walks a YAML node tree onto a Config, checking keys and types and
// recording every value's line. It reports problems and carries on, so one
// pass finds them all; values are range-checked later by Validate.
type decoder struct {
	src  *source
	errs *errorList
	// getenv resolves {env: NAME} references; nil knows no variable.
	getenv func(string) string
}

// field is one key of a mapping with a fixed set of keys.
type field struct {
	key    string
	decode func(n *yaml.Node, path string)
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.src.failed[path] = true
	d.errs.add(&Error{File: d.src.file, Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// required reports a missing key; at is the key or list item holding the
// mapping, so the line points at what lacks it.
func (d *decoder) required(at *yaml.Node, path, why string) {
	d.fail(at, path, "required%s", why)
}

// join appends a key to a path, quoting a key that would garble a message.
func join(path, key string) string {
	if len(key) > maxShown || strings.IndexFunc(key, func(r rune) bool { return !unicode.IsGraphic(r) }) >= 0 {
		key = quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe shows a node as a message's "got": "5 seconds" quoted when a
// string, a list, a mapping, or the scalar as written.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch {
		case n.ShortTag() == "!!str":
			return quote(n.Value)
		case isNull(n):
			return "null"
		case len(n.Value) > maxShown || strings.IndexFunc(n.Value, func(r rune) bool { return !unicode.IsGraphic(r) || r == ' ' }) >= 0:
			return quote(n.Value)
		}
		return n.Value
	}
	return "nothing"
}

// entries walks a mapping whose keys are names the file chooses (policies,
// providers, queues, headers), rejecting duplicates. A null value is an
// empty mapping. It reports whether n was a mapping.
func (d *decoder) entries(n *yaml.Node, path string, each func(name string, key, val *yaml.Node, path string)) bool {
	n = resolve(n)
	d.src.lines[path] = n.Line
	if isNull(n) {
		return true
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "must be a mapping (got %s)", describe(n))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "a key must be a name (got %s)", describe(k))
			continue
		}
		p := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			// Not marked failed: the first value is still checked.
			d.errs.add(&Error{File: d.src.file, Line: k.Line, Path: p, Msg: fmt.Sprintf("duplicate key (first at line %d)", first)})
			continue
		}
		seen[k.Value] = k.Line
		d.src.lines[p] = v.Line
		each(k.Value, k, v, p)
	}
	return true
}

// mapping walks a mapping of known keys, rejecting unknown and duplicate
// ones, and returns the keys present. A null value is an empty mapping.
func (d *decoder) mapping(n *yaml.Node, path string, fields []field) map[string]bool {
	present := map[string]bool{}
	known := make([]string, len(fields))
	for i, f := range fields {
		known[i] = f.key
	}
	d.entries(n, path, func(name string, key, val *yaml.Node, p string) {
		for _, f := range fields {
			if f.key == name && key.ShortTag() == "!!str" {
				present[name] = true
				f.decode(val, p)
				return
			}
		}
		d.fail(key, p, "unknown key (%s)", suggest(name, known))
	})
	return present
}

// list walks a sequence; a null value is an empty list.
func (d *decoder) list(n *yaml.Node, path string, each func(i int, item *yaml.Node, path string)) bool {
	n = resolve(n)
	d.src.lines[path] = n.Line
	if isNull(n) {
		return true
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "must be a list (got %s)", describe(n))
		return false
	}
	for i, item := range n.Content {
		item = resolve(item)
		p := fmt.Sprintf("%s[%d]", path, i)
		d.src.lines[p] = item.Line
		each(i, item, p)
	}
	return true
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.fail(n, path, "must be a string (got %s)", describe(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(n *yaml.Node, path string) (int, bool) {
	n = resolve(n)
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		d.fail(n, path, "must be an integer (got %s)", describe(n))
		return 0, false
	}
	return v, true
}

func (d *decoder) number(n *yaml.Node, path string) (float64, bool) {
	n = resolve(n)
	var v float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&v) != nil {
		d.fail(n, path, "must be a number (got %s)", describe(n))
		return 0, false
	}
	if math.IsInf(v, 0) || math.IsNaN(v) {
		d.fail(n, path, "must be a finite number (got %s)", describe(n))
		return 0, false
	}
	return v, true
}

func (d *decoder) duration(n *yaml.Node, path string) (time.Duration, bool) {
	n = resolve(n)
	tag := n.ShortTag()
	if n.Kind == yaml.ScalarNode && (tag == "!!str" || tag == "!!int") {
		if v, err := parseDuration(n.Value); err == nil {
			return v, true
		}
	}
	d.fail(n, path, "not a duration %s (got %s)", durationSyntax, describe(n))
	return 0, false
}

// Setters for mapping fields: each decodes the value into *p if it is right.

func (d *decoder) setString(p *string) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.str(n, path); ok {
			*p = v
		}
	}
}

func (d *decoder) setInt(p *int) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.integer(n, path); ok {
			*p = v
		}
	}
}

func (d *decoder) setNumber(p *float64) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.number(n, path); ok {
			*p = v
		}
	}
}

func (d *decoder) setDuration(p *time.Duration) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.duration(n, path); ok {
			*p = v
		}
	}
}

// setSecret decodes a string or a secret reference (see Secret) into *p.
func setSecret[T ~string](d *decoder, p *T, what string) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.secret(n, path, what); ok {
			*p = T(v)
		}
	}
}

func (d *decoder) setStrings(p *[]string) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		var out []string
		d.list(n, path, func(_ int, item *yaml.Node, p string) {
			if v, ok := d.str(item, p); ok {
				out = append(out, v)
			}
		})
		*p = out
	}
}

// suggest names the known key closest to an unknown one, when it is close
// enough to be a typo, or lists the known keys.
func suggest(key string, known []string) string {
	best, bestDist := "", math.MaxInt
	for _, k := range known {
		if d := textdist.Distance(strings.ToLower(key), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" && bestDist <= max(1, min(len(key), len(best))/3) {
		return "did you mean " + best + "?"
	}
	return "known: " + strings.Join(known, ", ")
}
