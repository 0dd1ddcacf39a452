package feedback

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The vendors' side of the tests, written from their documentation: an
// SNS that serves its signing certificate and takes subscription
// confirmations, on a loopback TLS server under a throwaway PKI, and the
// signers of SNS, SendGrid and Twilio requests.

// authority is a throwaway CA: its certificate and key.
type authority struct {
	cert *x509.Certificate
	key  *rsa.PrivateKey
	der  []byte
}

var serial int64

// issue makes a certificate of tmpl for key, signed by ca (self-signed if
// nil), valid for a day.
func issue(t *testing.T, tmpl *x509.Certificate, key *rsa.PrivateKey, ca *authority) *authority {
	t.Helper()
	serial++
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano() + serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	parent, parentKey := tmpl, key
	if ca != nil {
		parent, parentKey = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key, der: der}
}

// rsaKeys are the tests' RSA keys, made once: a fixture takes seven,
// each other than the others (rsaKey hands them out in turn).
var (
	rsaKeys = sync.OnceValues(func() ([]*rsa.PrivateKey, error) {
		keys := make([]*rsa.PrivateKey, 8)
		for i := range keys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				return nil, err
			}
			keys[i] = k
		}
		return keys, nil
	})
	rsaNext int
)

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	keys, err := rsaKeys()
	if err != nil {
		t.Fatal(err)
	}
	rsaNext++
	return keys[rsaNext%len(keys)]
}

// newCA makes a root CA, or an intermediate signed by parent.
func newCA(t *testing.T, name string, parent *authority) *authority {
	return issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, rsaKey(t), parent)
}

func pemOf(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }

// fakeSNS is SNS's side: its signing certificate, which names its issuer
// (an intermediate under root) where SNS's do, and its ConfirmSubscription
// URL. SNS serves its signing certificate alone, as AWS does.
type fakeSNS struct {
	srv     *httptest.Server
	host    string // host:port, the feedback's cert_host
	caFile  string // the root, the trust store
	signer  *authority
	issuer  []byte     // the signer's issuer, DER, where the signer names it
	foreign *authority // a signing certificate of another CA, served at /foreign.pem

	mu        sync.Mutex
	confirmed []string // the tokens of the subscriptions confirmed
	certGets  int      // GETs of the signing certificate
}

func newFakeSNS(t *testing.T) *fakeSNS {
	t.Helper()
	f := &fakeSNS{}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.host = f.srv.Listener.Addr().String()
	root := newCA(t, "test root", nil)
	mid := newCA(t, "test intermediate", root)
	f.issuer = mid.der
	f.signer = issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "sns.amazonaws.com"}, DNSNames: []string{"sns.amazonaws.com"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IssuingCertificateURL: []string{"https://" + f.host + "/issuer.cer"}}, rsaKey(t), mid)
	other := newCA(t, "another root", nil)
	f.foreign = issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "sns.amazonaws.com"}, KeyUsage: x509.KeyUsageDigitalSignature},
		rsaKey(t), other)
	serving := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, rsaKey(t), root)
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{serving.der}, PrivateKey: serving.key}}}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	f.caFile = filepath.Join(t.TempDir(), "sns-root.pem")
	if err := os.WriteFile(f.caFile, pemOf(root.der), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeSNS) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.URL.Path == "/SimpleNotificationService-test.pem":
		f.certGets++
		w.Write(pemOf(f.signer.der))
	case r.URL.Path == "/issuer.cer":
		w.Write(f.issuer)
	case r.URL.Path == "/foreign.pem":
		w.Write(pemOf(f.foreign.der))
	case r.URL.Query().Get("Action") == "ConfirmSubscription":
		f.confirmed = append(f.confirmed, r.URL.Query().Get("Token"))
		w.Write([]byte("<ConfirmSubscriptionResponse/>"))
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeSNS) certURL() string {
	return "https://" + f.host + "/SimpleNotificationService-test.pem"
}

