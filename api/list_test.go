package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// page asks for one page of the list with query, failing the test unless
// it is a 200.
func (f *fixture) page(t *testing.T, key string, query url.Values) (ids []string, states []string, next string) {
	t.Helper()
	r := f.do(http.MethodGet, "/v1/notifications?"+query.Encode(), key, "")
	if r.status != http.StatusOK {
		t.Fatalf("GET ?%s = %d %v", query.Encode(), r.status, r.body)
	}
	for _, n := range r.body["notifications"].([]any) {
		n := n.(map[string]any)
		ids = append(ids, n["id"].(string))
		states = append(states, n["state"].(string))
	}
	next, _ = r.body["next_cursor"].(string)
	return ids, states, next
}

// TestList: a tenant's notifications, newest first, a page at a time by
// cursor, filtered by state and by when they were accepted; another
// tenant's are not there, and the list's keys expire.
func TestList(t *testing.T) {
	f := newFixture(t)
	var ids []string // newest first
	for i := range 5 {
		r := f.post(billingKey, fmt.Sprintf(`{"recipient":"r%d@example.com","template":"t"}`, i))
		if r.status != http.StatusAccepted {
			t.Fatal(r.body)
		}
		ids = append([]string{r.body["id"].(string)}, ids...)
	}
	f.post(growthKey, welcome)
	if r := f.do(http.MethodDelete, "/v1/notifications/"+ids[1], billingKey, ""); r.status != http.StatusOK {
		t.Fatal(r.body)
	}

	var got []string
	cursor := ""
	for pages := 0; pages < 5; pages++ {
		q := url.Values{"limit": {"2"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		page, _, next := f.page(t, billingKey, q)
		got = append(got, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("pages of 2 = %v, want %v, newest first, each once", got, ids)
	}
	if page, states, _ := f.page(t, billingKey, url.Values{"state": {"canceled"}}); len(page) != 1 || page[0] != ids[1] || states[0] != "canceled" {
		t.Errorf("state=canceled = %v %v, want only %s", page, states, ids[1])
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if page, _, _ := f.page(t, billingKey, url.Values{"created_after": {future}}); len(page) != 0 {
		t.Errorf("created_after an hour from now = %v, want none", page)
	}
	if page, _, _ := f.page(t, billingKey, url.Values{"created_before": {future}, "created_after": {"2020-01-01T00:00:00Z"}}); len(page) != 5 {
		t.Errorf("created between 2020 and an hour from now = %v, want all 5", page)
	}
	if page, _, _ := f.page(t, growthKey, nil); len(page) != 1 {
		t.Errorf("growth's list = %v, want its own one only", page)
	}
	for name, q := range map[string]url.Values{
		"state":         {"state": {"lost"}},
		"created_after": {"created_after": {"yesterday"}},
		"limit":         {"limit": {"101"}},
		"cursor":        {"cursor": {"not-a-cursor"}},
		"colour":        {"colour": {"red"}},
	} {
		r := f.do(http.MethodGet, "/v1/notifications?"+q.Encode(), billingKey, "")
		if code, field := r.errorOf(t); r.status != http.StatusBadRequest || code != CodeInvalid || field != name {
			t.Errorf("?%s = %d %s %q, want 400 %s %s", q.Encode(), r.status, code, field, CodeInvalid, name)
		}
	}
	keys, err := f.rdb.Keys(context.Background(), "*api:list:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no list keys: %v", err)
	}
	for _, k := range keys {
		if ttl := f.rdb.PTTL(context.Background(), k).Val(); ttl <= ListRetention || ttl > ListRetention+time.Hour {
			t.Errorf("%s expires in %v, want an hour's end plus %v", k, ttl, ListRetention)
		}
	}
}
