package providers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sesv2"
	"github.com/aws/aws-sdk-go-v2/service/sesv2/types"
	"github.com/aws/smithy-go"
)

// SES sends email through Amazon SES v2 (SendEmail), the SDK's retries off.
type SES struct {
	Settings
	From             string
	ConfigurationSet string        // passed with every send, if set
	QuotaReset       time.Duration // after 00:00 UTC, when a send refused for the daily quota is tried again
	client           *sesv2.Client
	now              func() time.Time
}

// NewSES returns an SES provider in region with static credentials.
func NewSES(s Settings, region, accessKeyID, secretAccessKey, from string) *SES {
	opts := sesv2.Options{
		Region:      region,
		Credentials: credentials.NewStaticCredentialsProvider(accessKeyID, secretAccessKey, ""),
		Retryer:     aws.NopRetryer{}, // the throttle owns every wait
		HTTPClient:  s.httpClient(),
	}
	if s.BaseURL != "" {
		opts.BaseEndpoint = aws.String(s.BaseURL)
	}
	return &SES{Settings: s, From: from, client: sesv2.New(opts), now: time.Now}
}

// Scopes returns none: SES limits the whole account.
func (p *SES) Scopes(Message) []string { return nil }

// Send sends m and classifies the answer; the ID of a message sent is its
// MessageId.
func (p *SES) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := emailContent("ses "+p.Name, m)
	if err != nil {
		return "", err
	}
	body := &types.Body{}
	if c.Body != "" {
		body.Text = &types.Content{Data: aws.String(c.Body), Charset: aws.String("UTF-8")}
	}
	if c.HTML != "" {
		body.Html = &types.Content{Data: aws.String(c.HTML), Charset: aws.String("UTF-8")}
	}
	in := &sesv2.SendEmailInput{
		FromEmailAddress: aws.String(p.From),
		Destination:      &types.Destination{ToAddresses: []string{m.Recipient}},
		Content: &types.EmailContent{Simple: &types.Message{
			Subject: &types.Content{Data: aws.String(c.Subject), Charset: aws.String("UTF-8")}, Body: body}},
		EmailTags: []types.MessageTag{{Name: aws.String("task_id"), Value: aws.String(tagValue(m.ID))}},
	}
	if p.ConfigurationSet != "" {
		in.ConfigurationSetName = aws.String(p.ConfigurationSet)
	}
	out, err := p.client.SendEmail(ctx, in)
	if err != nil {
		return "", p.classify(err)
	}
	return aws.ToString(out.MessageId), nil
}

// classify maps an SES error to its outcome.
func (p *SES) classify(err error) error {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return Unreached(fmt.Errorf("ses %s: %w", p.Name, err))
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	code, msg := ae.ErrorCode(), ae.ErrorMessage()
	what := fmt.Sprintf("ses %s: %s: %s", p.Name, code, msg)
	switch {
	case strings.Contains(msg, "Daily message quota exceeded"):
		return pause(0, nextReset(p.now(), p.QuotaReset), "", "%s", what)
	case strings.Contains(msg, "Maximum sending rate exceeded") || code == "TooManyRequestsException" ||
		code == "LimitExceededException" || code == "Throttling" || code == "ThrottlingException":
		return pause(time.Second, time.Time{}, "", "%s", what)
	case code == "AccountSuspendedException" || code == "SendingPausedException" || code == "MailFromDomainNotVerifiedException" ||
		code == "UnrecognizedClientException" || code == "InvalidSignatureException" || code == "AccessDeniedException" ||
		status == 401 || status == 403:
		return broken("%s", what)
	case status >= 500 || code == "InternalFailure" || code == "ServiceUnavailable":
		return fmt.Errorf("%s", what)
	}
	return reject("%s", what) // MessageRejected, NotFoundException, BadRequestException
}

// nextReset is the first moment after now that is reset past 00:00 UTC.
func nextReset(now time.Time, reset time.Duration) time.Time {
	now = now.UTC()
	at := now.Truncate(24 * time.Hour).Add(reset)
	if !at.After(now) {
		at = at.Add(24 * time.Hour)
	}
	return at
}

// tagValue keeps the characters SES allows in a tag value.
func tagValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' || r == '@') {
			return r
		}
		return '_'
	}, s)
}
