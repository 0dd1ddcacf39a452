package dashboard

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/throttle"
)

// ruleView is one rule that can hold a recipient's message.
type ruleView struct {
	// Kind is window, calendar, quiet, provider, bookings (the recipient's
	// earlier bookings go first) or suppression.
	Kind string `json:"kind"`
	// Rule says which, as the worker's logs do: "1 per 24h", "provider sms
	// (2/s burst 1)".
	Rule string `json:"rule"`
	// Holds: the rule would hold a message now, until Until (null: it lets
	// one go now, or a suppression holds until lifted).
	Holds bool       `json:"holds"`
	Until *time.Time `json:"until"`
	// Shadow: Holds and Until say what the rule would do, but it holds
	// nothing.
	Shadow bool `json:"shadow,omitempty"`
}

// checkID is the task ID the dashboard's checks ask with.
const checkID = "dashboard:check"

// holders fills in rp's rules: every rule that can hold a message of q's
// recipient under policy p, with when each next lets one go, and the one
// that holds it now, each asked alone and then all together with
// Limiter.Check, as an admission would be (docs/design.md#the-dashboard).
func (d *Dashboard) holders(ctx context.Context, l *live, q lookup, p policyState, now time.Time, rp *recipientPolicy) error {
	shown := func(t time.Time) *time.Time {
		t = t.In(q.show)
		return &t
	}
	cals, quiet, loc, _ := l.cfg.Local(p.Name)
	loc = cmp.Or(q.tz, loc, time.UTC)
	rp.Zone, rp.Rules = loc.String(), []ruleView{}
	if l.buckets[q.provider] != nil {
		rp.Provider = q.provider
	}
	if v, err := d.suppression(ctx, q.id, shown); err != nil {
		return err
	} else if v != nil {
		rp.Rules = append(rp.Rules, *v)
	}
	// takes[i] is asked for rules[index[i]]; the sliding windows are one
	// take, whose denial names its window. A shadow rule is asked alone.
	var takes []throttle.Take
	var index []int
	shadow := l.cfg.Policies[p.Name].Shadow
	if quota := l.quotas[p.Name]; quota != nil && !shadow {
		takes, index = append(takes, throttle.Take{Rule: quota, Subject: q.id}), append(index, len(rp.Rules))
	}
	for i, w := range p.Windows {
		v := ruleView{Kind: "window", Rule: throttle.Window{Limit: w.Limit, Per: w.Per}.String(), Shadow: shadow}
		if !p.Frees[i].IsZero() {
			v.Holds, v.Until = true, shown(p.Frees[i])
		}
		rp.Rules = append(rp.Rules, v)
	}
	var err error // the first Check's that failed: add does nothing after it
	add := func(kind, name string, shadow bool, t throttle.Take) {
		if err != nil {
			return
		}
		v := ruleView{Kind: kind, Rule: name, Shadow: shadow}
		var dec throttle.Decision
		if dec, err = d.lim.Check(ctx, throttle.Request{ID: checkID, Takes: []throttle.Take{t}}); err != nil {
			return
		}
		if !dec.Allowed() {
			v.Holds, v.Until = true, shown(dec.At())
		}
		if !shadow {
			takes, index = append(takes, t), append(index, len(rp.Rules))
		}
		rp.Rules = append(rp.Rules, v)
	}
	for _, c := range cals {
		add("calendar", c.String(), shadow, throttle.Take{Rule: c.In(loc, now), Subject: q.id})
	}
	if quiet != nil {
		add("quiet", quiet.String(), shadow, throttle.Take{Rule: quiet.In(loc, now), Subject: q.id})
	}
	if b := l.buckets[q.provider]; b != nil {
		add("provider", fmt.Sprintf("provider %s (%s)", q.provider, b), l.cfg.Providers[q.provider].Shadow, throttle.Take{Rule: b, Subject: q.provider})
	}
	if err != nil {
		return err
	}
	if p.DecidedBy == byBookings {
		rp.Rules = append(rp.Rules, ruleView{Kind: "bookings", Rule: "the bookings made before it (they go in order)",
			Holds: true, Until: shown(p.Next)})
	}
	held, err := d.heldBy(ctx, takes, index, rp.Rules)
	if err != nil {
		return err
	}
	setHeld(rp, held, now, shown)
	return nil
}

// setHeld says in rp what holds the recipient's next message (nil:
// nothing) and until when.
func setHeld(rp *recipientPolicy, held *ruleView, now time.Time, shown func(time.Time) *time.Time) {
	rp.HeldBy, rp.Next, rp.NextIn, rp.DecidedBy = held, *shown(now), 0, ""
	if held != nil {
		rp.DecidedBy = held.Rule
		if held.Until != nil {
			held.Until = shown(*held.Until)
			rp.Next, rp.NextIn = *held.Until, max(0, held.Until.Sub(now).Seconds())
		}
	}
}

// suppression is the rule view of recipient's suppression, nil if none.
func (d *Dashboard) suppression(ctx context.Context, recipient string, shown func(time.Time) *time.Time) (*ruleView, error) {
	if d.opts.Suppressions == nil {
		return nil, nil
	}
	s, ok, err := d.opts.Suppressions.Suppressed(ctx, recipient)
	if err != nil || !ok {
		return nil, err
	}
	v := ruleView{Kind: "suppression", Rule: "suppressed: " + s.Reason, Holds: true}
	if !s.Until.IsZero() {
		v.Until = shown(s.Until)
	}
	return &v, nil
}

// heldBy returns the rule that holds a message now, with its moment: a
// suppression, else the takes asked together, or the recipient's earlier
// bookings when they end later; nil when nothing holds it.
func (d *Dashboard) heldBy(ctx context.Context, takes []throttle.Take, index []int, rules []ruleView) (*ruleView, error) {
	var held *ruleView
	for i := range rules {
		switch {
		case rules[i].Kind == "suppression":
			return &rules[i], nil
		case rules[i].Kind == "bookings":
			held = &rules[i]
		}
	}
	if len(takes) == 0 {
		return held, nil
	}
	dec, err := d.lim.Check(ctx, throttle.Request{ID: checkID, Takes: takes})
	if err != nil || dec.Allowed() || dec.TakeIndex < 0 {
		return held, err
	}
	at := dec.At()
	if held != nil && held.Until.After(at) {
		return held, nil
	}
	v := rules[index[dec.TakeIndex]]
	if v.Kind == "window" { // the quota's take: the window its denial names
		for _, r := range rules {
			if r.Kind == "window" && r.Rule == dec.Limit {
				v = r
			}
		}
	}
	v.Holds, v.Until = true, &at
	return &v, nil
}

// calendarText is a calendar window as the config says it: "2 per week
// from sunday".
func calendarText(c config.Calendar) string {
	s := fmt.Sprintf("%d per %s", c.Limit, c.Per)
	if c.Per == "week" && c.WeekStart != "" && c.WeekStart != "monday" {
		s += " from " + c.WeekStart
	}
	return s
}
