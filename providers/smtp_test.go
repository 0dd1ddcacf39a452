package providers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// smtpBackend is a real SMTP server's backend (go-smtp) that answers by
// recipient and keeps what it accepted.
type smtpBackend struct {
	t        *testing.T
	mu       sync.Mutex
	accepted []string // raw messages
}

func (b *smtpBackend) NewSession(*smtp.Conn) (smtp.Session, error) { return &smtpSession{b: b}, nil }

type smtpSession struct {
	b        *smtpBackend
	authed   bool
	from, to string
}

func (s *smtpSession) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *smtpSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != "mailer" || pass != "s3cret" {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "Authentication credentials invalid"}
		}
		s.authed = true
		return nil
	}), nil
}

func (s *smtpSession) Mail(from string, _ *smtp.MailOptions) error {
	if !s.authed {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	s.from = from
	return nil
}

func (s *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = to
	switch to {
	case "dead@example.com":
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "<" + to + ">: Recipient address rejected: No such user"}
	case "busy@example.com":
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Try again later"}
	}
	return nil
}

func (s *smtpSession) Data(r io.Reader) error {
	raw, _ := io.ReadAll(r)
	switch s.to {
	case "rate@example.com":
		return &smtp.SMTPError{Code: 454, EnhancedCode: smtp.EnhancedCode{4, 7, 0}, Message: "Throttling failure: Maximum sending rate exceeded."}
	case "daily@example.com":
		return &smtp.SMTPError{Code: 454, EnhancedCode: smtp.EnhancedCode{4, 7, 0}, Message: "Throttling failure: Daily message quota exceeded."}
	case "spam@example.com":
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "Message rejected: content"}
	}
	if s.from != "noreply@example.com" {
		s.b.t.Errorf("MAIL FROM %q", s.from)
	}
	s.b.mu.Lock()
	s.b.accepted = append(s.b.accepted, string(raw))
	s.b.mu.Unlock()
	return nil
}

func (s *smtpSession) Reset()        { s.to = "" }
func (s *smtpSession) Logout() error { return nil }

// startSMTP starts a real SMTP server on a loopback port.
func startSMTP(t *testing.T) (*smtpBackend, int) {
	t.Helper()
	be := &smtpBackend{t: t}
	srv := smtp.NewServer(be)
	srv.Domain, srv.AllowInsecureAuth = "localhost", true
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	n, _ := strconv.Atoi(port)
	return be, n
}

func TestSMTPClassifiesEveryAnswer(t *testing.T) {
	t.Parallel()
	be, port := startSMTP(t)
	p := NewSMTP(Settings{Name: "mail"}, "localhost", port, SMTPNoTLS, "mailer", "s3cret", "noreply@example.com")
	p.QuotaReset = 30 * time.Minute
	p.now = func() time.Time { return time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC) }
	cases := map[string]want{
		"ok@example.com":    {sent: true, id: "<t1@localhost>"},
		"dead@example.com":  {outcome: Dead, text: "550 \"5.1.1 <d***@example.com>: Recipient address rejected: No such user\", affected recipient(s): <d***@example.com>"},
		"busy@example.com":  {retry: true, text: "451"},
		"rate@example.com":  {outcome: Pause, after: time.Second},
		"daily@example.com": {outcome: Pause, at: time.Date(2026, 3, 2, 0, 30, 0, 0, time.UTC)},
		"spam@example.com":  {outcome: Reject, text: "554"},
	}
	data := []byte(`{"subject":"Welcome","body":"Hello","html":"<p>Hello</p>"}`)
	for to, w := range cases {
		id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: to, Data: data})
		checkOutcome(t, to, id, err, w)
		noRecipient(t, err, to)
	}
	be.mu.Lock()
	if len(be.accepted) != 1 {
		t.Fatalf("the server accepted %d messages, want 1", len(be.accepted))
	}
	msg, err := mail.ReadMessage(strings.NewReader(be.accepted[0]))
	if err != nil || msg.Header.Get("Subject") != "Welcome" || msg.Header.Get("To") != "<ok@example.com>" {
		t.Errorf("message headers %v, %v", msg.Header, err)
	}
	if !strings.Contains(be.accepted[0], "Hello") || !strings.Contains(be.accepted[0], "<p>Hello</p>") {
		t.Errorf("message %q lacks the body or html", be.accepted[0])
	}
	be.mu.Unlock()

	wrong := NewSMTP(Settings{Name: "mail"}, "localhost", port, SMTPNoTLS, "mailer", "wrong", "noreply@example.com")
	id, err := wrong.Send(ctx(t), Message{ID: "t2", Recipient: "ok@example.com", Data: data})
	checkOutcome(t, "wrong password", id, err, want{outcome: Broken})
	down := NewSMTP(Settings{Name: "mail", Timeout: time.Second}, "127.0.0.1", 1, SMTPNoTLS, "", "", "noreply@example.com")
	id, err = down.Send(ctx(t), Message{ID: "t3", Recipient: "ok@example.com", Data: data})
	checkOutcome(t, "no server", id, err, want{retry: true})
}

// selfSigned returns a certificate for localhost and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestSMTPStartTLS sends through the default mode, STARTTLS required, to a
// server that offers it; a server that does not, or whose certificate is
// not trusted, is refused before the password is sent: broken, since no
// retry helps.
func TestSMTPStartTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	be := &smtpBackend{t: t}
	srv := smtp.NewServer(be)
	srv.Domain, srv.TLSConfig = "localhost", &tls.Config{Certificates: []tls.Certificate{cert}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	p := NewSMTP(Settings{Name: "mail", RootCAs: pool}, "localhost", port, "", "mailer", "s3cret", "noreply@example.com")
	data := []byte(`{"subject":"Welcome","body":"Hello"}`)
	if id, err := p.Send(ctx(t), Message{ID: "t1", Recipient: "ok@example.com", Data: data}); err != nil || id != "<t1@localhost>" {
		t.Fatalf("over STARTTLS: %q, %v", id, err)
	}
	be.mu.Lock()
	n := len(be.accepted)
	be.mu.Unlock()
	if n != 1 {
		t.Fatalf("the server accepted %d messages, want 1", n)
	}

	_, plainPort := startSMTP(t) // offers no STARTTLS
	plain := NewSMTP(Settings{Name: "mail"}, "localhost", plainPort, "", "mailer", "s3cret", "noreply@example.com")
	id, err := plain.Send(ctx(t), Message{ID: "t2", Recipient: "ok@example.com", Data: data})
	checkOutcome(t, "no STARTTLS offered", id, err, want{outcome: Broken})
	untrusted := NewSMTP(Settings{Name: "mail"}, "localhost", port, "", "mailer", "s3cret", "noreply@example.com")
	id, err = untrusted.Send(ctx(t), Message{ID: "t3", Recipient: "ok@example.com", Data: data})
	checkOutcome(t, "untrusted certificate", id, err, want{outcome: Broken})
}
