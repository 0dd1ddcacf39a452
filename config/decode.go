package config

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/internal/textdist"
	"github.com/notify-throttle/throttler/throttle"
)

// decoder walks a YAML node tree onto a Config by the structs' yaml tags,
// once: it checks keys and types, and records every value's line in the
// source (the path-to-line index validation errors use). It reports problems
// and carries on, so one pass finds them all; values are range-checked later
// by Validate.
//
// A tag is `yaml:"key,option..."`; a field without one is its name in lower
// case (throttle.Window's limit and per). Options: required; path (a file
// path, relative to the config file's directory); secret (a string or a
// secret reference, see Secret); null (no value means ""); alias=old (an
// old name of the key, still read); oneof=a|b (the strings allowed).
type decoder struct {
	src  *source
	errs *errorList
	// getenv resolves {env: NAME} references; nil knows no variable.
	getenv func(string) string
}

// filler is a struct with defaults or required keys that depend on what
// the file says: Fill is given the keys present, and reports a key missing
// with required.
type filler interface {
	Fill(has func(key string) bool, required func(key, why string))
}

// requiredKeys are the required keys of structs of other packages, which
// cannot carry yaml tags.
var requiredKeys = map[reflect.Type][]string{reflect.TypeFor[throttle.Window](): {"limit", "per"}}

var (
	durationType = reflect.TypeFor[time.Duration]()
	rawJSONType  = reflect.TypeFor[json.RawMessage]()
	secretType   = reflect.TypeFor[Secret]()
	policyType   = reflect.TypeFor[Policy]()
)

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.src.failed[path] = true
	d.errs.add(&Error{File: d.src.file, Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// decode sets v from n, the value at path; keyLine is the line of its key
// (or list item), where a key missing inside it is reported.
func (d *decoder) decode(n *yaml.Node, path string, keyLine int, v reflect.Value, opts string) {
	n = resolve(n)
	d.src.lines[path] = n.Line
	t := v.Type()
	switch {
	case isNull(n) && hasOpt(opts, "null"):
		v.SetZero()
	case t == durationType:
		d.duration(n, path, v)
	case t == rawJSONType:
		v.SetBytes(d.data(n, path))
	case t == secretType || hasOpt(opts, "secret"):
		if s, ok := d.secret(n, path); ok {
			v.SetString(s)
		}
	case t == policyType && n.Kind == yaml.SequenceNode:
		// A policy's short form: its windows alone, at the policy's path.
		d.decode(n, path, keyLine, v.FieldByName("Windows"), "")
		v.Addr().Interface().(filler).Fill(func(string) bool { return false }, nil)
	case t.Kind() == reflect.Struct:
		d.fields(n, path, keyLine, v)
	case t.Kind() == reflect.Map:
		v.Set(reflect.MakeMap(t))
		d.entries(n, path, func(name string, key, val *yaml.Node, p string) {
			e := reflect.New(t.Elem()).Elem()
			d.decode(val, p, key.Line, e, "")
			v.SetMapIndex(reflect.ValueOf(name), e)
		})
	case t.Kind() == reflect.Slice:
		v.SetZero()
		d.list(n, path, func(item *yaml.Node, p string) {
			e := reflect.New(t.Elem()).Elem()
			d.decode(item, p, item.Line, e, "")
			if !d.src.failed[p] || e.Kind() == reflect.Struct { // a list of strings keeps the good ones
				v.Set(reflect.Append(v, e))
			}
		})
	default:
		d.scalar(n, path, v, opts)
	}
}

// fields decodes a mapping of known keys onto a struct, rejecting unknown
// and duplicate ones. A null value is an empty mapping.
func (d *decoder) fields(n *yaml.Node, path string, keyLine int, v reflect.Value) {
	type field struct {
		key, opts string
		i         int
	}
	var fields []field // the keys and aliases, in the file's order
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		key, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fields = append(fields, field{cmp.Or(key, strings.ToLower(f.Name)), opts, i})
		if alias := optValue(opts, "alias"); alias != "" {
			fields = append(fields, field{alias, opts, i})
		}
	}
	known := make([]string, len(fields))
	for i, f := range fields {
		known[i] = f.key
	}
	present, set := map[string]bool{}, map[int]bool{}
	d.entries(n, path, func(name string, key, val *yaml.Node, p string) {
		i := slices.Index(known, name)
		if i < 0 || key.ShortTag() != "!!str" {
			d.fail(key, p, "unknown key (%s)", suggest(name, known))
			return
		}
		f := fields[i]
		if set[f.i] { // a key and its alias
			first := fields[slices.IndexFunc(fields, func(g field) bool { return g.i == f.i })].key
			d.fail(key, p, "the old name of %s: give only %s", join(path, first), first)
			return
		}
		present[name], set[f.i] = true, true
		d.decode(val, p, key.Line, v.Field(f.i), f.opts)
	})
	if resolve(n).Kind != yaml.MappingNode {
		return
	}
	required := func(key, why string) {
		d.fail(&yaml.Node{Line: keyLine}, join(path, key), "required%s", why)
	}
	for _, f := range fields {
		if (hasOpt(f.opts, "required") || slices.Contains(requiredKeys[v.Type()], f.key)) && !present[f.key] {
			required(f.key, "")
		}
	}
	if fl, ok := v.Addr().Interface().(filler); ok {
		fl.Fill(func(key string) bool { return present[key] }, required)
	}
}

func hasOpt(opts, o string) bool { return slices.Contains(strings.Split(opts, ","), o) }

// optValue returns the value of the tag option name=value, or "".
func optValue(opts, name string) string {
	for _, o := range strings.Split(opts, ",") {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v
		}
	}
	return ""
}

