package dashboard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/internal/timefmt"
	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

// Page limits: a list is read limit items at a time.
const (
	defaultLimit  = 50
	maxLimit      = 500
	bookingsShown = 10
)

// page is one page of a list.
type page[T any] struct {
	Items  []T    `json:"items"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
	Total  int64  `json:"total"`
	Next   string `json:"next,omitempty"` // the next page's URL; "" on the last
}

func newPage[T any](items []T, r *http.Request, offset, limit int, total int64) page[T] {
	p := page[T]{Items: items, Offset: offset, Limit: limit, Total: total}
	if p.Items == nil {
		p.Items = []T{}
	}
	if int64(offset+limit) < total {
		u := *r.URL
		q := u.Query()
		q.Set("offset", strconv.Itoa(offset+limit))
		q.Set("limit", strconv.Itoa(limit))
		u.RawQuery = q.Encode()
		p.Next = u.RequestURI()
	}
	return p
}

// providerView is a provider's bucket as /throttle/api/providers shows it.
type providerView struct {
	Name            string        `json:"name"`
	Type            string        `json:"type"`
	Rate            float64       `json:"rate"`
	Burst           int           `json:"burst"`
	PriorityReserve int           `json:"priority_reserve"` // the burst kept for priority queues' jobs
	Shadow          bool          `json:"shadow"`
	Tokens          float64       `json:"tokens"`
	BookedAhead     float64       `json:"booked_ahead_seconds"`
	Bookings        int64         `json:"bookings_held"`
	Booked          []bookingView `json:"bookings"`
	Paused          bool          `json:"paused"`
	PausedUntil     *time.Time    `json:"paused_until"`
	// SendsPerSecond is the rate of the workers' sends in each bin of the
	// last minutes, oldest first, the last ending now.
	SendsPerSecond []float64 `json:"sends_per_second"`
	BinSeconds     float64   `json:"bin_seconds"`
	Now            time.Time `json:"now"`
}

type bookingView struct {
	Task string    `json:"task"`
	At   time.Time `json:"at"`
}

func bookingViews(b []taskAt, loc *time.Location) []bookingView {
	out := []bookingView{}
	for _, x := range b {
		out = append(out, bookingView{Task: x.Task, At: time.UnixMicro(x.At).In(loc)})
	}
	return out
}

func (d *Dashboard) providers(ctx context.Context, r *http.Request, offset, limit int) (page[providerView], error) {
	l := d.current()
	st, err := l.readProviders(ctx, offset, limit, bookingsShown)
	if err != nil {
		return page[providerView]{}, err
	}
	var out []providerView
	for _, p := range st {
		c := l.cfg.Providers[p.Name]
		v := providerView{Name: p.Name, Type: c.Type, Rate: c.Rate, Burst: c.Burst, PriorityReserve: c.PriorityReserve, Shadow: c.Shadow, Tokens: math.Round(p.Tokens*1000) / 1000,
			BookedAhead: float64(p.Bookings.Ahead) / 1e6, Bookings: p.Bookings.Held, Booked: bookingViews(p.Bookings.Tasks, time.UTC),
			BinSeconds: sendBin.Seconds(), Now: p.Now}
		if !p.PausedUntil.IsZero() {
			v.Paused, v.PausedUntil = true, &p.PausedUntil
		}
		for _, n := range p.Sends {
			v.SendsPerSecond = append(v.SendsPerSecond, float64(n)/sendBin.Seconds())
		}
		out = append(out, v)
	}
	return newPage(out, r, offset, limit, int64(len(l.providers))), nil
}

// policyView is a policy as /throttle/api/policies shows it.
type policyView struct {
	Name    string       `json:"name"`
	Windows []windowView `json:"windows"`
	// Calendar ("1 per day") and Quiet are in Timezone unless a
	// notification names its recipient's.
	Calendar     []string `json:"calendar"`
	Quiet        []string `json:"quiet"`
	Timezone     string   `json:"timezone"`
	OverCap      string   `json:"over_cap"`
	MaxDelay     string   `json:"max_delay"`
	CountsToward []string `json:"counts_toward"`
	Shadow       bool     `json:"shadow"`
	// Deferred is this worker's throttler_deferred_total for the policy;
	// null without metrics.
	Deferred *float64 `json:"deferred_by_this_worker"`
}

type windowView struct {
	Limit      int     `json:"limit"`
	Per        string  `json:"per"`
	PerSeconds float64 `json:"per_seconds"`
}

func windowViews(ws []throttle.Window) []windowView {
	var out []windowView
	for _, w := range ws {
		out = append(out, windowView{Limit: w.Limit, Per: timefmt.Duration(w.Per), PerSeconds: w.Per.Seconds()})
	}
	return out
}

func (d *Dashboard) policies(_ context.Context, r *http.Request, offset, limit int) (page[policyView], error) {
	l := d.current()
	deferred := d.deferred()
	var out []policyView
	for _, name := range pageOf(l.policies, offset, limit) {
		c := l.cfg.Policies[name]
		v := policyView{Name: name, Windows: windowViews(c.Windows), OverCap: cmp.Or(c.OverCap, config.OverCapDefer),
			Calendar: []string{}, Quiet: append([]string{}, c.Quiet...), Timezone: cmp.Or(c.TimeZone, "UTC"),
			CountsToward: append([]string{}, c.CountsToward...), Shadow: c.Shadow}
		if c.MaxDelay > 0 {
			v.MaxDelay = timefmt.Duration(c.MaxDelay)
		}
		for _, cw := range c.Calendar {
			v.Calendar = append(v.Calendar, calendarText(cw))
		}
		if deferred != nil {
			n := deferred[name]
			v.Deferred = &n
		}
		out = append(out, v)
	}
	return newPage(out, r, offset, limit, int64(len(l.policies))), nil
}

// deferred returns this worker's deferral counts by policy, or nil: the
// throttler_deferred_total series whose rule is "policy <name> (<limit>)".
func (d *Dashboard) deferred() map[string]float64 {
	if d.opts.Metrics == nil {
		return nil
	}
	mfs, err := d.opts.Metrics.Gather()
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "throttler_deferred_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if rest, ok := strings.CutPrefix(l.GetValue(), "policy "); ok && l.GetName() == "rule" {
					name, _, _ := strings.Cut(rest, " (")
					out[name] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// recipientView is a recipient's history as /throttle/api/recipients/{id}
// shows it, times in Zone.
type recipientView struct {
	Recipient string            `json:"recipient"`
	Zone      string            `json:"zone"`
	Now       time.Time         `json:"now"`
	Policies  []recipientPolicy `json:"policies"`
	Bookings  int64             `json:"bookings_held"`
	Ahead     float64           `json:"booked_ahead_seconds"`
	Booked    []bookingView     `json:"bookings"`
}

type recipientPolicy struct {
	Policy  string            `json:"policy"`
	Windows []recipientWindow `json:"windows"`
	Next    time.Time         `json:"next"`            // the earliest moment a message may go
	NextIn  float64           `json:"next_in_seconds"` // 0: now
	// DecidedBy names the rule that sets Next ("quiet 21:00-08:00"), or
	// the recipient's earlier bookings; "" when nothing holds a message.
	DecidedBy string `json:"decided_by"`
	// Zone is where calendar windows and quiet hours are placed: the
	// lookup's tz, else the policy's timezone.
	Zone     string `json:"zone"`
	Provider string `json:"provider"` // whose bucket is among Rules: the lookup's, else defaults.provider
	// Rules are every rule that can hold the recipient's message under the
	// policy, each with when it next lets one go; HeldBy the one that holds
	// it now (null when none does).
	Rules   []ruleView      `json:"rules"`
	HeldBy  *ruleView       `json:"held_by"`
	Entries page[entryView] `json:"entries"`
}

type recipientWindow struct {
	windowView
	Used   int64      `json:"used"`   // entries in the window up to now
	Booked int64      `json:"booked"` // entries booked ahead, which the window counts too
	Frees  *time.Time `json:"frees"`  // when it next has a place; null when it has one now
}

type entryView struct {
	Task   string       `json:"task"`
	At     time.Time    `json:"at"`
	Booked bool         `json:"booked"` // At is ahead of now: the task waits for it
	Frees  []*time.Time `json:"frees"`  // when it leaves each window; null for one it left
}

func (d *Dashboard) recipient(ctx context.Context, r *http.Request, q lookup, offset, limit int) (recipientView, error) {
	l, id, loc := d.current(), q.id, q.show
	st, err := l.readRecipient(ctx, id, offset, limit, bookingsShown)
	if err != nil {
		return recipientView{}, err
	}
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.In(loc)
		return &t
	}
	v := recipientView{Recipient: id, Zone: loc.String(), Now: st.Now.In(loc), Bookings: st.Bookings.Held,
		Ahead: float64(st.Bookings.Ahead) / 1e6, Booked: bookingViews(st.Bookings.Tasks, loc), Policies: []recipientPolicy{}}
	for _, p := range st.Policies {
		rp := recipientPolicy{Policy: p.Name}
		wv := windowViews(p.Windows)
		for i := range wv {
			rp.Windows = append(rp.Windows, recipientWindow{windowView: wv[i], Used: p.Used[i], Booked: p.Ahead, Frees: at(p.Frees[i])})
		}
		var entries []entryView
		for _, e := range p.Entries {
			ev := entryView{Task: e.Task, At: e.At.In(loc), Booked: e.At.After(st.Now)}
			for _, f := range e.Frees {
				ev.Frees = append(ev.Frees, at(f))
			}
			entries = append(entries, ev)
		}
		rp.Entries = newPage(entries, r, offset, limit, p.Total)
		if err := d.holders(ctx, l, q, p, st.Now, &rp); err != nil {
			return recipientView{}, err
		}
		v.Policies = append(v.Policies, rp)
	}
	return v, nil
}

// campaignView is a campaign as /throttle/api/campaigns shows it.
type campaignView struct {
	Name     string     `json:"name"`
	Cron     string     `json:"cron"`
	Timezone string     `json:"timezone"`
	NextTick *time.Time `json:"next_tick"`
	LastTick *time.Time `json:"last_tick"` // fired by any worker; null if none. Its fan-out's counts follow.
	Read     int64      `json:"fanout_read"`
	Enqueued int64      `json:"fanout_enqueued"`
	Existing int64      `json:"fanout_existing"`
	Invalid  int64      `json:"fanout_invalid"`
	Done     bool       `json:"fanout_done"`
}

func (d *Dashboard) campaigns(ctx context.Context, r *http.Request, offset, limit int) (page[campaignView], error) {
	list, err := campaign.List(d.opts.Config, time.Now(), 1)
	if err != nil {
		return page[campaignView]{}, err
	}
	var latest []campaign.Summary
	if d.opts.Campaigns != nil {
		if latest, err = d.opts.Campaigns.Latest(ctx); err != nil {
			return page[campaignView]{}, err
		}
	}
	var out []campaignView
	for i, c := range pageOf(list, offset, limit) {
		v := campaignView{Name: c.Name, Cron: c.Cron, Timezone: c.Timezone}
		if len(c.Next) > 0 {
			v.NextTick = &c.Next[0]
		}
		if j := offset + i; j < len(latest) && latest[j].Tick.Unix > 0 {
			s := latest[j]
			t := s.Tick.Time()
			if loc, err := time.LoadLocation(c.Timezone); err == nil {
				t = t.In(loc)
			}
			v.LastTick = &t
			v.Read, v.Enqueued, v.Existing, v.Invalid, v.Done = s.Read, s.Enqueued, s.Existing, s.Invalid, s.Done
		}
		out = append(out, v)
	}
	return newPage(out, r, offset, limit, int64(len(list))), nil
}

// badRequest is an error the client made: 400 with its message.
type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

func paging(q url.Values) (offset, limit int, err error) {
	offset, limit = 0, defaultLimit
	if s := q.Get("offset"); s != "" {
		if offset, err = strconv.Atoi(s); err != nil || offset < 0 {
			return 0, 0, badRequest{fmt.Sprintf("offset: must be a whole number >= 0 (got %q)", s)}
		}
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxLimit {
			return 0, 0, badRequest{fmt.Sprintf("limit: must be a whole number from 1 to %d (got %q)", maxLimit, s)}
		}
	}
	return offset, limit, nil
}

type endpoint struct {
	Path  string `json:"path"`
	About string `json:"about"`
}

var endpoints = []endpoint{
	{"/throttle/api/providers", "each provider's bucket: rate, burst, tokens now, bookings, pause, sends per second (?offset=, ?limit=)"},
	{"/throttle/api/policies", "each policy as the running config has it: windows, calendar, quiet hours, over_cap, max_delay, this worker's deferrals"},
	{"/throttle/api/recipients/{id}", "a recipient's entries per policy and every rule that can hold its next message, with the one that does (?tz=, ?provider=, ?offset=, ?limit=)"},
	{"/throttle/api/campaigns", "each campaign's schedule, next tick and last fan-out"},
}

// lookup is a recipient lookup: who, the zone its times are shown in, the
// zone its rules are placed in when it names one (tz), and the provider.
type lookup struct {
	id       string
	show     *time.Location // tz, else UTC
	tz       *time.Location // nil: each policy's timezone
	provider string         // "": none
}

// lookupRecipient looks recipient id, checked as the worker checks a
// payload's, up as r's query says: ?tz=, ?provider= (default:
// defaults.provider), ?offset=, ?limit=.
func (d *Dashboard) lookupRecipient(ctx context.Context, r *http.Request, id string) (recipientView, error) {
	if err := message.CheckRecipient(id); err != nil {
		var fe *message.FieldError
		if errors.As(err, &fe) {
			err = fe
		}
		return recipientView{}, badRequest{err.Error()}
	}
	query := r.URL.Query()
	q := lookup{id: id, show: time.UTC, provider: query.Get("provider")}
	if tz := query.Get("tz"); tz != "" {
		loc, err := timefmt.LoadZone(tz)
		if err != nil {
			return recipientView{}, badRequest{"tz: " + err.Error()}
		}
		q.show, q.tz = loc, loc
	}
	cfg := d.current().cfg
	if q.provider == "" {
		q.provider = cfg.Defaults.Provider
	} else if _, ok := cfg.Providers[q.provider]; !ok {
		return recipientView{}, badRequest{fmt.Sprintf("provider: %q is not defined in the config", q.provider)}
	}
	offset, limit, err := paging(query)
	if err != nil {
		return recipientView{}, err
	}
	return d.recipient(ctx, r, q, offset, limit)
}

// serveJSON returns the handler that answers, as JSON, with what get
// returns for the page the query asks for.
func serveJSON[T any](get func(ctx context.Context, r *http.Request, offset, limit int) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		offset, limit, err := paging(r.URL.Query())
		var v T
		if err == nil {
			v, err = get(ctx, r, offset, limit)
		}
		if err != nil {
			writeError(w, err, true)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	}
}

// writeError writes err with its status: 400 for a bad request, 503 else.
func writeError(w http.ResponseWriter, err error, asJSON bool) {
	status := http.StatusServiceUnavailable
	var br badRequest
	if errors.As(err, &br) {
		status = http.StatusBadRequest
	}
	if !asJSON {
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}
