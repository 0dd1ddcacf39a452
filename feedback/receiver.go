package feedback

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/screen"
)

// Options configure a Receiver. Config, Redis and Events are required.
type Options struct {
	// Config names the providers whose feedback block is on, and the key
	// prefix. Read once: a reload does not change the Receiver.
	Config   *config.Config
	Redis    redis.UniversalClient
	Events   *lifecycle.Recorder // records the events, and tells each message's tenant
	Remember time.Duration       // how long an applied report is remembered; default DefaultRemember
	Metrics  *Metrics            // nil: metrics registered nowhere
	Log      *slog.Logger        // SNS subscriptions confirmed or removed, failures; default slog.Default()
}

// Request is a provider's request, as the API received it.
type Request struct {
	Provider string // the provider's name, from the path
	Inbound  bool   // a reply to the provider's number (/inbound), not a report on a message
	URI      string // the path and query as they arrived (Twilio signs the URL it called)
	Header   http.Header
	Body     []byte
}

// reading is what a verified request says.
type reading struct {
	reports   []Report
	ignored   int  // events none of ours to apply
	confirmed bool // an SNS subscription was confirmed
}

// endpoint verifies one provider's requests and reads their reports; its
// errors wrap the package's.
type endpoint interface {
	read(ctx context.Context, req Request) (reading, error)
}

// Receiver reads the feedback of the config's providers. Safe for
// concurrent use.
type Receiver struct {
	endpoints map[string]endpoint
	applier   *applier
	metrics   *Metrics
}

// New returns the Receiver of o.Config's feedback blocks. An error names
// the provider and what of its block could not be read.
func New(o Options) (*Receiver, error) {
	if o.Config == nil || o.Redis == nil || o.Events == nil {
		return nil, errors.New("feedback: Options.Config, Redis and Events are required")
	}
	o.Metrics = cmp.Or(o.Metrics, NewMetrics(nil))
	o.Log = cmp.Or(o.Log, slog.Default())
	rc := &Receiver{endpoints: map[string]endpoint{}, metrics: o.Metrics,
		applier: &applier{rdb: o.Redis, prefix: o.Config.Redis.Prefix, remember: cmp.Or(o.Remember, DefaultRemember), events: o.Events,
			screen: screen.New(o.Redis, o.Config.Redis.Prefix), metrics: o.Metrics, log: o.Log}}
	for _, name := range slices.Sorted(maps.Keys(o.Config.Providers)) {
		p := o.Config.Providers[name]
		if !p.Feedback.Enabled {
			continue
		}
		ep, err := newEndpoint(name, p, o.Log)
		if err != nil {
			return nil, fmt.Errorf("feedback: providers.%s.feedback: %w", name, err)
		}
		if ep != nil {
			rc.endpoints[name] = ep
		}
	}
	return rc, nil
}

// newEndpoint returns the endpoint of p's feedback; nil for a type that has
// none.
func newEndpoint(name string, p config.Provider, log *slog.Logger) (endpoint, error) {
	f := p.Feedback
	switch p.Type {
	case config.ProviderSES:
		roots, err := f.TrustStore()
		if err != nil {
			return nil, err
		}
		topics := map[string]string{}
		for _, arn := range f.TopicARNs {
			region, ok := config.TopicRegion(arn)
			if !ok {
				return nil, fmt.Errorf("topic_arns: %q is not an SNS topic's ARN", arn)
			}
			topics[arn] = region
		}
		return &snsEndpoint{provider: name, topics: topics, certHost: cmp.Or(f.CertHost, config.DefaultCertHost),
			tolerance: f.SignedWithin(p.Type), certs: newCerts(roots), log: log}, nil
	case config.ProviderSendGrid:
		key, err := config.SendGridKey(string(f.VerificationKey))
		if err != nil {
			return nil, fmt.Errorf("verification_key: %w", err)
		}
		return &sendgridEndpoint{provider: name, key: key, tolerance: f.SignedWithin(p.Type)}, nil
	case config.ProviderTwilio:
		token := p.FeedbackAuthToken()
		if token == "" {
			return nil, errors.New("auth_token: not given, and the provider's password is not read here")
		}
		return &twilioEndpoint{provider: name, token: token, publicURL: strings.TrimRight(f.PublicURL, "/")}, nil
	}
	return nil, nil
}

// Providers returns the sorted names of the providers whose feedback is read.
func (rc *Receiver) Providers() []string { return slices.Sorted(maps.Keys(rc.endpoints)) }

// Receive verifies a provider's request and applies its reports, once
// each. Its error wraps ErrNoProvider, ErrMalformed, ErrSignature or
// ErrReplayed, or is Redis's (or a failed SNS confirmation's): then nothing
// was applied, and the provider's retry may be.
func (rc *Receiver) Receive(ctx context.Context, req Request) (Result, error) {
	ep, ok := rc.endpoints[req.Provider]
	if !ok {
		return Result{}, fmt.Errorf("%w: no provider %q reads its feedback here (providers.<name>.feedback)", ErrNoProvider, req.Provider)
	}
	if _, twilio := ep.(*twilioEndpoint); req.Inbound && !twilio {
		return Result{}, fmt.Errorf("%w: %s is not a twilio provider: only twilio takes replies", ErrNoProvider, req.Provider)
	}
	rd, err := ep.read(ctx, req)
	switch {
	case errors.Is(err, ErrSignature):
		rc.metrics.Refused.WithLabelValues(req.Provider, "signature").Inc()
	case errors.Is(err, ErrMalformed):
		rc.metrics.Refused.WithLabelValues(req.Provider, "malformed").Inc()
	}
	if err != nil {
		return Result{}, err
	}
	rc.metrics.Reports.WithLabelValues(req.Provider, resultIgnored).Add(float64(rd.ignored))
	res, err := rc.applier.apply(ctx, req.Provider, rd.reports)
	res.Ignored, res.Confirmed = rd.ignored, rd.confirmed
	return res, err
}
