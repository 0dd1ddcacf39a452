package jobs

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the worker's Prometheus metrics.
type Metrics struct {
	Admitted *prometheus.CounterVec // by policy, provider
	Deferred *prometheus.CounterVec // by rule and limit ("policy marketing (3 per 168h)")
	Expired  *prometheus.CounterVec // by policy
	Dropped  *prometheus.CounterVec // by policy: over the cap of a policy that drops
	Shadow   *prometheus.CounterVec // by rule in shadow mode and what it would have done
	Folded   *prometheus.CounterVec // by policy: folded into a digest
	Archived *prometheus.CounterVec // by reason (malformed, rejected)
	Sent     *prometheus.CounterVec // by provider
	// TenantSent counts sends by provider and tenant, for the tenants named
	// in the weights (tenants.weights) only: every other tenant counts as
	// "other" and the default one as "default", so the series are as many
	// as the config names, not one per sender.
	TenantSent *prometheus.CounterVec
	Failed     *prometheus.CounterVec // by provider
	Paused     *prometheus.CounterVec // by provider
	// Broken counts sends whose provider answered that its credentials or
	// account are broken (providers.Broken), by provider: alert on it.
	Broken *prometheus.CounterVec
	// Held counts scoped pauses (a device, a number pair, a sender) set, by
	// provider and scope kind.
	Held      *prometheus.CounterVec
	Admission prometheus.Histogram // seconds per admission call

	// Duplicates counts redelivered jobs found already sent and completed
	// without sending again, by provider.
	Duplicates *prometheus.CounterVec
	// Unmarked counts sends whose sent marker could not be written, by
	// provider: a redelivery of those would be sent again.
	Unmarked *prometheus.CounterVec
	// Bookings counts bookings by event: made, queued (a place in line past
	// the provider's horizon, nothing held), rebooked (a job that lost
	// its moment booked again), claimed (a booked job went), bumped (a
	// job's claimed slot went to priority traffic while it slept), released
	// (a job gave back what it held without sending: it expired, was
	// rejected, failed, lost its slot or was shut down).
	Bookings *prometheus.CounterVec
	// LateSends counts sends that would have left more than
	// Throttle.LateAfter after their moment: each gave its moment back and
	// was admitted again.
	LateSends prometheus.Counter
	// BookedAhead is, by rule, how far ahead the latest booking it set was,
	// in seconds: for a provider, how far ahead its line reaches.
	BookedAhead *prometheus.GaugeVec
	// Lateness is, for booked jobs that went, the moment they went minus the
	// moment they had booked, in seconds (0 when on time).
	Lateness prometheus.Histogram
	// ClockOffset is how far the worker's clock is ahead of Redis's, in
	// seconds (see WatchClock).
	ClockOffset prometheus.Gauge
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		Admitted: counter("admitted_total", "Notifications admitted by the throttle.", "policy", "provider"),
		Deferred: counter("deferred_total", "Notifications deferred, by the rule that denied them.", "rule"),
		Expired:  counter("expired_total", "Notifications archived because their send-by time would pass.", "policy"),
		Dropped:  counter("dropped_total", "Notifications archived at once because their policy, which drops, held them back.", "policy"),
		Shadow: counter("shadow_total", "Notifications a rule in shadow mode would have held back, by rule and what it would have done (deferred, dropped, expired).",
			"rule", "would"),
		Folded:   counter("folded_total", "Notifications folded into a digest because their policy, which digests, held them back.", "policy"),
		Archived: counter("archived_total", "Notifications archived without delivery, by reason.", "reason"),
		Sent:     counter("sent_total", "Notifications a provider accepted.", "provider"),
		TenantSent: counter("tenant_sent_total",
			"Notifications a provider accepted, by tenant: those named in tenants.weights, \"default\" (no tenant) and \"other\".", "provider", "tenant"),
		Failed: counter("failed_total", "Sends that failed and will be retried or archived.", "provider"),
		Paused: counter("paused_total", "Times a provider asked every worker to pause (429).", "provider"),
		Broken: counter("provider_broken_total", "Sends a provider refused for broken credentials or account: the provider is paused fleet-wide.", "provider"),
		Held:   counter("scope_held_total", "Scoped pauses set (one device, number pair or sender), by provider and scope kind.", "provider", "scope"),
		Duplicates: counter("duplicates_skipped_total",
			"Redelivered notifications already sent, completed without sending again.", "provider"),
		Unmarked: counter("sent_unmarked_total",
			"Sends whose sent marker could not be written: a redelivery would send them again.", "provider"),
		Bookings: counter("bookings_total", "Bookings made, rebooked (the moment was lost), queued (a place in line past the horizon), claimed, bumped (a claimed slot taken by priority traffic), and released (given back unsent).", "event"),
		BookedAhead: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "throttler", Name: "booked_ahead_seconds",
			Help: "How far ahead the latest booking set by a rule was (a provider: how far its line reaches).",
		}, []string{"rule"}),
		LateSends: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "throttler", Name: "late_sends_total",
			Help: "Sends that would have left more than worker.window_margin/2 after their moment, admitted again instead.",
		}),
		Lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "throttler", Name: "booking_lateness_seconds",
			Help:    "When a booked job went minus the moment it had booked.",
			Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 5, 10},
		}),
		Admission: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "throttler", Name: "admission_seconds",
			Help:    "Latency of one admission call to Redis.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		ClockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "throttler", Name: "clock_offset_seconds",
			Help: "How far this worker's clock is ahead of Redis TIME (negative: behind). asynq schedules on the worker's clock.",
		}),
	}
	reg.MustRegister(m.Admission, m.ClockOffset, m.BookedAhead, m.Lateness, m.LateSends)
	return m
}

func (m *Metrics) inc(v *prometheus.CounterVec, labels ...string) {
	v.WithLabelValues(labels...).Inc()
}

func (m *Metrics) observe(seconds float64) { m.Admission.Observe(seconds) }
