package lifecycle

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the events' Prometheus metrics, as their Help says.
type Metrics struct {
	Recorded   *prometheus.CounterVec
	Unrecorded prometheus.Counter
	Callbacks  *prometheus.CounterVec
	Backlog    *prometheus.GaugeVec
}

// NewMetrics returns the metrics, registered with reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Recorded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "events_total",
			Help: "Events of messages recorded (their history, and their tenant's callback if it has one), by type."}, []string{"type"}),
		Unrecorded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "throttler", Name: "events_unrecorded_total",
			Help: "Events that could not be recorded (Redis did not answer in time): in no history and no callback."}),
		Callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "callbacks_total",
			Help: "Status callbacks POSTed, by tenant and result: delivered (2xx), failed (retried later), given_up (too old, dropped)."},
			[]string{"tenant", "result"}),
		Backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "throttler", Name: "callbacks_backlog",
			Help: "Events waiting in a tenant's stream: not yet POSTed, or failed and waiting for a retry."}, []string{"tenant"}),
	}
	if reg != nil {
		reg.MustRegister(m.Recorded, m.Unrecorded, m.Callbacks, m.Backlog)
	}
	return m
}
