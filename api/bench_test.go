package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/notify-throttle/throttler/config"
)

// BenchmarkEnqueue measures POST /v1/notifications and a batch of 100.
func BenchmarkEnqueue(b *testing.B) {
	for _, batch := range []int{1, MaxBatch} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			f := newFixture(b, func(c *config.Config) {
				k := c.API.Keys["billing"]
				k.Rate, k.Burst = 1e6, 1000 // the benchmark measures the API, not its limit
				c.API.Keys["billing"] = k
			})
			client := f.srv.Client()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				var body, path string
				if batch == 1 {
					path, body = "/v1/notifications", fmt.Sprintf(`{"recipient":"r%d@example.com","template":"t","idempotency_key":"k%d"}`, i, i)
				} else {
					items := make([]string, batch)
					for j := range items {
						items[j] = fmt.Sprintf(`{"recipient":"r%d-%d@example.com","template":"t","idempotency_key":"k%d-%d"}`, i, j, i, j)
					}
					path, body = "/v1/notifications/batch", `{"notifications":[`+strings.Join(items, ",")+`]}`
				}
				req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+billingKey)
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode >= 300 {
					b.Fatalf("status %d", res.StatusCode)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch)/1e3, "µs/notification")
		})
	}
}
