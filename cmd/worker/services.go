package main

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/feedback"
	"github.com/notify-throttle/throttler/lifecycle"
	"github.com/notify-throttle/throttler/providers"
)

// newService returns the adapter of a service provider (see newSender)
// with its retry settings.
func newService(name string, p config.Provider, roots *x509.CertPool) (providers.Provider, error) {
	var err error
	s := providers.Settings{Name: name, Timeout: p.Timeout, ScopePause: p.ScopePause, BaseURL: p.BaseURL, RootCAs: roots}
	var sc providers.Scoper
	switch p.Type {
	case config.ProviderSMTP:
		m := providers.NewSMTP(s, p.Host, p.Port, p.TLS, string(p.Username), string(p.Password), p.From)
		m.QuotaReset = p.QuotaReset
		sc = m
	case config.ProviderSES:
		m := providers.NewSES(s, p.Region, string(p.AccessKeyID), string(p.SecretAccessKey), p.From)
		m.QuotaReset, m.ConfigurationSet = p.QuotaReset, p.ConfigurationSet
		sc = m
	case config.ProviderTwilio:
		tw := providers.NewTwilio(s, p.AccountSID, cmp.Or(string(p.Username), p.AccountSID), string(p.Password), p.From, p.MessagingServiceSID)
		if p.Feedback.Enabled {
			tw.StatusCallback = feedback.TwilioCallback(p.Feedback.PublicURL, name)
		}
		sc = tw
	case config.ProviderSendGrid:
		sc = providers.NewSendGrid(s, string(p.APIKey), p.From, p.FromName)
	case config.ProviderFCM:
		var key []byte
		if p.CredentialsFile != "" {
			if key, err = os.ReadFile(p.CredentialsFile); err != nil {
				return nil, fmt.Errorf("provider %s: credentials_file: %w", name, err)
			}
		}
		sc, err = providers.NewFCM(context.Background(), s, p.ProjectID, string(key), p.TokenURL, string(p.Token))
	case config.ProviderAPNs:
		var key []byte
		if key, err = os.ReadFile(p.KeyFile); err != nil {
			return nil, fmt.Errorf("provider %s: key_file: %w", name, err)
		}
		sc, err = providers.NewAPNs(s, p.TeamID, p.KeyID, p.Topic, string(key))
	default:
		return nil, fmt.Errorf("provider %s: no type %q", name, p.Type) // the config checked it
	}
	if err != nil {
		return nil, err // it names the type and the provider
	}
	return providers.WithRetries(sc, p.MaxRetries, p.Backoff), nil
}

// checkServices builds every service provider as a start would, without
// sending: a key file that cannot be read or parsed is found by -check.
func checkServices(cfg *config.Config) error {
	for _, name := range slices.Sorted(maps.Keys(cfg.Providers)) {
		if p := cfg.Providers[name]; p.Type != config.ProviderLog && p.Type != config.ProviderWebhook {
			if _, err := newSender(name, p, io.Discard); err != nil {
				return err
			}
		}
	}
	return nil
}

// eventOptions are the config's events settings with the worker's log and
// metrics, one set for the process's Recorder and Dispatcher.
func eventOptions(cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) lifecycle.Options {
	o := cfg.EventOptions()
	o.Log, o.Metrics = log, lifecycle.NewMetrics(reg)
	return o
}
