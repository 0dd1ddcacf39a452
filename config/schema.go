package config

import (
	"encoding/json"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/notify-throttle/throttler/throttle"
)

// The file's schema: one decode method per section, each listing its keys in
// the order config.yaml shows them (the order "known: ..." messages use).

func (d *decoder) config(root *yaml.Node, c *Config) {
	d.mapping(root, "", []field{
		{"redis", func(n *yaml.Node, p string) { d.redis(n, p, &c.Redis) }},
		{"worker", func(n *yaml.Node, p string) { d.worker(n, p, &c.Worker) }},
		{"policies", func(n *yaml.Node, p string) { d.policies(n, p, c) }},
		{"providers", func(n *yaml.Node, p string) { d.providers(n, p, c) }},
		{"defaults", func(n *yaml.Node, p string) { d.defaults(n, p, &c.Defaults) }},
		{"campaigns", func(n *yaml.Node, p string) { d.campaigns(n, p, c) }},
	})
}

func (d *decoder) redis(n *yaml.Node, path string, r *Redis) {
	var cluster []string
	has := d.mapping(n, path, []field{
		{"url", setSecret(d, &r.URL, "URL")},
		{"cluster", d.setStrings(&cluster)},
		{"username", d.setString(&r.Username)},
		{"password_file", d.redisFile(&r.PasswordFile)},
		{"password", setSecret(d, &r.Password, "password")},
		{"tls", func(n *yaml.Node, p string) { d.redisTLS(n, p, &r.TLS) }},
		{"embedded_addr", d.setString(&r.EmbeddedAddr)},
		{"prefix", d.setString(&r.Prefix)},
	})
	if has["cluster"] {
		r.Cluster = cluster
		if !has["url"] {
			r.URL = "" // the default is embedded; a cluster replaces it
		}
	}
}

func (d *decoder) redisTLS(n *yaml.Node, path string, t *TLS) {
	setBool := func(p *bool) func(*yaml.Node, string) {
		return func(n *yaml.Node, path string) {
			n = resolve(n)
			if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(p) != nil {
				d.fail(n, path, "must be true or false (got %s)", describe(n))
			}
		}
	}
	d.mapping(n, path, []field{
		{"enabled", setBool(&t.Enabled)},
		{"ca_file", d.redisFile(&t.CAFile)},
		{"cert_file", d.redisFile(&t.CertFile)},
		{"key_file", d.redisFile(&t.KeyFile)},
		{"server_name", d.setString(&t.ServerName)},
		{"insecure_skip_verify", setBool(&t.InsecureSkipVerify)},
	})
}

// redisFile decodes a file path; a relative one is resolved against the
// directory of the config file, as campaign audience files are.
func (d *decoder) redisFile(p *string) func(*yaml.Node, string) {
	return func(n *yaml.Node, path string) {
		if v, ok := d.str(n, path); ok {
			if v != "" && !filepath.IsAbs(v) {
				v = filepath.Join(filepath.Dir(d.src.file), v)
			}
			*p = v
		}
	}
}

func (d *decoder) worker(n *yaml.Node, path string, w *Worker) {
	d.mapping(n, path, []field{
		{"concurrency", d.setInt(&w.Concurrency)},
		{"queues", func(n *yaml.Node, p string) {
			w.Queues = map[string]int{}
			d.entries(n, p, func(name string, _, v *yaml.Node, p string) {
				if prio, ok := d.integer(v, p); ok {
					w.Queues[name] = prio
				}
			})
		}},
		{"shutdown_timeout", d.setDuration(&w.ShutdownTimeout)},
		{"http_addr", d.httpAddr(w, "http_addr")},
		{"metrics_addr", d.httpAddr(w, "metrics_addr")},
		{"dashboard", func(n *yaml.Node, p string) { d.dashboard(n, p, &w.Dashboard) }},
		{"inline_wait", d.setDuration(&w.InlineWait)},
		{"jitter", d.setDuration(&w.Jitter)},
		{"sent_marks", d.setDuration(&w.SentMarks)},
		{"remember_takes", d.setDuration(&w.RememberTakes)},
	})
}

func (d *decoder) policies(n *yaml.Node, path string, c *Config) {
	c.Policies = map[string]Policy{}
	d.entries(n, path, func(name string, key, v *yaml.Node, path string) {
		pol := Policy{}
		d.list(v, path, func(_ int, item *yaml.Node, p string) {
			var w throttle.Window
			has := d.mapping(item, p, []field{
				{"limit", d.setInt(&w.Limit)},
				{"per", d.setDuration(&w.Per)},
			})
			for _, k := range []string{"limit", "per"} {
				if !has[k] && item.Kind == yaml.MappingNode {
					d.required(item, join(p, k), "")
				}
			}
			pol = append(pol, w)
		})
		c.Policies[name] = pol
	})
}

