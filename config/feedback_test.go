package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sendgridKey is a verification key as SendGrid's settings show one.
const sendgridKey = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEE6qbtqyCsPU1rxNaAaUSUZd/W3P25Xm6q14hSmcMGwtsCgEqex+vRR308rKDmuOHz1LpAnvhnS1FoGM9S6iWow=="

// feedbackFile is a config whose three providers read their feedback,
// the secrets from the environment.
const feedbackFile = `providers:
  email:
    type: ses
    region: eu-west-1
    access_key_id: AKIDEXAMPLE
    secret_access_key: {env: AWS_SECRET}
    from: noreply@example.com
    feedback:
      topic_arns: [arn:aws:sns:eu-west-1:123456789012:ses-events]
    rate: 14
    burst: 14
  grid:
    type: sendgrid
    api_key: {env: SENDGRID_API_KEY}
    from: noreply@example.com
    feedback:
      verification_key: {env: SENDGRID_WEBHOOK_KEY}
      tolerance: 10m
    rate: 100
    burst: 100
  sms:
    type: twilio
    account_sid: AC0123
    password: {env: TWILIO_AUTH_TOKEN}
    from: "+15550001111"
    feedback:
      public_url: https://api.example.com
      auth_token: {env: TWILIO_FEEDBACK_TOKEN}
    rate: 1
    burst: 1
`

// TestFeedback: a feedback block's defaults, and the secrets it takes.
func TestFeedback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, feedbackFile)
	c, err := LoadWithEnv(path, env(map[string]string{"AWS_SECRET": "aws-secret", "SENDGRID_API_KEY": "sg-api-key",
		"SENDGRID_WEBHOOK_KEY": sendgridKey, "TWILIO_AUTH_TOKEN": "twilio-token", "TWILIO_FEEDBACK_TOKEN": "feedback-token"}))
	if err != nil {
		t.Fatal(err)
	}
	ses, grid, sms := c.Providers["email"].Feedback, c.Providers["grid"].Feedback, c.Providers["sms"].Feedback
	if !ses.Enabled || ses.CertHost != DefaultCertHost || ses.SignedWithin(ProviderSES) != DefaultSNSTolerance {
		t.Errorf("ses's feedback %+v: want it on, with the default cert host and tolerance", ses)
	}
	if region, ok := TopicRegion(ses.TopicARNs[0]); !ok || region != "eu-west-1" {
		t.Errorf("TopicRegion = %q, %v; want eu-west-1", region, ok)
	}
	if _, err := SendGridKey(string(grid.VerificationKey)); err != nil || grid.SignedWithin(ProviderSendGrid) != 10*time.Minute {
		t.Errorf("sendgrid's key: %v, tolerance %s; want the key and 10m", err, grid.SignedWithin(ProviderSendGrid))
	}
	if got := c.Providers["sms"].FeedbackAuthToken(); got != "feedback-token" || sms.PublicURL != "https://api.example.com" {
		t.Errorf("twilio's token %q, public URL %q", got, sms.PublicURL)
	}
	for _, tt := range []struct {
		name string
		p    Provider
		want string
	}{
		{"the password, without a username", Provider{AccountSID: "AC1", Password: "auth"}, "auth"},
		{"the password, the username the account", Provider{AccountSID: "AC1", Username: "AC1", Password: "auth"}, "auth"},
		{"none, with an API key", Provider{AccountSID: "AC1", Username: "SK1", Password: "key-secret"}, ""},
		{"its own", Provider{AccountSID: "AC1", Username: "SK1", Password: "key-secret", Feedback: Feedback{AuthToken: "auth"}}, "auth"},
	} {
		if got := tt.p.FeedbackAuthToken(); got != tt.want {
			t.Errorf("%s: FeedbackAuthToken = %q, want %q", tt.name, got, tt.want)
		}
	}
	if c.Providers["email"].Feedback.TopicARNs == nil || Default().Providers["x"].Feedback.Enabled {
		t.Error("a provider without a feedback block has it on")
	}
	noSecret(t, "the Config", fmt.Sprintf("%v %+v %#v", c, c, c), "feedback-token", "twilio-token")
}

// TestFeedbackSecretsWhereRead: the API alone (LoadAPI) reads the
// feedback's secrets, which check what the services POST to it, and not
// the providers' others; enqueue (LoadProducer) reads none. An API-only
// process that would check Twilio's requests with a password it does not
// read is refused.
func TestFeedbackSecretsWhereRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, feedbackFile)
	vars := env(map[string]string{"SENDGRID_WEBHOOK_KEY": sendgridKey, "TWILIO_FEEDBACK_TOKEN": "feedback-token"})
	c, err := LoadAPI(path, vars)
	if err != nil {
		t.Fatal(err)
	}
	if c.Providers["grid"].Feedback.VerificationKey != sendgridKey || c.Providers["sms"].FeedbackAuthToken() != "feedback-token" ||
		c.Providers["grid"].APIKey != "" || c.Providers["sms"].Password != "" {
		t.Errorf("LoadAPI: want the feedback's secrets and none of the providers' others")
	}
	if c, err = LoadProducer(path, noEnv); err != nil || c.Providers["grid"].Feedback.VerificationKey != "" {
		t.Errorf("LoadProducer: %v; want it to load without the feedback's secrets", err)
	}
	writeFile(t, path, strings.Replace(feedbackFile, "      auth_token: {env: TWILIO_FEEDBACK_TOKEN}\n", "", 1))
	_, err = LoadAPI(path, vars)
	want := path + ":27: providers.sms.feedback.auth_token: required here: this process reads the feedback's secrets but not the provider's password (worker -api-only)"
	if err == nil || err.Error() != want {
		t.Errorf("LoadAPI without auth_token:\n got %v\nwant %s", err, want)
	}
	if _, err := LoadWithEnv(path, env(map[string]string{"AWS_SECRET": "a", "SENDGRID_API_KEY": "b", "SENDGRID_WEBHOOK_KEY": sendgridKey,
		"TWILIO_AUTH_TOKEN": "twilio-token"})); err != nil {
		t.Errorf("a worker, which reads the password: %v", err)
	}
}