func (f *fakeSNS) confirmations() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.confirmed...), f.certGets
}

// snsPost is an SNS message as the tests build it, before it is signed.
type snsPost struct {
	Type, MessageID, TopicArn, Message, Timestamp, Token, SubscribeURL, SigningCertURL string
	Subject                                                                            *string
	Version                                                                            string // SignatureVersion: "1" or "2"
	At                                                                                 time.Time
}

// body signs p with key, as AWS documents it ("Verifying the signatures of
// Amazon SNS messages"), and returns its JSON.
func (p snsPost) body(t *testing.T, key *rsa.PrivateKey) []byte {
	t.Helper()
	if p.Timestamp == "" {
		p.Timestamp = p.At.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	fields := [][2]string{{"Message", p.Message}, {"MessageId", p.MessageID}, {"Timestamp", p.Timestamp}, {"TopicArn", p.TopicArn}, {"Type", p.Type}}
	if p.Type == "Notification" {
		if p.Subject != nil {
			fields = append(fields, [2]string{"Subject", *p.Subject})
		}
	} else {
		fields = append(fields, [2]string{"SubscribeURL", p.SubscribeURL}, [2]string{"Token", p.Token})
	}
	sort.Slice(fields, func(i, j int) bool { return fields[i][0] < fields[j][0] })
	var signed strings.Builder
	for _, kv := range fields {
		signed.WriteString(kv[0] + "\n" + kv[1] + "\n")
	}
	hash, digest := crypto.SHA256, sha256.Sum256([]byte(signed.String()))
	sum := digest[:]
	if p.Version == "1" {
		s1 := sha1.Sum([]byte(signed.String()))
		hash, sum = crypto.SHA1, s1[:]
	}
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, hash, sum)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{"Type": p.Type, "MessageId": p.MessageID, "TopicArn": p.TopicArn, "Message": p.Message,
		"Timestamp": p.Timestamp, "SignatureVersion": p.Version, "Signature": base64.StdEncoding.EncodeToString(sig),
		"SigningCertURL": p.SigningCertURL, "UnsubscribeURL": "https://sns.example/?Action=Unsubscribe"}
	if p.Subject != nil {
		m["Subject"] = *p.Subject
	}
	if p.Type != "Notification" {
		m["Token"], m["SubscribeURL"] = p.Token, p.SubscribeURL
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendgridSigner signs Event Webhook requests as SendGrid does: ECDSA
// P-256 over the timestamp and the body, base64 of the ASN.1 signature.
type sendgridSigner struct{ key *ecdsa.PrivateKey }

func newSendGridSigner(t *testing.T) sendgridSigner {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return sendgridSigner{k}
}

// verificationKey is the public key as SendGrid's settings show it.
func (s sendgridSigner) verificationKey(t *testing.T) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&s.key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(der)
}

// headers returns the signed request's headers, signed at at.
func (s sendgridSigner) headers(t *testing.T, at time.Time, body []byte) http.Header {
	t.Helper()
	ts := strconv.FormatInt(at.Unix(), 10)
	sum := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, s.key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	h.Set("X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig))
	h.Set("X-Twilio-Email-Event-Webhook-Timestamp", ts)
	return h
}

// twilioHeaders signs a form POST to fullURL as Twilio documents it
// ("Webhooks security"): the URL, then each parameter's name and value in
// the order of the names, HMAC-SHA1 with the auth token, base64.
func twilioHeaders(token, fullURL string, form url.Values) http.Header {
	names := make([]string, 0, len(form))
	for k := range form {
		names = append(names, k)
	}
	sort.Strings(names)
	data := fullURL
	for _, k := range names {
		vs := append([]string(nil), form[k]...)
		sort.Strings(vs)
		for _, v := range vs {
			data += k + v
		}
	}
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(data))
	h := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	h.Set("X-Twilio-Signature", base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return h
}
