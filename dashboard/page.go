package dashboard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/notify-throttle/throttler/internal/keyspace"
	"github.com/notify-throttle/throttler/internal/timefmt"
)

//go:embed page.html
var pageHTML string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"when":     when,
	"seconds":  seconds,
	"tokens":   func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
	"chart":    chart,
	"deferred": countOrDash,
	"frees":    whenPtr,
}).Parse(pageHTML))

// pageData is what page.html shows.
type pageData struct {
	Now                   time.Time
	ChartSpan             string
	Providers             page[providerView]
	Policies              page[policyView]
	Campaigns             page[campaignView]
	Query, Zone, Provider string         // the lookup asked for
	Recipient             *recipientView // the one looked up, if any
	Error                 string         // what was wrong with the lookup
}

// page renders /throttle: the first pages of providers, policies and
// campaigns, and the recipient ?recipient= names. A bad lookup is shown on
// the page with status 400.
func (d *Dashboard) page(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	q := r.URL.Query()
	data := pageData{Now: time.Now().UTC(), Query: q.Get("recipient"), Zone: q.Get("tz"), Provider: q.Get("provider"),
		ChartSpan: timefmt.Duration(sendBin * keyspace.SentBins)}
	var err error
	if data.Providers, err = d.providers(ctx, r, 0, defaultLimit); err != nil {
		writeError(w, err, false)
		return
	}
	data.Policies, _ = d.policies(ctx, r, 0, defaultLimit) // reads no Redis: no error
	if data.Campaigns, err = d.campaigns(ctx, r, 0, defaultLimit); err != nil {
		writeError(w, err, false)
		return
	}
	if len(data.Providers.Items) > 0 {
		data.Now = data.Providers.Items[0].Now
	}
	status := http.StatusOK
	if q.Has("recipient") {
		rv, err := d.lookupRecipient(ctx, r, q.Get("recipient"))
		var br badRequest
		switch {
		case errors.As(err, &br):
			data.Error, status = br.msg, http.StatusBadRequest
		case err != nil:
			writeError(w, err, false)
			return
		default:
			data.Recipient = &rv
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := pageTmpl.Execute(w, data); err != nil {
		fmt.Fprintf(w, "<p>template: %s</p>", template.HTMLEscapeString(err.Error()))
	}
}

// when shows a moment to the second with its zone.
func when(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") }

func whenPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return when(*t)
}

// seconds shows a span in seconds as a duration ("0s", "1.5s", "17h2m").
func seconds(s float64) string {
	if s <= 0 {
		return "0s"
	}
	return timefmt.Duration(time.Duration(s * float64(time.Second)).Round(time.Millisecond))
}

func countOrDash(p *float64) string {
	if p == nil {
		return "—"
	}
	return strconv.FormatFloat(*p, 'f', 0, 64)
}

// chart draws a provider's sends per second against its rate as an inline
// SVG: a bar per bin, the rate as a dashed line.
func chart(p providerView) template.HTML {
	const w, h, pad = 300.0, 60.0, 2.0
	top := p.Rate
	for _, v := range p.SendsPerSecond {
		top = max(top, v)
	}
	if top <= 0 {
		top = 1
	}
	n := float64(max(1, len(p.SendsPerSecond)))
	bw := (w - 2*pad) / n
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="sends per second of %s, last %s">`,
		w, h, w, h, template.HTMLEscapeString(p.Name), seconds(p.BinSeconds*n))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="#f6f8fa"/>`, w, h)
	for i, v := range p.SendsPerSecond {
		bh := (h - 2*pad) * v / top
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#2f81f7"><title>%.2f/s</title></rect>`,
			pad+float64(i)*bw, h-pad-bh, max(bw-1, 1), bh, v)
	}
	y := h - pad - (h-2*pad)*p.Rate/top
	fmt.Fprintf(&b, `<line x1="0" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#cf222e" stroke-dasharray="4 3"><title>rate %g/s</title></line>`, w, y, y, p.Rate)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and an escaped name
}
