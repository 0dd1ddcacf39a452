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
		for code, r := range responses {
			if code[0] == '2' {
				continue
			}
			ref, _ := r.(map[string]any)["$ref"].(string)
			resp := d.at(t, "components", "responses", strings.TrimPrefix(ref, "#/components/responses/"))
			schema := resp["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
			if schema["$ref"] != "#/components/schemas/Error" {
				t.Errorf("%s %s: schema %v, want the Error", key, code, schema)
			}
		}
	}
	for key := range documented {
		t.Errorf("openapi.yaml documents %s, which the server does not serve", key)
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
		{"Event", jsonNames(reflect.TypeFor[lifecycle.Event]())},
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
		CodeAlreadySent, CodeNotPending, CodeRateLimited, CodeUnavailable, CodeMethodNotAllowed}
	if !slices.Equal(codes, want) {
		t.Errorf("error codes %v, the code's %v", codes, want)
	}
	var states []string
	for _, s := range schemas["State"].(map[string]any)["properties"].(map[string]any)["state"].(map[string]any)["enum"].([]any) {
		states = append(states, s.(string))
	}
	if want := []string{stateQueued, stateWaiting, stateSending, stateSent, stateCompleted, stateArchived, stateCanceled}; !slices.Equal(states, want) {
		t.Errorf("states %v, the code's %v", states, want)
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
	for path, limit := range map[string]int{"/v1/notifications": MaxBody, "/v1/notifications/batch": MaxBatchBody} {
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
