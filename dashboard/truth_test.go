package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// truthYAML has a policy of every over_cap, calendar windows, quiet hours
// (%s: its ranges) in a zone of its own, and counts_toward.
const truthYAML = `
worker:
  queues: {default: 1}
policies:
  marketing: {windows: [{limit: 1, per: 24h}], over_cap: defer, max_delay: 48h}
  promo: {windows: [{limit: 1, per: 24h}], over_cap: drop}
  weekly: {windows: [{limit: 1, per: 24h}], over_cap: digest}
  news: {calendar: [{limit: 1, per: day}], quiet: [%q], timezone: Europe/London}
  reset: {windows: [{limit: 5, per: 1h}], counts_toward: [marketing], shadow: true}
providers:
  sms: {type: log, rate: 2, burst: 1}
  push: {type: log, rate: 1000, burst: 100, priority_reserve: 10, shadow: true}
defaults: {policy: marketing, provider: push}
`

// quietNow returns a quiet range in Europe/London that holds now and ends
// in two hours, and that end.
func quietNow(t *testing.T) (string, time.Time) {
	t.Helper()
	london, err := time.LoadLocation("Europe/London")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(london)
	from, until := now.Add(-time.Hour).Truncate(time.Minute), now.Add(2*time.Hour).Truncate(time.Minute)
	return from.Format("15:04") + "-" + until.Format("15:04"), until
}

// TestPoliciesShowTheRunningConfig: every column of the policies and
// providers is the running config's, over_cap included, and a reload
// (Options.Current) shows at once.
func TestPoliciesShowTheRunningConfig(t *testing.T) {
	quiet, _ := quietNow(t)
	yaml := fmt.Sprintf(truthYAML, quiet)
	start, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var running atomic.Pointer[config.Config]
	running.Store(start)
	e := newEnvYAML(t, yaml, nil, func(o *Options) { o.Config, o.Current = start, running.Load })

	type pol struct {
		Windows      string
		OverCap      string
		MaxDelay     string
		Calendar     []string
		Quiet        []string
		Timezone     string
		CountsToward []string
		Shadow       bool
	}
	policies := func() map[string]pol {
		var p page[policyView]
		e.getJSON(t, "/throttle/api/policies", &p)
		out := map[string]pol{}
		for _, it := range p.Items {
			var ws []string
			for _, w := range it.Windows {
				ws = append(ws, fmt.Sprintf("%d per %s", w.Limit, w.Per))
			}
			out[it.Name] = pol{strings.Join(ws, ", "), it.OverCap, it.MaxDelay, it.Calendar, it.Quiet, it.Timezone, it.CountsToward, it.Shadow}
		}
		return out
	}
	want := map[string]pol{
		"marketing": {"1 per 24h", "defer", "48h", []string{}, []string{}, "UTC", []string{}, false},
		"promo":     {"1 per 24h", "drop", "", []string{}, []string{}, "UTC", []string{}, false},
		"weekly":    {"1 per 24h", "digest", "", []string{}, []string{}, "UTC", []string{}, false},
		"news":      {"", "defer", "", []string{"1 per day"}, []string{quiet}, "Europe/London", []string{}, false},
		"reset":     {"5 per 1h", "defer", "", []string{}, []string{}, "UTC", []string{"marketing"}, true},
	}
	if got := policies(); !reflect.DeepEqual(got, want) {
		t.Errorf("policies (-want +got)\n-%+v\n+%+v", want, got)
	}
	code, body := e.get(t, "/throttle")
	for _, s := range []string{`<td data-field="over-cap">drop</td>`, `<td data-field="over-cap">digest</td>`,
		`<td data-field="over-cap">defer (at most 48h)</td>`} {
		if code != http.StatusOK || !strings.Contains(body, s) {
			t.Errorf("the page does not show %s", s)
		}
	}

	// A reload: promo now defers under 2 per 1h, sms goes at 5/s.
	reloaded, err := config.Parse("test.yaml", []byte(strings.NewReplacer(
		"promo: {windows: [{limit: 1, per: 24h}], over_cap: drop}", "promo: {windows: [{limit: 2, per: 1h}]}",
		"sms: {type: log, rate: 2, burst: 1}", "sms: {type: log, rate: 5, burst: 3}").Replace(yaml)))
	if err != nil {
		t.Fatal(err)
	}
	running.Store(reloaded)
	want["promo"] = pol{"2 per 1h", "defer", "", []string{}, []string{}, "UTC", []string{}, false}
	if got := policies(); !reflect.DeepEqual(got, want) {
		t.Errorf("policies after a reload (-want +got)\n-%+v\n+%+v", want, got)
	}
	var p page[providerView]
	e.getJSON(t, "/throttle/api/providers", &p)
	got := map[string]string{}
	for _, it := range p.Items {
		got[it.Name] = fmt.Sprintf("%s %g/s burst %d reserve %d shadow %t", it.Type, it.Rate, it.Burst, it.PriorityReserve, it.Shadow)
	}
	wantProv := map[string]string{"sms": "log 5/s burst 3 reserve 0 shadow false", "push": "log 1000/s burst 100 reserve 10 shadow true"}
	if !reflect.DeepEqual(got, wantProv) {
		t.Errorf("providers after a reload (-want +got)\n-%v\n+%v", wantProv, got)
	}
}