// entries walks a mapping, rejecting duplicate keys. A null value is an
// empty mapping.
func (d *decoder) entries(n *yaml.Node, path string, each func(name string, key, val *yaml.Node, path string)) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "must be a mapping (got %s)", describe(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
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
		each(k.Value, k, n.Content[i+1], p)
	}
}

// list walks a sequence; a null value is an empty list.
func (d *decoder) list(n *yaml.Node, path string, each func(item *yaml.Node, path string)) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "must be a list (got %s)", describe(n))
		return
	}
	for i, item := range n.Content {
		each(resolve(item), fmt.Sprintf("%s[%d]", path, i))
	}
}

// scalar decodes a string, integer, number or boolean.
func (d *decoder) scalar(n *yaml.Node, path string, v reflect.Value, opts string) {
	tag := n.ShortTag()
	ok := n.Kind == yaml.ScalarNode
	switch v.Kind() {
	case reflect.String:
		oneOf := strings.Split(optValue(opts, "oneof"), "|")
		if ok = ok && tag == "!!str"; !ok {
			d.fail(n, path, "must be a string (got %s)", describe(n))
		} else if oneOf[0] != "" && !slices.Contains(oneOf, n.Value) {
			d.fail(n, path, "must be %s (got %s)", strings.Join(oneOf, " or "), quote(n.Value))
		} else if s := n.Value; hasOpt(opts, "path") && s != "" && !filepath.IsAbs(s) {
			v.SetString(filepath.Join(filepath.Dir(d.src.file), s))
		} else {
			v.SetString(s)
		}
	case reflect.Int:
		var i int
		if ok && tag == "!!int" && n.Decode(&i) == nil {
			v.SetInt(int64(i))
		} else {
			d.fail(n, path, "must be an integer (got %s)", describe(n))
		}
	case reflect.Float64:
		var f float64
		switch {
		case !ok || (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil:
			d.fail(n, path, "must be a number (got %s)", describe(n))
		case math.IsInf(f, 0) || math.IsNaN(f):
			d.fail(n, path, "must be a finite number (got %s)", describe(n))
		default:
			v.SetFloat(f)
		}
	case reflect.Bool:
		var b bool
		if ok && tag == "!!bool" && n.Decode(&b) == nil {
			v.SetBool(b)
		} else {
			d.fail(n, path, "must be true or false (got %s)", describe(n))
		}
	default:
		panic(fmt.Sprintf("config: no decoding for %s at %s", v.Type(), path)) // a field type added without one
	}
}

func (d *decoder) duration(n *yaml.Node, path string, v reflect.Value) {
	tag := n.ShortTag()
	if n.Kind == yaml.ScalarNode && (tag == "!!str" || tag == "!!int") {
		if dur, err := parseDuration(n.Value); err == nil {
			v.SetInt(int64(dur))
			return
		}
	}
	d.fail(n, path, "not a duration %s (got %s)", durationSyntax, describe(n))
}

// data turns a campaign's template data, any YAML mapping, into JSON.
func (d *decoder) data(n *yaml.Node, path string) json.RawMessage {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "must be a mapping (got %s)", describe(n))
		return nil
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		d.fail(n, path, "not representable as JSON: %s", yamlMessage(err))
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		d.fail(n, path, "not representable as JSON: keys must be strings and numbers finite")
		return nil
	}
	return b
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
