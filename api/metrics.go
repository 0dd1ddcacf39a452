package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's Prometheus metrics.
type metrics struct {
	requests *prometheus.CounterVec   // by route and status
	latency  *prometheus.HistogramVec // seconds, by route
}

// newMetrics registers the metrics with reg; nil: none.
func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "throttler", Name: "api_requests_total",
			Help: "HTTP API requests, by route and status."}, []string{"route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "throttler", Name: "api_request_seconds",
			Help: "HTTP API request latency, by route.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.latency)
	return m
}

func (m *metrics) observe(route string, status int, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route).Observe(took.Seconds())
}
