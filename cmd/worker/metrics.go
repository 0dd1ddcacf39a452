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

// processMetrics registers on reg what /metrics shows of the process
// beside the throttler's own series: the Go runtime's (go_*: goroutines,
// heap, GC pauses), the process's (process_*: CPU, resident memory, open
// file descriptors; on Linux) and throttler_build_info, whose labels say
// which build runs.
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

// newReloads registers and returns throttler_config_reloads_total, the
// SIGHUP reloads by result: success (the file's policies and providers
// apply) or refused (a mistake in the file: the running config stays).
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
