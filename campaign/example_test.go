package campaign_test

import (
	"fmt"
	"time"

	"github.com/notify-throttle/throttler/campaign"
	"github.com/notify-throttle/throttler/config"
)

func ExampleList() {
	cfg, err := config.Parse("campaigns.yaml", []byte(`
policies: {weekly: [{limit: 1, per: 168h}]}
providers: {console: {type: log, rate: 50, burst: 10}}
defaults: {policy: weekly, provider: console}
campaigns:
  - name: digest
    cron: "0 9 * * MON"
    timezone: Europe/Paris
    template: digest
    audience: {redis_set: "digest:subscribers"}
`))
	if err != nil {
		panic(err)
	}
	from := time.Date(2024, 6, 3, 12, 0, 0, 0, time.UTC)
	entries, _ := campaign.List(cfg, from, 2)
	for _, e := range entries {
		fmt.Println(e.Name, e.Cron, e.Audience)
		for _, t := range e.Next {
			fmt.Println(" ", t.Format(time.RFC3339))
		}
	}
	// Output:
	// digest 0 9 * * MON redis set digest:subscribers
	//   2024-06-10T09:00:00+02:00
	//   2024-06-17T09:00:00+02:00
}
