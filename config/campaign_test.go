package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestCampaignFileAudience checks that a relative audience file is read
// from the config file's directory, whatever the working directory, and
// the campaign settings' defaults.
func TestCampaignFileAudience(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "lists"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "lists", "digest.txt"), "alice@example.com\n")
	writeFile(t, filepath.Join(dir, "config.yaml"), `policies: {weekly: [{limit: 1, per: 168h}]}
providers: {console: {type: log, rate: 50, burst: 10}}
defaults: {policy: weekly, provider: console}
campaigns:
  - name: digest
    template: digest
    cron: "*/2 * * * * *"
    timezone: America/New_York
    audience: {file: lists/digest.txt}
    send_by_window: 1d
  - name: pulse
    template: pulse
    cron: "@hourly"
    audience: {redis_set: "pulse:members"}
    catch_up: 0s
    tenant: growth
`)
	c, err := LoadWithEnv(filepath.Join(dir, "config.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := []Campaign{
		{Name: "digest", Template: "digest", Cron: "*/2 * * * * *", Timezone: "America/New_York",
			Audience:     Audience{File: filepath.Join(dir, "lists", "digest.txt")},
			SendByWindow: 24 * time.Hour, CatchUp: time.Hour, Tenant: "digest"},
		{Name: "pulse", Template: "pulse", Cron: "@hourly", Audience: Audience{RedisSet: "pulse:members"}, Tenant: "growth"},
	}
	if !reflect.DeepEqual(c.Campaigns, want) {
		t.Errorf("campaigns:\n got %+v\nwant %+v", c.Campaigns, want)
	}
}
