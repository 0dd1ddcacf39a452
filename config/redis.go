package config

import "github.com/notify-throttle/throttler/internal/redisconn"

// Environment variables that replace settings (see LoadWithEnv).
const (
	EnvRedisURL      = "REDIS_URL"      // redis.url and redis.cluster
	EnvRedisPassword = "REDIS_PASSWORD" // redis.password and redis.password_file
)

// redisFromEnv lets a non-empty REDIS_URL replace URL and Cluster, and a
// non-empty REDIS_PASSWORD replace Password and PasswordFile, recording in
// src that errors about them name the variable.
func redisFromEnv(r *Redis, getenv func(string) string, src *source) {
	if u := getenv(EnvRedisURL); u != "" {
		r.URL, r.Cluster = u, nil
		src.env["redis.url"] = EnvRedisURL
	}
	if pw := getenv(EnvRedisPassword); pw != "" {
		r.Password, r.PasswordFile = pw, ""
		src.env["redis.password"] = EnvRedisPassword
	}
}

// Redacted replaces a password in what RedactURL returns, and a Secret.
const Redacted = redisconn.Redacted

// RedactURL returns u with its password, if any, replaced by xxxxx:
// "redis://app:s3cret@cache:6379/0" becomes "redis://app:xxxxx@cache:6379/0".
// Every log line and error that shows a URL uses it (see
// redisconn.RedactURL).
func RedactURL(u string) string { return redisconn.RedactURL(u) }