// policyOf returns the named policy of a recipient view.
func policyOf(t *testing.T, r recipientView, name string) recipientPolicy {
	t.Helper()
	for _, p := range r.Policies {
		if p.Policy == name {
			return p
		}
	}
	t.Fatalf("no policy %s in %+v", name, r.Policies)
	return recipientPolicy{}
}

// kinds returns the kinds of a policy's rules, in order.
func kinds(p recipientPolicy) []string {
	var out []string
	for _, r := range p.Rules {
		out = append(out, r.Kind)
	}
	return out
}

// TestRecipientHeldByQuietHours: a recipient in quiet hours (in the
// policy's zone, London) is held by them until they end, as an admission
// would be; every rule that can hold it is listed.
func TestRecipientHeldByQuietHours(t *testing.T) {
	quiet, end := quietNow(t)
	e := newEnvYAML(t, fmt.Sprintf(truthYAML, quiet), nil)
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/alice@example.com?provider=sms", &r)
	news := policyOf(t, r, "news")
	if want := []string{"calendar", "quiet", "provider"}; !reflect.DeepEqual(kinds(news), want) {
		t.Errorf("news's rules: %v, want %v", kinds(news), want)
	}
	h := news.HeldBy
	if h == nil || h.Kind != "quiet" || h.Rule != "quiet "+quiet || h.Until == nil || !h.Until.Equal(end) {
		t.Fatalf("news held by %+v, want quiet %s until %s", h, quiet, end)
	}
	if news.DecidedBy != "quiet "+quiet || !news.Next.Equal(end) || news.Zone != "Europe/London" || news.Provider != "sms" {
		t.Errorf("news: next %s by %q in %s via %s; want %s by quiet %s in Europe/London via sms",
			news.Next, news.DecidedBy, news.Zone, news.Provider, end, quiet)
	}
	// In another zone the same hours are placed elsewhere: in Tokyo,
	// 9 hours ahead of London in winter, they do not hold now.
	e.getJSON(t, "/throttle/api/recipients/alice@example.com?provider=sms&tz=Asia/Tokyo", &r)
	if tokyo := policyOf(t, r, "news"); tokyo.Zone != "Asia/Tokyo" {
		t.Errorf("news with tz=Asia/Tokyo is placed in %s", tokyo.Zone)
	}
	if m := policyOf(t, r, "marketing"); m.HeldBy != nil || m.DecidedBy != "" || kinds(m)[0] != "window" {
		t.Errorf("marketing with no history: held by %+v, rules %v; want nothing holding it", m.HeldBy, kinds(m))
	}
	code, body := e.get(t, "/throttle?recipient=alice@example.com&provider=sms")
	if code != http.StatusOK || !strings.Contains(body, "held by <span data-field=\"decided-by\">quiet "+quiet+"</span>") {
		t.Errorf("the page does not say news is held by quiet %s: %d", quiet, code)
	}
}

// TestRecipientHeldByCalendarWindow: a recipient who had the day's message
// is held by the calendar window until the next local midnight.
func TestRecipientHeldByCalendarWindow(t *testing.T) {
	e := newEnvYAML(t, strings.Replace(fmt.Sprintf(truthYAML, "x"), `quiet: ["x"], `, "", 1), nil)
	cals, _, loc, err := e.cfg.Local("news")
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.lim.Admit(context.Background(), throttle.Request{ID: "day-1", Takes: []throttle.Take{
		{Rule: cals[0].In(loc, time.Now()), Subject: "bob"}}})
	if err != nil || !d.Allowed() {
		t.Fatalf("first admission: %+v, %v", d, err)
	}
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/bob?tz=Europe/London", &r)
	news := policyOf(t, r, "news")
	now := d.Now.In(loc)
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, loc)
	h := news.HeldBy
	if h == nil || h.Kind != "calendar" || h.Rule != "1 per calendar day" || !h.Until.Equal(midnight) {
		t.Fatalf("news held by %+v, want the calendar day until %s", h, midnight)
	}
	if news.Rules[0].Kind != "calendar" || !news.Rules[0].Holds {
		t.Errorf("news's calendar rule %+v does not hold", news.Rules[0])
	}
}

