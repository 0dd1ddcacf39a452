package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestRedisLoadErrors is TestLoadErrors for the login and TLS settings of
// redis: one small file per mistake, the whole message checked.
func TestRedisLoadErrors(t *testing.T) {
	tests := []struct {
		file string
		want string
	}{
		{"redis_password_and_file.yaml", `testdata/redis_password_and_file.yaml:4: redis.password_file: cannot be used with redis.password: give one of them`},
		{"redis_url_password_twice.yaml", `testdata/redis_url_password_twice.yaml:3: redis.password: cannot be used with a password in redis.url: give it once`},
		{"redis_url_user_twice.yaml", `testdata/redis_url_user_twice.yaml:3: redis.username: cannot be used with a user in redis.url: give it once`},
		{"redis_password_file_missing.yaml", `testdata/redis_password_file_missing.yaml:3: redis.password_file: cannot read "testdata/no_such_password.txt": no such file or directory`},
		{"redis_password_file_empty.yaml", `testdata/redis_password_file_empty.yaml:3: redis.password_file: "testdata/redis_empty_password.txt" is empty`},
		{"redis_password_file_dir.yaml", `testdata/redis_password_file_dir.yaml:3: redis.password_file: "testdata" is not a regular file`},
		{"redis_password_embedded.yaml", `testdata/redis_password_embedded.yaml:3: redis.password: only for a Redis server: the embedded one has no users, passwords or TLS`},
		{"redis_url_skip_verify.yaml", `testdata/redis_url_skip_verify.yaml:2: redis.url: skip_verify is not taken in the URL: set redis.tls.insecure_skip_verify: true, which is logged as a warning (got "rediss://cache.internal:6380/0?skip_verify=true")`},
		{"redis_cluster_addr_with_password.yaml", `testdata/redis_cluster_addr_with_password.yaml:2: redis.cluster[0]: must be host:port (got "app:xxxxx@10.0.0.1:7000")`},
		{"redis_username_not_string.yaml", `testdata/redis_username_not_string.yaml:3: redis.username: must be a string (got 42)`},
		{"tls_without_rediss.yaml", `testdata/tls_without_rediss.yaml:4: redis.tls.ca_file: TLS is off: use a rediss:// URL`},
		{"tls_enabled_with_redis_url.yaml", `testdata/tls_enabled_with_redis_url.yaml:4: redis.tls.enabled: redis.url is a redis:// URL, which does not use TLS: use rediss:// instead`},
		{"tls_cluster_not_enabled.yaml", `testdata/tls_cluster_not_enabled.yaml:4: redis.tls.server_name: TLS is off: set redis.tls.enabled: true`},
		{"tls_ca_not_pem.yaml", `testdata/tls_ca_not_pem.yaml:4: redis.tls.ca_file: no PEM certificate in "testdata/tls_not_a_cert.pem"`},
		{"tls_cert_without_key.yaml", `testdata/tls_cert_without_key.yaml:4: redis.tls.key_file: required with redis.tls.cert_file`},
		{"tls_insecure_with_server_name.yaml", `testdata/tls_insecure_with_server_name.yaml:6: redis.tls.insecure_skip_verify: cannot be used with redis.tls.ca_file or server_name, which it would ignore`},
		{"tls_enabled_not_bool.yaml", `testdata/tls_enabled_not_bool.yaml:4: redis.tls.enabled: must be true or false (got "yes")`},
		{"tls_unknown_key.yaml", `testdata/tls_unknown_key.yaml:4: redis.tls.server-name: unknown key (did you mean server_name?)`},
		{"tls_not_mapping.yaml", `testdata/tls_not_mapping.yaml:3: redis.tls: must be a mapping (got true)`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := LoadWithEnv(filepath.Join("testdata", tt.file), noEnv)
			if err == nil {
				t.Fatalf("Load succeeded, want error:\n%s\ngot config %+v", tt.want, c)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("wrong error\n got: %s\nwant: %s", got, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows the password: %v", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != filepath.Join("testdata", tt.file) || e.Line < 1 {
				t.Errorf("errors.As(*Error) = %+v, want one naming the file and a line", e)
			}
		})
	}
}
