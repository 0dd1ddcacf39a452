package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Feedback is a provider's feedback block (ses, sendgrid, twilio): what its
// service reports later, read on the API's listener
// (docs/operations.md#the-providers-feedback). Read at start only.
type Feedback struct {
	Enabled bool `yaml:"enabled"` // default true where the block is given

	TopicARNs []string `yaml:"topic_arns"`   // ses: the SNS topics read; required
	CertHost  string   `yaml:"cert_host"`    // ses: SNS's certificates' host, "{region}" the topic's; DefaultCertHost
	CAFile    string   `yaml:"ca_file,path"` // ses: the CAs SNS's certificates chain to; default the system's

	VerificationKey Secret `yaml:"verification_key,secret=verification key"` // sendgrid: base64 DER ECDSA P-256; required

	PublicURL string `yaml:"public_url"`                   // twilio: the API's root as Twilio reaches it, which it signs over; required
	AuthToken Secret `yaml:"auth_token,secret=auth token"` // twilio: the account's auth token; see FeedbackAuthToken

	Tolerance time.Duration `yaml:"tolerance"` // ses, sendgrid: how far from now a signed time may be; see SignedWithin
}

// Defaults of a feedback block.
const (
	DefaultCertHost = "sns.{region}.amazonaws.com"
	// DefaultSNSTolerance is SNS's longest retry of a message, which keeps its time.
	DefaultSNSTolerance = time.Hour
	// DefaultSendGridTolerance: SendGrid signs each POST, retries too, when it sends it.
	DefaultSendGridTolerance = 5 * time.Minute
)

// feedbackKeys are the keys besides enabled of each type's feedback block.
var feedbackKeys = map[string][]string{
	ProviderSES:      {"topic_arns", "cert_host", "ca_file", "tolerance"},
	ProviderSendGrid: {"verification_key", "tolerance"},
	ProviderTwilio:   {"public_url", "auth_token"},
}

// topicARN is an SNS topic's ARN: arn:<partition>:sns:<region>:<account>:<name>.
var topicARN = regexp.MustCompile(`^arn:aws[a-z-]*:sns:([a-z0-9-]+):[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$`)

// Fill gives a feedback block read from a file its defaults.
func (f *Feedback) Fill(has func(key string) bool, _ func(key, why string)) {
	if !has("enabled") {
		f.Enabled = true
	}
	if !has("cert_host") {
		f.CertHost = DefaultCertHost
	}
}

// TopicRegion returns the region of an SNS topic's ARN, and whether it is one.
func TopicRegion(arn string) (string, bool) {
	m := topicARN.FindStringSubmatch(arn)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// SendGridKey returns the ECDSA P-256 public key of a verification key.
func SendGridKey(key string) (*ecdsa.PublicKey, error) {
	der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(key))
	if err != nil {
		return nil, errors.New("not base64")
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, errors.New("not a DER public key")
	}
	ec, ok := pub.(*ecdsa.PublicKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 key")
	}
	return ec, nil
}

// TrustStore returns the CAs of CertHost's certificates: those of CAFile,
// or nil (the system's) without one.
func (f Feedback) TrustStore() (*x509.CertPool, error) { return certPool(f.CAFile, false) }

// FeedbackAuthToken returns the token that checks a twilio provider's
// feedback: its auth_token, else its password when it has no username of
// its own (the password is then the account's auth token).
func (p Provider) FeedbackAuthToken() string {
	if p.Feedback.AuthToken != "" || p.Username != "" && string(p.Username) != p.AccountSID {
		return string(p.Feedback.AuthToken)
	}
	return string(p.Password)
}

// feedback checks a provider's feedback block, at path (the provider's).
func (v *validator) feedback(path string, pr Provider) {
	f, fpath := pr.Feedback, path+".feedback"
	keys := feedbackKeys[pr.Type]
	for _, k := range []string{"topic_arns", "cert_host", "ca_file", "verification_key", "public_url", "auth_token", "tolerance"} {
		set := v.c.src.has(fpath + "." + k)
		v.check(!set || slices.Contains(keys, k), fpath+"."+k, "only for type %s", typesTaking(k, feedbackKeys, nil))
	}
	if !f.Enabled {
		return // off, or not given: nothing is required
	}
	switch pr.Type {
	case ProviderSES:
		v.check(len(f.TopicARNs) > 0, fpath+".topic_arns", "required: the SNS topics SES publishes this provider's events to")
		for i, arn := range f.TopicARNs {
			_, ok := TopicRegion(arn)
			v.check(ok, fmt.Sprintf("%s.topic_arns[%d]", fpath, i), "not an SNS topic's ARN, arn:aws:sns:<region>:<account>:<topic> (got %s)", quote(arn))
		}
		v.check(f.CertHost != "" && !strings.ContainsAny(f.CertHost, "/ "), fpath+".cert_host",
			"must be a host, e.g. %s (got %s)", DefaultCertHost, quote(f.CertHost))
		v.caFile(fpath+".ca_file", f.CAFile)
	case ProviderSendGrid:
		if v.given(fpath+".verification_key", f.VerificationKey) {
			if f.VerificationKey != "" && !v.c.src.failedAt(fpath+".verification_key") {
				_, err := SendGridKey(string(f.VerificationKey))
				v.check(err == nil, fpath+".verification_key",
					"%v: give the Event Webhook's verification key as SendGrid's settings show it (base64 DER, ECDSA P-256)", err)
			}
		} else {
			v.failf(fpath+".verification_key", "required: the Event Webhook's verification key, from SendGrid's settings")
		}
	case ProviderTwilio:
		v.twilioFeedback(path, pr)
	}
	if v.c.src.has(fpath + ".tolerance") {
		v.durationAtLeast(fpath+".tolerance", f.Tolerance, time.Second)
	}
}

// twilioFeedback checks a twilio provider's public_url and auth token.
func (v *validator) twilioFeedback(path string, pr Provider) {
	f, fpath := pr.Feedback, path+".feedback"
	u, err := url.Parse(f.PublicURL)
	switch {
	case f.PublicURL == "":
		v.failf(fpath+".public_url", "required: the API's root as Twilio reaches it, e.g. https://api.example.com")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "":
		v.failf(fpath+".public_url", "must be an http:// or https:// URL without a query (got %s)", quote(f.PublicURL))
	}
	if v.given(fpath+".auth_token", f.AuthToken) {
		return
	}
	switch {
	case v.given(path+".username", pr.Username) && string(pr.Username) != pr.AccountSID:
		v.failf(fpath+".auth_token", "required: this provider logs in with an API key (username), and Twilio signs its requests with the account's auth token")
	case v.c.src.isUnresolved(path+".password") && !v.c.src.unresolvedUnder(fpath+".auth_token"):
		v.failf(fpath+".auth_token", "required here: this process reads the feedback's secrets but not the provider's password (worker -api-only)")
	}
}

// SignedWithin returns f's tolerance, or the default of provider type kind.
func (f Feedback) SignedWithin(kind string) time.Duration {
	switch {
	case f.Tolerance > 0:
		return f.Tolerance
	case kind == ProviderSES:
		return DefaultSNSTolerance
	}
	return DefaultSendGridTolerance
}
