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

// decoder walks a YAML node tree onto a Config once, by the structs' yaml
// tags, rejecting unknown and duplicate keys and mistyped values, indexing
// each value's line for later errors, and carrying on past a problem so
// one pass finds them all (yaml.v3's KnownFields names Go types, takes yes
// for true and 9464 for a string, and drops a duplicate key's mapping).
// A tag is `yaml:"key,option..."` (no key: the field's name in lower case);
// a map's options apply to its values. Options: required; path (relative to
// the config file); secret=what (see Secret; what names it in messages);
// null (no value means ""); alias=old (an old name); oneof=a|b.
type decoder struct {
	src    *source
	errs   errorList
	getenv func(string) string // resolves {env: NAME}
}

// filler is a struct whose defaults or required keys depend on the keys
// the file sets (has); Fill reports a missing one with required.
type filler interface {
	Fill(has func(key string) bool, required func(key, why string))
}

// requiredKeys are those of structs from packages without yaml tags.
var requiredKeys = map[reflect.Type][]string{reflect.TypeFor[throttle.Window](): {"limit", "per"}}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.src.failed[path] = true
	d.errs = append(d.errs, &Error{File: d.src.file, Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// decode sets v from n, the value at path; a key missing inside it is
// reported on keyLine, that of its key or list item.
func (d *decoder) decode(n *yaml.Node, path string, keyLine int, v reflect.Value, opts string) {
	n = resolve(n)
	d.src.lines[path] = n.Line
	t := v.Type()
	switch {
	case isNull(n) && hasOpt(opts, "null"):
		v.SetZero()
	case t == reflect.TypeFor[time.Duration]():
		if dur, err := parseDuration(n.Value); err == nil && n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!str" || n.ShortTag() == "!!int") {
			v.SetInt(int64(dur))
		} else {
			d.fail(n, path, "not a duration %s (got %s)", durationSyntax, describe(n))
		}
	case t == reflect.TypeFor[json.RawMessage]():
		v.SetBytes(d.data(n, path))
	case optValue(opts, "secret") != "" && t.Kind() == reflect.String:
		if s, ok := d.secret(n, path, optValue(opts, "secret")); ok {
			v.SetString(s)
		}
	case t == reflect.TypeFor[Policy]() && n.Kind == yaml.SequenceNode:
		// A policy's short form: its windows alone, at the policy's path.
		d.decode(n, path, keyLine, v.FieldByName("Windows"), "")
		v.Addr().Interface().(filler).Fill(func(string) bool { return false }, nil)
	case t.Kind() == reflect.Struct:
		d.fields(n, path, keyLine, v)
	case t.Kind() == reflect.Map:
		v.Set(reflect.MakeMap(t))
		d.entries(n, path, func(name string, key, val *yaml.Node, p string) {
			e := reflect.New(t.Elem()).Elem()
			d.decode(val, p, key.Line, e, opts)
			v.SetMapIndex(reflect.ValueOf(name), e)
		})
	case t.Kind() == reflect.Slice:
		v.SetZero()
		if d.kind(n, path, yaml.SequenceNode, "a list") {
			for i, item := range n.Content {
				item, p := resolve(item), fmt.Sprintf("%s[%d]", path, i)
				e := reflect.New(t.Elem()).Elem()
				d.decode(item, p, item.Line, e, "")
				if !d.src.failed[p] || e.Kind() == reflect.Struct { // a list of strings keeps the good ones
					v.Set(reflect.Append(v, e))
				}
			}
		}
	default:
		d.scalar(n, path, v, opts)
	}
}

// fields decodes a mapping of known keys onto a struct; null is empty.
func (d *decoder) fields(n *yaml.Node, path string, keyLine int, v reflect.Value) {
	type field struct {
		key, opts string
		i         int
	}
	var fields []field // the keys and aliases, in the struct's order
	var known []string
	for i := range v.NumField() {
		f := v.Type().Field(i)
		key, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		for _, k := range []string{cmp.Or(key, strings.ToLower(f.Name)), optValue(opts, "alias")} {
			if f.IsExported() && k != "" {
				fields, known = append(fields, field{k, opts, i}), append(known, k)
			}
		}
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

// kind reports whether n is of kind k (what: "a list"), and a problem
// unless it is that or null.
func (d *decoder) kind(n *yaml.Node, path string, k yaml.Kind, what string) bool {
	if n.Kind != k && !isNull(n) {
		d.fail(n, path, "must be %s (got %s)", what, describe(n))
	}
	return n.Kind == k
}

// entries walks a mapping, rejecting duplicate keys; null is empty.
func (d *decoder) entries(n *yaml.Node, path string, each func(name string, key, val *yaml.Node, path string)) {
	if n = resolve(n); !d.kind(n, path, yaml.MappingNode, "a mapping") {
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
			d.errs = append(d.errs, &Error{File: d.src.file, Line: k.Line, Path: p, Msg: fmt.Sprintf("duplicate key (first at line %d)", first)})
			continue
		}
		seen[k.Value] = k.Line
		each(k.Value, k, n.Content[i+1], p)
	}
}

// scalars are the YAML tags each scalar kind takes, and its name in messages.
var scalars = map[reflect.Kind]struct{ tags, what string }{
	reflect.String: {"!!str", "a string"}, reflect.Int: {"!!int", "an integer"},
	reflect.Float64: {"!!int !!float", "a number"}, reflect.Bool: {"!!bool", "true or false"},
}

// scalar decodes a string, integer, number or boolean; on error v keeps its value.
func (d *decoder) scalar(n *yaml.Node, path string, v reflect.Value, opts string) {
	s, ok := scalars[v.Kind()]
	if !ok {
		panic(fmt.Sprintf("config: no decoding for %s at %s", v.Type(), path)) // a field type added without one
	}
	x := reflect.New(v.Type())
	if n.Kind != yaml.ScalarNode || !slices.Contains(strings.Fields(s.tags), n.ShortTag()) || n.Decode(x.Interface()) != nil {
		d.fail(n, path, "must be %s (got %s)", s.what, describe(n))
		return
	}
	oneOf := strings.Split(optValue(opts, "oneof"), "|")
	switch x := x.Elem(); {
	case v.Kind() == reflect.Float64 && (math.IsInf(x.Float(), 0) || math.IsNaN(x.Float())):
		d.fail(n, path, "must be a finite number (got %s)", describe(n))
	case oneOf[0] != "" && !slices.Contains(oneOf, n.Value):
		d.fail(n, path, "must be %s (got %s)", strings.Join(oneOf, " or "), quote(n.Value))
	case hasOpt(opts, "path") && n.Value != "" && !filepath.IsAbs(n.Value):
		v.SetString(filepath.Join(filepath.Dir(d.src.file), n.Value))
	default:
		v.Set(x)
	}
}

// data turns a campaign's template data, any YAML mapping, into JSON.
func (d *decoder) data(n *yaml.Node, path string) json.RawMessage {
	var v map[string]any
	if !d.kind(n, path, yaml.MappingNode, "a mapping") {
		return nil
	} else if err := n.Decode(&v); err != nil {
		d.fail(n, path, "not representable as JSON: %s", yamlMessage(err))
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		d.fail(n, path, "not representable as JSON: keys must be strings and numbers finite")
	}
	return b
}

// join appends a key to a path, quoting a key that would garble a message.
func join(path, key string) string {
	if key == "" || len(key) > maxShown || strings.IndexFunc(key, func(r rune) bool { return !unicode.IsGraphic(r) }) >= 0 {
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

// describe shows a node as a message's "got".
func describe(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind != yaml.ScalarNode:
		return "nothing"
	case isNull(n):
		return "null"
	case n.ShortTag() == "!!str" || len(n.Value) > maxShown || strings.IndexFunc(n.Value, func(r rune) bool { return !unicode.IsGraphic(r) || r == ' ' }) >= 0:
		return quote(n.Value)
	}
	return n.Value
}

// suggest names the known key closest to an unknown one if it may be a
// typo, else lists them.
func suggest(key string, known []string) string {
	if best, ok := Closest(key, known); ok {
		return "did you mean " + best + "?"
	}
	return "known: " + strings.Join(known, ", ")
}

// Closest returns the one of known nearest to name, case aside, and true
// if name may be a typo of it.
func Closest(name string, known []string) (string, bool) {
	best, bestDist := "", math.MaxInt
	for _, k := range known {
		if d := textdist.Distance(strings.ToLower(name), strings.ToLower(k)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best, bestDist <= max(1, min(len(name), len(best))/3)
}

// Listed lists names, sorted, up to 10 and "...", for a message.
func Listed(names []string) string {
	names = slices.Sorted(slices.Values(names))
	if len(names) > 10 {
		names = append(names[:10], "...")
	}
	return strings.Join(names, ", ")
}
