//go:build integration

package integration_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/message"
	"github.com/notify-throttle/throttler/throttle"
)

var screenshots = flag.String("screenshots", "", "also save the dashboard test's PNG screenshots in this directory (docs/ for the README's)")

// chromium returns the path of a Chromium or Chrome binary, or fails the
// test saying how to install one: a browser test never passes without a
// browser.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found in PATH for the browser test: install it (Debian/Ubuntu: apt-get install chromium; " +
		"`make test` does this when run as root)")
	return ""
}

// TestDashboardInBrowser runs a worker process with a throttled recipient
// and a provider booked ahead, opens /throttle and /monitoring/ in headless
// Chromium, checks what an operator looks for is on the page, and saves a
// screenshot of each (the test's artifacts; -screenshots DIR too, as
// `make screenshots` does for docs/).
func TestDashboardInBrowser(t *testing.T) {
	browser := chromium(t)
	// Quiet hours in London that hold now and end in two hours.
	london, _ := time.LoadLocation("Europe/London")
	now := time.Now().In(london)
	quietEnd := now.Add(2 * time.Hour).Truncate(time.Minute)
	quiet := now.Add(-time.Hour).Truncate(time.Minute).Format("15:04") + "-" + quietEnd.Format("15:04")
	f := newFleet(t, fleetConfig{Concurrency: 4, ShutdownTimeout: 5 * time.Second, Jitter: 0,
		Policy: "[{limit: 1, per: 1h}, {limit: 3, per: 24h}]", Rate: 0.5, Burst: 1,
		MorePolicies: fmt.Sprintf("\n  news: {calendar: [{limit: 1, per: day}], quiet: [%q], timezone: Europe/London}"+
			"\n  promo: {windows: [{limit: 1, per: 24h}], over_cap: drop}", quiet),
		Campaigns: "\n  - {name: weekly-digest, cron: \"0 9 * * MON\", timezone: Europe/Paris, audience: {file: audience.txt}, template: digest}\n",
		Files:     map[string]string{"audience.txt": "bob@example.com\n"}}, nil)
	w := f.startWorker("w1")
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()

	// A throttled recipient: the first notification goes, the second waits
	// for the moment it booked, with the reason on the task.
	f.enqueue(client, "alice-1", message.Notification{Recipient: "alice@example.com", Template: "welcome"})
	waitUntil(t, "alice's first message sent", 20*time.Second, func() bool { return len(f.hook.snapshot()) == 1 })
	deferred := f.enqueue(client, "alice-2", message.Notification{Recipient: "alice@example.com", Template: "digest"})
	waitUntil(t, "alice's second message deferred", 20*time.Second, func() bool {
		info, err := f.insp.GetTaskInfo(fleetQueue, deferred)
		return err == nil && info.State == asynq.TaskStateRetry && strings.Contains(info.LastErr, "by policy pace (1 per 1h)")
	})

	// A backlog booked on the provider: tasks that may not go now book
	// their moments in line, a slot of 2 s each: half a minute of them, so
	// that the page shows some ahead however slow the machine.
	lim, err := throttle.New(f.rdb, throttle.Options{Prefix: fleetPrefix})
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := throttle.NewBucket(fleetProvider, 0.5, 1)
	booked := 0
	for i := 0; i < 15; i++ {
		d, err := lim.Book(context.Background(), throttle.Request{ID: fmt.Sprintf("booked-%d", i),
			Takes: []throttle.Take{{Rule: bucket, Subject: fleetProvider}}}, throttle.Booking{})
		if err != nil || !d.Reserved() {
			t.Fatalf("booking %d: %+v, %v", i, d, err)
		}
		if d.Booked() {
			booked++
		}
	}
	if booked < 14 {
		t.Fatalf("%d of 15 tasks booked on a bucket of burst 1, want at least 14", booked)
	}

	dir := t.ArtifactDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	base := "http://" + w.metrics
	var bookedAhead, held, next, decided, deferrals, nextTick, overCap, newsHeld, newsUntil string
	var throttlePNG []byte
	err = chromedp.Run(ctx,
		chromedp.Navigate(base+"/throttle?recipient=alice@example.com&tz=Europe/Paris"),
		chromedp.WaitVisible(`#recipient`, chromedp.ByQuery),
		chromedp.Text(`tr[data-provider="hook"] td[data-field="booked-ahead"]`, &bookedAhead, chromedp.ByQuery),
		chromedp.Text(`tr[data-provider="hook"] td[data-field="bookings-held"]`, &held, chromedp.ByQuery),
		chromedp.Text(`p[data-policy="pace"] span[data-field="next"]`, &next, chromedp.ByQuery),
		chromedp.Text(`p[data-policy="pace"] span[data-field="decided-by"]`, &decided, chromedp.ByQuery),
		chromedp.Text(`tr[data-policy="pace"] td[data-field="deferred"]`, &deferrals, chromedp.ByQuery),
		chromedp.Text(`tr[data-campaign="weekly-digest"] td[data-field="next-tick"]`, &nextTick, chromedp.ByQuery),
		chromedp.Text(`tr[data-policy="promo"] td[data-field="over-cap"]`, &overCap, chromedp.ByQuery),
		chromedp.Text(`p[data-policy="news"] span[data-field="decided-by"]`, &newsHeld, chromedp.ByQuery),
		chromedp.Text(`table[data-policy="news"] tr[data-kind="quiet"] td[data-field="until"]`, &newsUntil, chromedp.ByQuery),
		chromedp.FullScreenshot(&throttlePNG, 100),
	)
	if err != nil {
		t.Fatalf("/throttle in the browser: %v", err)
	}
	save(t, dir, "dashboard-throttle.png", throttlePNG)
	// A booking is held until its task claims it (ours never will: the
	// engine keeps them 10 minutes past their moment), and the worker holds
	// alice's: the page shows what the API does, and at least ours.
	var api struct {
		Items []struct {
			Name  string    `json:"name"`
			Held  int       `json:"bookings_held"`
			Sends []float64 `json:"sends_per_second"`
		} `json:"items"`
	}
	// The worker counts its sends (alice's first message) and writes the
	// counts once a second.
	waitUntil(t, "the worker's send counted", 20*time.Second, func() bool {
		getJSON(t, base+"/throttle/api/providers", &api)
		sum := 0.0
		for _, it := range api.Items {
			for _, s := range it.Sends {
				sum += s
			}
		}
		return sum > 0
	})
	if n, err := strconv.Atoi(held); bookedAhead == "" || bookedAhead == "0s" || err != nil ||
		len(api.Items) != 1 || n != api.Items[0].Held || n < booked {
		t.Errorf("provider hook: booked ahead %q, bookings held %q; want a wait, and the API's %+v, at least the %d booked here",
			bookedAhead, held, api.Items, booked)
	}
	if !strings.Contains(nextTick, " 09:00:00 CE") {
		t.Errorf("campaign weekly-digest: next tick %q, want a Monday 09:00 in Paris time", nextTick)
	}
	if overCap != "drop" {
		t.Errorf("policy promo: over the cap %q, want drop", overCap)
	}
	// Alice's news is held by the quiet hours until they end, in her zone:
	// the page was asked for Europe/Paris, where they end at the same
	// wall-clock time as in the policy's London.
	paris := mustZone(t, "Europe/Paris")
	end := time.Date(quietEnd.Year(), quietEnd.Month(), quietEnd.Day(), quietEnd.Hour(), quietEnd.Minute(), 0, 0, paris)
	if wantUntil := end.Format("2006-01-02 15:04:05 MST"); newsHeld != "quiet "+quiet || newsUntil != wantUntil {
		t.Errorf("alice's news: held by %q until %q; want quiet %s until %s", newsHeld, newsUntil, quiet, wantUntil)
	}
	if deferrals != "1" {
		t.Errorf("policy pace: deferred by this worker %q, want 1", deferrals)
	}
	if decided != "1 per 1h" || !strings.Contains(next, "CET") && !strings.Contains(next, "CEST") {
		t.Errorf("alice's next message: %q, held by %q; want a moment in Paris time held by 1 per 1h", next, decided)
	}

	var taskText string
	var monitoringPNG []byte
	err = chromedp.Run(ctx,
		chromedp.Navigate(base+"/monitoring/queues/"+fleetQueue+"/tasks/"+deferred),
		chromedp.WaitVisible(`//*[contains(text(), "by policy pace")]`, chromedp.BySearch),
		chromedp.Text(`body`, &taskText, chromedp.ByQuery),
		chromedp.FullScreenshot(&monitoringPNG, 100),
	)
	if err != nil {
		t.Fatalf("/monitoring/ in the browser: %v", err)
	}
	save(t, dir, "dashboard-monitoring.png", monitoringPNG)
	if !strings.Contains(taskText, "by policy pace (1 per 1h)") {
		t.Errorf("the deferred task's page does not say why:\n%s", taskText)
	}
	if strings.Contains(taskText, "alice@example.com") {
		t.Errorf("the task's page shows the recipient unredacted")
	}
}

// mustZone loads an IANA time zone or fails the test.
func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// save writes a screenshot into dir and, with -screenshots, there too.
func save(t *testing.T, dir, name string, png []byte) {
	t.Helper()
	for _, d := range []string{dir, *screenshots} {
		if d == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", filepath.Join(d, name))
	}
}

// getJSON decodes the JSON at url into v, failing the test on any error.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// waitUntil polls cond until it holds, or fails the test after timeout.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