// TestRecipientHeldBySuppression: a suppression, where the list has one,
// holds the recipient before any rule.
func TestRecipientHeldBySuppression(t *testing.T) {
	e := newEnv(t, "", nil, func(o *Options) { o.Suppressions = suppressed{"carol": "unsubscribed"} })
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/carol", &r)
	m := policyOf(t, r, "marketing")
	if m.HeldBy == nil || m.HeldBy.Kind != "suppression" || m.HeldBy.Rule != "suppressed: unsubscribed" || m.Rules[0].Kind != "suppression" {
		t.Errorf("carol held by %+v, rules %v; want the suppression first", m.HeldBy, kinds(m))
	}
	e.getJSON(t, "/throttle/api/recipients/dave", &r)
	if m := policyOf(t, r, "marketing"); m.HeldBy != nil || kinds(m)[0] == "suppression" {
		t.Errorf("dave, not suppressed: held by %+v, rules %v", m.HeldBy, kinds(m))
	}
}

// suppressed is a suppression list of recipients and reasons.
type suppressed map[string]string

func (s suppressed) Suppressed(_ context.Context, recipient string) (Suppression, bool, error) {
	reason, ok := s[recipient]
	return Suppression{Reason: reason}, ok, nil
}

// TestAPIIndex: /throttle/api/ lists the endpoints, and each answers.
func TestAPIIndex(t *testing.T) {
	e := newEnv(t, "", nil)
	for _, path := range []string{"/throttle/api/", "/throttle/api"} {
		var idx struct{ Endpoints []endpoint }
		e.getJSON(t, path, &idx)
		if len(idx.Endpoints) != 4 {
			t.Fatalf("%s: %+v, want the 4 endpoints", path, idx)
		}
		for _, ep := range idx.Endpoints {
			p := strings.Replace(ep.Path, "{id}", "alice", 1)
			if code, body := e.get(t, p); code != http.StatusOK || !json.Valid([]byte(body)) || ep.About == "" {
				t.Errorf("%s lists %s: %d %.100s", path, ep.Path, code, body)
			}
		}
	}
}

// TestControlCharactersRefused: a recipient ID with a control character
// is refused by the API and the page, as by enqueue.
func TestControlCharactersRefused(t *testing.T) {
	e := newEnv(t, "", nil)
	for path, want := range map[string]string{
		"/throttle/api/recipients/x%00y":     "recipient: control character U+0000 (byte 2)",
		"/throttle/api/recipients/ab%0Acd":   "recipient: control character U+000A (byte 3)",
		"/throttle/api/recipients/a%C2%85b":  "recipient: control character U+0085 (byte 2)",
		"/throttle/api/recipients/alice%1B[": "recipient: control character U+001B (byte 6)",
	} {
		code, body := e.get(t, path)
		var got map[string]string
		_ = json.Unmarshal([]byte(body), &got)
		if code != http.StatusBadRequest || got["error"] != want {
			t.Errorf("GET %s: %d %s, want 400 %q", path, code, body, want)
		}
	}
	code, body := e.get(t, "/throttle?recipient=x%00y")
	if code != http.StatusBadRequest || !strings.Contains(body, "recipient: control character U&#43;0000 (byte 2)") {
		t.Errorf("page with a NUL in the id: %d, want 400 with the message", code)
	}
	code, body = e.get(t, "/throttle/api/recipients/alice?provider=pigeon")
	if code != http.StatusBadRequest || !strings.Contains(body, `provider: \"pigeon\" is not defined in the config`) {
		t.Errorf("an unknown provider: %d %s", code, body)
	}
}

// TestShadowRulesHoldNothing: a policy in shadow mode shows what its
// windows would do, and they are never the rule that holds a message.
func TestShadowRulesHoldNothing(t *testing.T) {
	quiet, _ := quietNow(t)
	e := newEnvYAML(t, fmt.Sprintf(truthYAML, quiet), nil)
	for i := range 5 { // reset: 5 per 1h, full
		if d := e.admit(t, fmt.Sprintf("reset-%d", i), "erin", "reset", "push"); !d.Allowed() {
			t.Fatalf("admission %d denied: %+v", i, d)
		}
	}
	var r recipientView
	e.getJSON(t, "/throttle/api/recipients/erin?provider=push", &r)
	reset := policyOf(t, r, "reset")
	if reset.HeldBy != nil || reset.DecidedBy != "" {
		t.Errorf("reset (shadow) held by %+v", reset.HeldBy)
	}
	if w := reset.Rules[0]; w.Kind != "window" || !w.Holds || !w.Shadow || w.Until == nil {
		t.Errorf("reset's full window: %+v, want it shown as holding, in shadow mode", w)
	}
	code, body := e.get(t, "/throttle?recipient=erin&provider=push")
	if code != http.StatusOK || !strings.Contains(body, "(shadow: holds nothing)") {
		t.Errorf("the page does not say reset's window is in shadow mode: %d", code)
	}
}
