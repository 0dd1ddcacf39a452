package feedback

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the feedback's Prometheus metrics, as their Help says. The
// provider label is a configured provider's name: a request for another is
// refused before it is counted.
type Metrics struct {
	Reports *prometheus.CounterVec
	Refused *prometheus.CounterVec
}

// NewMetrics returns the metrics, registered with reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "feedback_reports_total",
			Help: "Providers' reports read, by provider and result: the event type applied, unknown (no such message), ignored (not ours to apply), replayed (applied before)."},
			[]string{"provider", "result"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "feedback_refused_total",
			Help: "Providers' feedback requests refused, by provider and reason: signature (unsigned, forged, stale, unknown topic) or malformed."},
			[]string{"provider", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Reports, m.Refused)
	}
	return m
}

// Results of Reports besides the event types.
const (
	resultUnknown  = "unknown"
	resultIgnored  = "ignored"
	resultReplayed = "replayed"
)
