package providers

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"time"

	"github.com/wneessen/go-mail"
)

// SMTP TLS modes.
const (
	SMTPStartTLS      = "starttls"      // STARTTLS, required (the default)
	SMTPTLS           = "tls"           // implicit TLS (port 465)
	SMTPOpportunistic = "opportunistic" // STARTTLS when offered
	SMTPNoTLS         = "none"          // plain text: a relay on localhost only
)

// SMTP sends email to an SMTP server (an SES SMTP endpoint, a relay), one
// connection per message.
type SMTP struct {
	Settings
	Host               string
	Port               int
	TLS                string // one of the modes; "" is SMTPStartTLS
	Username, Password string // "" sends without AUTH
	From               string
	QuotaReset         time.Duration // as SES.QuotaReset, for SES's SMTP endpoint
	// TLSConfig replaces the default TLS settings (tests); its ServerName
	// defaults to Host, its RootCAs to Settings.RootCAs.
	TLSConfig *tls.Config
	now       func() time.Time
}

// NewSMTP returns an SMTP provider.
func NewSMTP(s Settings, host string, port int, tls, username, password, from string) *SMTP {
	return &SMTP{Settings: s, Host: host, Port: port, TLS: tls, Username: username, Password: password, From: from, now: time.Now}
}

// Scopes returns none: an SMTP server limits the whole connection.
func (p *SMTP) Scopes(Message) []string { return nil }

// client returns a go-mail client for one send; go-mail does not retry.
func (p *SMTP) client() (*mail.Client, error) {
	opts := []mail.Option{mail.WithPort(p.Port), mail.WithTimeout(p.timeout())}
	switch p.TLS {
	case SMTPTLS:
		opts = append(opts, mail.WithSSL())
	case SMTPOpportunistic:
		opts = append(opts, mail.WithTLSPolicy(mail.TLSOpportunistic))
	case SMTPNoTLS:
		opts = append(opts, mail.WithTLSPolicy(mail.NoTLS))
	default:
		opts = append(opts, mail.WithTLSPolicy(mail.TLSMandatory))
	}
	if p.TLSConfig != nil || p.RootCAs != nil {
		cfg := &tls.Config{}
		if p.TLSConfig != nil {
			cfg = p.TLSConfig.Clone()
		}
		cfg.ServerName, cfg.RootCAs = cmp.Or(cfg.ServerName, p.Host), cmp.Or(cfg.RootCAs, p.RootCAs)
		opts = append(opts, mail.WithTLSConfig(cfg))
	}
	if p.Username != "" {
		opts = append(opts, mail.WithSMTPAuth(mail.SMTPAuthPlain), mail.WithUsername(p.Username), mail.WithPassword(p.Password))
	}
	return mail.NewClient(p.Host, opts...)
}

// Send sends m and classifies the answer; the ID of a message sent is the
// Message-ID it carries (made of the task ID), which bounces name.
func (p *SMTP) Send(ctx context.Context, m Message) (id string, err error) {
	defer redact(&err, m.Recipient)
	c, err := emailContent("smtp "+p.Name, m)
	if err != nil {
		return "", err
	}
	msg := mail.NewMsg()
	if err := msg.From(p.From); err != nil {
		return "", broken("smtp %s: from: %v", p.Name, err)
	}
	if err := msg.To(m.Recipient); err != nil {
		return "", dead("smtp %s: not an email address: %v", p.Name, err)
	}
	msg.Subject(c.Subject)
	msg.SetMessageIDWithValue(tagValue(m.ID) + "@" + p.Host)
	switch {
	case c.Body != "" && c.HTML != "":
		msg.SetBodyString(mail.TypeTextPlain, c.Body)
		msg.AddAlternativeString(mail.TypeTextHTML, c.HTML)
	case c.HTML != "":
		msg.SetBodyString(mail.TypeTextHTML, c.HTML)
	default:
		msg.SetBodyString(mail.TypeTextPlain, c.Body)
	}
	cl, err := p.client()
	if err != nil {
		return "", broken("smtp %s: %v", p.Name, err)
	}
	if err := cl.DialAndSendWithContext(ctx, msg); err != nil {
		return "", p.classify(err)
	}
	return msg.GetMessageID(), nil
}

// classify maps an SMTP failure to its outcome.
func (p *SMTP) classify(err error) error {
	code, rcpt := 0, false
	var se *mail.SendError
	var te *textproto.Error
	switch {
	case errors.As(err, &se):
		code, rcpt = se.ErrorCode(), se.Reason == mail.ErrSMTPRcptTo
	case errors.As(err, &te):
		code = te.Code
	}
	what := fmt.Sprintf("smtp %s: %v", p.Name, err)
	text := err.Error()
	switch {
	case strings.Contains(text, "does not support STARTTLS"):
		// The server cannot be reached safely as configured: no retry helps.
		return broken("%s", what)
	case strings.Contains(text, "Daily message quota exceeded"):
		return pause(0, nextReset(p.now(), p.QuotaReset), "", "%s", what)
	case code == 454 && strings.Contains(strings.ToLower(text), "throttl"), code == 421 && strings.Contains(text, "rate"):
		return pause(time.Second, time.Time{}, "", "%s", what)
	case code == 530 || code == 534 || code == 535 || code == 454 && strings.Contains(text, "uthentication"):
		return broken("%s", what)
	case code >= 500 && rcpt:
		return dead("%s", what)
	case code >= 500:
		return reject("%s", what)
	}
	// 4xx, a refused or lost connection, an untrusted certificate.
	return Unreached(fmt.Errorf("smtp %s: %w", p.Name, err))
}
