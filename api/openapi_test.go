package api

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/feedback"
	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/lifecycle"
)

// doc is openapi.yaml, as a tree of maps and lists.
type doc map[string]any

func loadDoc(t *testing.T) doc {
	t.Helper()
	data, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	return doc(m)
}

// at returns the value at a path of keys, failing the test if it is missing.
func (d doc) at(t *testing.T, keys ...string) map[string]any {
	t.Helper()
	var v any = map[string]any(d)
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("openapi.yaml: %s is not a mapping", strings.Join(keys, "."))
		}
		if v, ok = m[k]; !ok {
			t.Fatalf("openapi.yaml: no %s", strings.Join(keys, "."))
		}
	}
	m, _ := v.(map[string]any)
	return m
}

func sortedKeys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// jsonNames returns the JSON names of a struct's fields, sorted.
func jsonNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "-" && name != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestOpenAPIMatchesRoutes: openapi.yaml documents exactly the routes the
// server has, each with exactly the statuses its Route lists (which the
// handler tests check every answer against), and an error is an Error.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	d := loadDoc(t)
	paths := d.at(t, "paths")
	documented := map[string]bool{}
	for _, p := range sortedKeys(paths) {
		for _, m := range sortedKeys(paths[p].(map[string]any)) {
			if m != "parameters" {
				documented[strings.ToUpper(m)+" "+p] = true
			}
		}
	}
	for _, rt := range Routes() {
		key := rt.Method + " " + rt.Path
		if !documented[key] {
			t.Errorf("route %s is not in openapi.yaml", key)
			continue
		}
		delete(documented, key)
		op := d.at(t, "paths", rt.Path, strings.ToLower(rt.Method))
		if op["operationId"] != rt.Name {
			t.Errorf("%s: operationId %v, want %s", key, op["operationId"], rt.Name)
		}
		responses := op["responses"].(map[string]any)
		var got, want []string
		for code := range responses {
			got = append(got, code)
		}
		for _, s := range rt.Statuses {
			want = append(want, strconv.Itoa(s))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: openapi.yaml's statuses %v, the handler's %v", key, got, want)
		}
		if sec, ok := op["security"].([]any); rt.Signed != (ok && len(sec) == 0) {
			t.Errorf("%s: security %v: want [] (no API key) for a route signed by its provider, else the API key", key, op["security"])
		}
		for code, r := range responses {
			resp := d.response(t, r)
			d.checkHeaders(t, key+" "+code, code, !rt.Signed, resp)
			if code[0] == '2' {
				continue
			}
			schema := resp["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
			if schema["$ref"] != "#/components/schemas/Error" {
				t.Errorf("%s %s: schema %v, want the Error", key, code, schema)
			}
		}
	}
	for key := range documented {
		t.Errorf("openapi.yaml documents %s, which the server does not serve", key)
	}
	// What no route answers: every status is documented somewhere.
	unrouted := d.at(t, "x-unrouted")
	var got, want []string
	for code, r := range unrouted {
		got = append(got, code)
		d.checkHeaders(t, "unrouted "+code, code, false, d.response(t, r)) // no key is looked at
	}
	for _, s := range Unrouted {
		want = append(want, strconv.Itoa(s))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("x-unrouted's statuses %v, the server's %v", got, want)
	}
}

// response returns a response, following its $ref.
func (d doc) response(t *testing.T, r any) map[string]any {
	t.Helper()
	m := r.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		return d.at(t, "components", "responses", strings.TrimPrefix(ref, "#/components/responses/"))
	}
	return m
}

