package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/notify-throttle/throttler/internal/buildinfo"
)

// Reload results, the values of throttler_config_reloads_total's label.
const (
	reloadSuccess = "success"
	reloadRefused = "refused"
)

// processMetrics registers the Go runtime's (go_*) and the process's
// (process_*) metrics, and throttler_build_info.
func processMetrics(reg prometheus.Registerer) {
	info := buildinfo.Read()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "throttler_build_info",
		Help:        "Always 1; its labels are the build's version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": info.Version, "commit": info.Commit, "goversion": info.Go},
	})
	build.Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), build)
}

// newReloads registers and returns throttler_config_reloads_total.
func newReloads(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttler_config_reloads_total",
		Help: "Config reloads on SIGHUP by result: success, or refused (a mistake in the file; the running config stays).",
	}, []string{"result"})
	for _, r := range []string{reloadSuccess, reloadRefused} {
		c.WithLabelValues(r) // both series from the start, at 0
	}
	reg.MustRegister(c)
	return c
}
