package config_test

import (
	"fmt"

	"github.com/notify-throttle/throttler/config"
)

func ExampleParse() {
	_, err := config.Parse("config.yaml", []byte(`
worker:
  concurency: 10
policies:
  marketing:
    - {limit: 1, per: 24h}
    - {limit: 3, per: 0s}
providers:
  sms: {type: webhook, timeout: 5 seconds, rate: 100, burst: 20}
defaults:
  policy: marketting
`))
	fmt.Println(err)
	// Output:
	// config.yaml:3: worker.concurency: unknown key (did you mean concurrency?)
	// config.yaml:7: policies.marketing[1].per: must be > 0 (got 0s)
	// config.yaml:9: providers.sms.timeout: not a duration such as 500ms, 90s, 1h30m or 7d (got "5 seconds")
	// config.yaml:9: providers.sms.url: required for a webhook provider
	// config.yaml:11: defaults.policy: policy "marketting" is not defined (defined: marketing)
}

func ExampleConfig_Rules() {
	c, err := config.Parse("config.yaml", []byte(`
policies:
  marketing: [{limit: 1, per: 24h}, {limit: 3, per: 7d}]
providers:
  console: {type: log, rate: 0.5, burst: 2}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	quotas, buckets, err := c.Rules()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(quotas["marketing"])
	fmt.Println(buckets["console"])
	// Output:
	// 1 per 24h, 3 per 168h
	// 0.5/s burst 2
}
