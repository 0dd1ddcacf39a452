package feedback

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Limits of the signing certificates.
const (
	maxCerts     = 32       // kept at once: SNS signs with a few, one per region
	maxCertBytes = 64 << 10 // a PEM file of a certificate and its issuers
	certTimeout  = 5 * time.Second
)

// certs fetches SNS's signing certificates, verifies that each chains to
// the trust store, and keeps the verified ones by URL until they expire.
// SNS serves a certificate without its issuer: that is fetched where the
// certificate names it (Authority Information Access), and trusted only as
// a link to the roots. Safe for concurrent use.
type certs struct {
	client *http.Client   // https only to the trust store's hosts; no redirects
	roots  *x509.CertPool // nil: the system's

	mu   sync.Mutex
	kept map[string]*x509.Certificate
}

func newCerts(roots *x509.CertPool) *certs {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &certs{roots: roots, kept: map[string]*x509.Certificate{},
		client: &http.Client{Transport: tr, Timeout: certTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get returns the verified certificate at url: an error wrapping
// ErrSignature if it is not trusted, another if it could not be fetched
// (503: the vendor retries).
func (c *certs) get(ctx context.Context, url string) (*x509.Certificate, error) {
	c.mu.Lock()
	cert := c.kept[url]
	c.mu.Unlock()
	if cert != nil && time.Now().Before(cert.NotAfter) {
		return cert, nil
	}
	found, err := c.fetch(ctx, url)
	switch {
	case errors.Is(err, ErrSignature):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("feedback: the signing certificate at %s: %w", url, err)
	}
	if err := c.verify(ctx, found[0], found[1:]); err != nil {
		return nil, fmt.Errorf("%w: the signing certificate at %s is not trusted: %v", ErrSignature, url, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.kept) >= maxCerts {
		for u, old := range c.kept { // the expired, else any: a few fetches more at worst
			if time.Now().After(old.NotAfter) || len(c.kept) >= maxCerts {
				delete(c.kept, u)
			}
		}
	}
	c.kept[url] = found[0]
	return found[0], nil
}

// verify checks that leaf chains to the roots through intermediates, or
// through the issuers it names.
func (c *certs) verify(ctx context.Context, leaf *x509.Certificate, intermediates []*x509.Certificate) error {
	pool := x509.NewCertPool()
	for _, ic := range intermediates {
		pool.AddCert(ic)
	}
	opts := x509.VerifyOptions{Roots: c.roots, Intermediates: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	_, err := leaf.Verify(opts)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) || len(leaf.IssuingCertificateURL) == 0 {
		return err
	}
	for _, u := range leaf.IssuingCertificateURL {
		issuers, ferr := c.fetch(ctx, u)
		if ferr != nil {
			return fmt.Errorf("%v; its issuer at %s: %v", err, u, ferr)
		}
		for _, ic := range issuers {
			pool.AddCert(ic)
		}
	}
	_, err = leaf.Verify(opts)
	return err
}

// fetch GETs the certificates at url: PEM, or one DER certificate (as
// issuers often are). A URL that answers without a certificate is
// ErrSignature; one that does not answer is another error.
func (c *certs) fetch(ctx context.Context, url string) ([]*x509.Certificate, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s", ErrSignature, url, res.Status)
	}
	data, err := io.ReadAll(io.LimitReader(res.Body, maxCertBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCertBytes {
		return nil, fmt.Errorf("%w: %s holds more than %d bytes", ErrSignature, url, maxCertBytes)
	}
	var found []*x509.Certificate
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrSignature, url, err)
			}
			found = append(found, cert)
		}
	}
	if len(found) == 0 {
		cert, err := x509.ParseCertificate(data)
		if err != nil {
			return nil, fmt.Errorf("%w: %s holds neither PEM certificates nor a DER certificate", ErrSignature, url)
		}
		found = append(found, cert)
	}
	return found, nil
}
