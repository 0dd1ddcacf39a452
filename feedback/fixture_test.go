package feedback

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/screen"
)

// The tests' providers and their feedback settings.
const (
	topic       = "arn:aws:sns:eu-west-1:123456789012:ses-events"
	twilioToken = "twilio-auth-token-0123456789"
	publicURL   = "https://api.example.com"
)

// fixture is a Receiver of an ses ("email"), a sendgrid ("grid") and a
// twilio ("sms") provider on a database of its own, their vendors' fakes,
// and a recorder whose tenant "billing" has a callback.
type fixture struct {
	rc      *Receiver
	rdb     *redis.Client
	events  *lifecycle.Recorder
	sns     *fakeSNS
	grid    sendgridSigner
	metrics *Metrics
}

func newFixture(t *testing.T, change ...func(*config.Config)) *fixture {
	t.Helper()
	f := &fixture{sns: newFakeSNS(t), grid: newSendGridSigner(t), metrics: NewMetrics(prometheus.NewRegistry())}
	f.rdb, _ = shared.NewClient(t)
	cfg := config.Default()
	cfg.Providers["email"] = config.Provider{Type: config.ProviderSES, Rate: 1, Burst: 1, Region: "eu-west-1",
		Feedback: config.Feedback{Enabled: true, TopicARNs: []string{topic}, CertHost: f.sns.host, CAFile: f.sns.caFile}}
	cfg.Providers["grid"] = config.Provider{Type: config.ProviderSendGrid, Rate: 1, Burst: 1,
		Feedback: config.Feedback{Enabled: true, VerificationKey: config.Secret(f.grid.verificationKey(t))}}
	cfg.Providers["sms"] = config.Provider{Type: config.ProviderTwilio, Rate: 1, Burst: 1, AccountSID: "AC1", Password: twilioToken,
		Feedback: config.Feedback{Enabled: true, PublicURL: publicURL + "/"}}
	cfg.Providers["push"] = config.Provider{Type: config.ProviderFCM, Rate: 1, Burst: 1}
	for _, c := range change {
		c(cfg)
	}
	o := cfg.EventOptions()
	o.Callbacks = map[string]lifecycle.Endpoint{"billing": {URL: "http://127.0.0.1:1/events", Secret: "s"}}
	f.events = lifecycle.NewRecorder(f.rdb, o)
	rc, err := New(Options{Config: cfg, Redis: f.rdb, Events: f.events, Metrics: f.metrics})
	if err != nil {
		t.Fatal(err)
	}
	f.rc = rc
	return f
}

// accepted records the accepted event of a message of tenant, as the API
// does: the message is ours.
func (f *fixture) accepted(t *testing.T, message, tenant string) {
	t.Helper()
	if err := f.events.Record(context.Background(), lifecycle.Event{Type: lifecycle.Accepted, Message: message, Tenant: tenant, Via: lifecycle.ViaAPI}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) receive(req Request) (Result, error) {
	return f.rc.Receive(context.Background(), req)
}

// types returns the types of message's events after its accepted one.
func (f *fixture) types(t *testing.T, message string) []lifecycle.Type {
	t.Helper()
	events, err := f.events.History(context.Background(), message)
	if err != nil {
		t.Fatal(err)
	}
	var ts []lifecycle.Type
	for _, e := range events {
		if e.Type != lifecycle.Accepted {
			ts = append(ts, e.Type)
		}
	}
	return ts
}

// history returns message's events after its accepted one.
func (f *fixture) history(t *testing.T, message string) []lifecycle.Event {
	t.Helper()
	events, err := f.events.History(context.Background(), message)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(events, func(e lifecycle.Event) bool { return e.Type == lifecycle.Accepted })
}

// suppressed returns provider's suppressions, by address.
func (f *fixture) suppressed(t *testing.T, provider string) map[string]string {
	t.Helper()
	sups, err := screen.New(f.rdb, "").Suppressions(context.Background(), provider)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range sups {
		out[s.Address] = s.Reason
	}
	return out
}

// snapshot returns every key of the database with its value's dump: what
// a refused request must leave as it was.
func (f *fixture) snapshot(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := f.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		out[k] = f.rdb.Dump(ctx, k).Val()
	}
	return out
}

// refused checks that req is refused with an error wrapping want, and
// leaves Redis as it was.
func (f *fixture) refused(t *testing.T, req Request, want error) {
	t.Helper()
	before := f.snapshot(t)
	if _, err := f.receive(req); !errors.Is(err, want) {
		t.Fatalf("Receive: %v, want %v", err, want)
	}
	if after := f.snapshot(t); !reflect.DeepEqual(before, after) {
		t.Error("a refused request changed Redis")
	}
}

// callbacks returns how many events wait in tenant's callback stream.
func (f *fixture) callbacks(t *testing.T, tenant string) int64 {
	t.Helper()
	n, err := f.rdb.XLen(context.Background(), "throttle:callbacks:{"+tenant+"}").Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

// recently is a moment a second ago: a signed request's fresh time.
func recently() time.Time { return time.Now().Add(-time.Second) }