// checkHeaders fails the test unless a response of status code documents
// the headers the server sends with it: Request-Id always, the RateLimit
// ones with every answer to a known key (keyed: not a 401; with a 503
// only when Redis answered), Retry-After with a 429 and a 503.
func (d doc) checkHeaders(t *testing.T, what, code string, keyed bool, resp map[string]any) {
	t.Helper()
	headers, _ := resp["headers"].(map[string]any)
	want := []string{RequestIDHeader}
	if keyed && code != "401" && code != "503" {
		want = append(want, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
	}
	if code == "429" || code == "503" {
		want = append(want, "Retry-After")
	}
	for _, h := range want {
		if headers[h] == nil {
			t.Errorf("%s: openapi.yaml does not document the header %s", what, h)
		}
	}
}

// TestOpenAPIMatchesShapes: the schemas name the fields the code reads and
// writes, the error codes it uses and its limits.
func TestOpenAPIMatchesShapes(t *testing.T) {
	d := loadDoc(t)
	schemas := d.at(t, "components", "schemas")
	props := func(name string) []string {
		return sortedKeys(schemas[name].(map[string]any)["properties"].(map[string]any))
	}
	for _, c := range []struct {
		schema string
		want   []string
	}{
		{"Notification", slices.Sorted(slices.Values(intake.Fields))},
		{"State", jsonNames(reflect.TypeFor[View]())},
		{"ErrorDetail", jsonNames(reflect.TypeFor[Error]())},
		{"Error", jsonNames(reflect.TypeFor[errorBody]())},
		{"BatchResult", jsonNames(reflect.TypeFor[batchResult]())},
		{"List", jsonNames(reflect.TypeFor[listAnswer]())},
		{"Event", jsonNames(reflect.TypeFor[lifecycle.Event]())},
		{"FeedbackResult", jsonNames(reflect.TypeFor[feedback.Result]())},
	} {
		if got := props(c.schema); !slices.Equal(got, c.want) {
			t.Errorf("schema %s has %v, the code %v", c.schema, got, c.want)
		}
	}
	var codes []string
	for _, c := range schemas["ErrorDetail"].(map[string]any)["properties"].(map[string]any)["code"].(map[string]any)["enum"].([]any) {
		codes = append(codes, c.(string))
	}
	want := []string{CodeUnauthorized, CodeForbidden, CodeInvalid, CodeTooLarge, CodeNotFound, CodeConflict,
		CodeAlreadySent, CodeNotPending, CodeRateLimited, CodeUnavailable, CodeMethodNotAllowed, CodeUnsupportedMedia,
		CodeBadSignature, CodeReplayed}
	if !slices.Equal(codes, want) {
		t.Errorf("error codes %v, the code's %v", codes, want)
	}
	enum := func(v any) []string {
		var out []string
		for _, s := range v.(map[string]any)["enum"].([]any) {
			out = append(out, s.(string))
		}
		return out
	}
	if got := enum(schemas["State"].(map[string]any)["properties"].(map[string]any)["state"]); !slices.Equal(got, states) {
		t.Errorf("states %v, the code's %v", got, states)
	}
	// The list's parameters are those the server reads, its states too.
	var params []string
	for _, p := range d.at(t, "paths", "/v1/notifications", "get")["parameters"].([]any) {
		p := p.(map[string]any)
		params = append(params, p["name"].(string))
		if p["name"] == "state" {
			if got := enum(p["schema"]); !slices.Equal(got, states) {
				t.Errorf("the list's states %v, the code's %v", got, states)
			}
		}
	}
	if !slices.Equal(params, listParams) {
		t.Errorf("the list's parameters %v, the code's %v", params, listParams)
	}
	var types []string
	for _, ty := range schemas["Event"].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"].([]any) {
		types = append(types, ty.(string))
	}
	if want := fmt.Sprint(lifecycle.Types); fmt.Sprint(types) != want {
		t.Errorf("event types %v, the code's %v", types, want)
	}
	batch := d.at(t, "paths", "/v1/notifications/batch", "post", "requestBody", "content", "application/json", "schema", "properties", "notifications")
	if batch["maxItems"] != MaxBatch {
		t.Errorf("batch maxItems %v, MaxBatch %d", batch["maxItems"], MaxBatch)
	}
	for path, limit := range map[string]int{"/v1/notifications": MaxBody, "/v1/notifications/batch": MaxBatchBody,
		"/v1/feedback/{provider}": MaxFeedbackBody, "/v1/feedback/{provider}/inbound": MaxFeedbackBody} {
		desc := d.at(t, "paths", path, "post", "requestBody")["description"]
		if want := fmt.Sprintf("At most %d bytes.", limit); desc != want {
			t.Errorf("%s: body %q, want %q", path, desc, want)
		}
	}
	// The example of a 400 is what the server says.
	ex, _ := json.Marshal(d.at(t, "components", "responses", "Invalid", "content", "application/json")["example"])
	if want := `{"error":{"code":"invalid","field":"/recipient","message":"recipient: missing"}}`; string(ex) != want {
		t.Errorf("the 400's example %s, want %s", ex, want)
	}
}