func (d *decoder) providers(n *yaml.Node, path string, c *Config) {
	c.Providers = map[string]Provider{}
	d.entries(n, path, func(name string, key, v *yaml.Node, path string) {
		var pr Provider
		has := d.mapping(v, path, []field{
			{"type", func(n *yaml.Node, p string) {
				if t, ok := d.str(n, p); ok {
					if t != ProviderLog && t != ProviderWebhook {
						d.fail(resolve(n), p, "must be %s or %s (got %s)", ProviderLog, ProviderWebhook, quote(t))
						return
					}
					pr.Type = t
				}
			}},
			{"rate", d.setNumber(&pr.Rate)},
			{"burst", d.setInt(&pr.Burst)},
			{"output", d.setString(&pr.Output)},
			{"url", setSecret(d, &pr.URL, "URL")},
			{"timeout", d.setDuration(&pr.Timeout)},
			{"headers", func(n *yaml.Node, p string) {
				pr.Headers = map[string]Secret{}
				d.entries(n, p, func(name string, _, v *yaml.Node, p string) {
					if s, ok := d.secret(v, p, "header value"); ok {
						pr.Headers[name] = Secret(s)
					}
				})
			}},
		})
		if resolve(v).Kind == yaml.MappingNode {
			for _, k := range []string{"type", "rate", "burst"} {
				if !has[k] {
					d.required(key, join(path, k), "")
				}
			}
			switch pr.Type {
			case ProviderLog:
				if !has["output"] {
					pr.Output = DefaultOutput
				}
			case ProviderWebhook:
				if !has["url"] {
					d.required(key, join(path, "url"), " for a webhook provider")
				}
				if !has["timeout"] {
					pr.Timeout = DefaultTimeout
				}
			}
		}
		c.Providers[name] = pr
	})
}

func (d *decoder) defaults(n *yaml.Node, path string, df *Defaults) {
	d.mapping(n, path, []field{
		{"policy", d.setString(&df.Policy)},
		{"provider", d.setString(&df.Provider)},
		{"queue", d.setString(&df.Queue)},
	})
}

func (d *decoder) campaigns(n *yaml.Node, path string, c *Config) {
	c.Campaigns = nil
	d.list(n, path, func(_ int, item *yaml.Node, path string) {
		cp := Campaign{CatchUp: DefaultCatchUp}
		has := d.mapping(item, path, []field{
			{"name", d.setString(&cp.Name)},
			{"cron", d.setString(&cp.Cron)},
			{"timezone", d.setString(&cp.Timezone)},
			{"audience", func(n *yaml.Node, p string) { d.audience(n, p, &cp.Audience) }},
			{"policy", d.setString(&cp.Policy)},
			{"provider", d.setString(&cp.Provider)},
			{"template", d.setString(&cp.Template)},
			{"data", func(n *yaml.Node, p string) { cp.Data = d.data(n, p) }},
			{"queue", d.setString(&cp.Queue)},
			{"send_by_window", d.setDuration(&cp.SendByWindow)},
			{"catch_up", d.setDuration(&cp.CatchUp)},
		})
		if item.Kind == yaml.MappingNode {
			for _, k := range []string{"name", "cron", "audience", "template"} {
				if !has[k] {
					d.required(item, join(path, k), "")
				}
			}
		}
		c.Campaigns = append(c.Campaigns, cp)
	})
}

// audience decodes {file: path} or {redis_set: key}. A relative file is
// resolved against the directory of the config file, so that a worker
// started from anywhere reads the same file.
func (d *decoder) audience(n *yaml.Node, path string, a *Audience) {
	d.mapping(n, path, []field{
		{"file", d.setString(&a.File)},
		{"redis_set", d.setString(&a.RedisSet)},
	})
	if a.File != "" && !filepath.IsAbs(a.File) {
		a.File = filepath.Join(filepath.Dir(d.src.file), a.File)
	}
}

// data turns a campaign's template data, any YAML mapping, into JSON.
func (d *decoder) data(n *yaml.Node, path string) json.RawMessage {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "must be a mapping (got %s)", describe(n))
		return nil
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		d.fail(n, path, "not representable as JSON: %s", yamlMessage(err))
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		d.fail(n, path, "not representable as JSON: keys must be strings and numbers finite")
		return nil
	}
	return b
}
