# The throttler's image: the static binaries `make release` built and the
# example config, nothing else: no base image to pull, no shell, no libc.
# The time zone database is inside the binaries (they import time/tzdata).
#
#   make release && docker build -t throttler .
#   make release && docker buildx build --platform linux/amd64,linux/arm64 -t throttler .
#
# It runs the worker as an unprivileged user with no entry in any user
# database (numbers only). Give it REDIS_URL, and a config of your own at
# /etc/throttler/config.yaml (see compose.yaml). The enqueue command is
# /throttler-enqueue (docker run --entrypoint /throttler-enqueue ...).
# Nothing here trusts a certificate authority: for rediss:// or a webhook
# over https, mount your CA bundle and name it (redis.tls.ca_file, or
# SSL_CERT_FILE for the webhooks).
# Only what make release put in dist/ is copied: the release test checks it
# (integration_test/release_test.go).
FROM scratch
# Set by docker build (BuildKit) to the platform's architecture.
ARG TARGETARCH
COPY dist/throttler-worker-linux-${TARGETARCH} /throttler-worker
COPY dist/throttler-enqueue-linux-${TARGETARCH} /throttler-enqueue
COPY dist/config.yaml /etc/throttler/config.yaml
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/throttler-worker"]
CMD ["-config", "/etc/throttler/config.yaml"]
