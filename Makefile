# Targets a fresh clone needs: `make demo` runs the worker on embedded Redis,
# `make test` runs every test (both tiers, under the race detector) against
# redis-server processes the tests start.
GO       ?= go
PKGS     ?= ./...
BENCH    ?= .
# The tools module (tools/go.mod): benchmarks and charts, with the
# dependencies only they need. Its packages, relative to tools/.
TOOLS_PKGS ?= ./...

# Tools the Makefile installs through the Go module proxy, pinned, into .bin/.
BIN                 := $(CURDIR)/.bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(BIN)/staticcheck-$(STATICCHECK_VERSION)

# The integration tier: test files built only with -tags integration (child
# processes, clusters, faults). INTEGRATION_RUN selects exactly their tests.
INTEGRATION_FILES := $(shell grep -rlE --include='*_test.go' --exclude-dir=tools '^//go:build .*\bintegration\b' .)
INTEGRATION_PKGS  := $(sort $(patsubst %/,%,$(dir $(INTEGRATION_FILES))))
INTEGRATION_RUN   := ^($(shell grep -ho '^func Test[A-Za-z0-9_]*' $(INTEGRATION_FILES) | cut -c6- | grep -vx TestMain | sort -u | paste -sd'|' -))$$
INTEGRATION_TIMEOUT ?= 30m

.PHONY: all build demo test unit integration bench fuzz lint release screenshots need-redis need-browser clean

all: build test

build:
	$(GO) build $(PKGS)

## demo: the worker on embedded Redis (config.yaml) with the log provider, a
## burst for four recipients, sends and deferrals as they happen, a summary.
DEMOTIME ?= 20s
demo:
	$(GO) run ./cmd/worker -config config.yaml -demo $(DEMOTIME)

## test: both tiers in one run under the race detector, every test once
## (with the tag, the unit tier's tests build too, and the cluster cases it
## skips run); what .ci/run runs. The integration package, the longest by
## far, starts first, and the unit tier's packages run beside it.
test: need-redis need-browser
	$(GO) test -race -count=1 -timeout $(INTEGRATION_TIMEOUT) -tags integration $(if $(filter ./...,$(PKGS)),./integration_test $(UNIT_FIRST)) $(PKGS)
	cd tools && $(GO) test -race -count=1 $(TOOLS_PKGS)

## unit: the quick tier a developer runs after every change: no child
## processes, no clusters (redistest skips them), under the race detector.
## Its parallel tests (each on a database of its own) wait on clocks, asynq's
## and their rules', far more than they compute: UNIT_PARALLEL run at once.
## So do its packages: UNIT_P test binaries run at once, more than the cores,
## and the three that wait longest (UNIT_FIRST) start first, so that the
## others run beside them rather than after them.
UNIT_PARALLEL ?= 8
UNIT_P        ?= 4
UNIT_FIRST    ?= ./jobs ./throttle ./fleet
unit: need-redis
	$(GO) test -race -count=1 -p $(UNIT_P) -parallel $(UNIT_PARALLEL) $(if $(filter ./...,$(PKGS)),$(UNIT_FIRST)) $(PKGS)
	cd tools && $(GO) test -race -count=1 $(TOOLS_PKGS)

## integration: the tests behind the integration build tag: built binaries
## and child processes, Redis Clusters, kills, restarts and outages.
integration: need-redis need-browser
	$(GO) test -race -count=1 -timeout $(INTEGRATION_TIMEOUT) -tags integration -run '$(INTEGRATION_RUN)' $(INTEGRATION_PKGS)

## bench: the product's benchmarks, then the tools module's: the engine
## against its baselines, memory per recipient, and the
## worker pipeline end to end, among them the built worker against a bare
## asynq worker (BenchmarkWorkerVsBare: worker/bare and Redis commands per
## task). Numbers are ratios measured side by side.
bench: need-redis
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(PKGS)
	cd tools && $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(TOOLS_PKGS)

## fuzz: each fuzz target briefly (FUZZTIME each): key encoding, rule
## validation, the config parser, JSONL lines, task payloads and their field
## names. FUZZTIME is a duration (15s) or a count of executions (30000x, as
## CI runs it after the tests: see .ci/run). A new input the engine finds
## interesting is minimized for at most FUZZMINIMIZE executions: the
## default, 60 s per input, held FuzzDecode for two minutes of one CI run.
FUZZTIME ?= 15s
FUZZMINIMIZE ?= 2000x
FUZZ_TARGETS = ./internal/keyspace/:FuzzEncodeSubject ./throttle/:FuzzRuleValidation \
	./config/:FuzzParse ./cmd/enqueue/:FuzzParseLine ./message/:FuzzDecode \
	./message/:FuzzMemberNames
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
	  $(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE); \
	done

## lint: gofmt, go vet (both tiers' files) and staticcheck at a pinned
## version, on the product and on the tools module.
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags integration $(PKGS)
	$(STATICCHECK) -tags integration $(PKGS)
	cd tools && $(GO) vet $(TOOLS_PKGS) && $(STATICCHECK) $(TOOLS_PKGS)

$(STATICCHECK):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/staticcheck $@

## need-redis: the tests start their own redis-server processes. Install
## Debian's package when we can (root with apt-get); otherwise say what to do.
need-redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "redis-server not found: installing Debian's redis-server package"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null || \
	      { echo "could not install redis-server: install it (Debian/Ubuntu: apt-get install redis-server)" >&2; exit 1; }; \
	  else \
	    echo "redis-server not found in PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server)" >&2; exit 1; \
	  fi; }

## need-browser: the dashboard test drives headless Chromium. Install
## Debian's package when we can; otherwise say what to do (the test itself
## fails without a browser, saying the same).
need-browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  command -v google-chrome >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "chromium not found: installing Debian's chromium package"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null || \
	      { echo "could not install chromium: install it (Debian/Ubuntu: apt-get install chromium)" >&2; exit 1; }; \
	  else \
	    echo "chromium not found in PATH: the dashboard's browser test will fail; install it (Debian/Ubuntu: sudo apt-get install chromium)" >&2; \
	  fi; }

## release: static binaries (no cgo, no libc: they run in an empty
## container) for each RELEASE_PLATFORMS, named for what they are
## (throttler-worker-linux-amd64, throttler-enqueue-linux-arm64), stamped
## with VERSION and COMMIT (-version prints them), with SHA256SUMS and the
## example config.yaml, in DIST. The Dockerfile copies from there:
## `make release && docker build -t throttler .`
MODULE            := github.com/notify-throttle/throttler
VERSION           ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT            ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
DIST              ?= dist
RELEASE_LDFLAGS   := -s -w -X $(MODULE)/internal/buildinfo.version=$(VERSION) -X $(MODULE)/internal/buildinfo.commit=$(COMMIT)
release:
	@rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; \
	  for c in worker enqueue; do \
	    echo "build $(DIST)/throttler-$$c-$$os-$$arch ($(VERSION), $(COMMIT))"; \
	    CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
	      -ldflags '$(RELEASE_LDFLAGS)' -o $(DIST)/throttler-$$c-$$os-$$arch ./cmd/$$c; \
	  done; \
	done
	cp config.yaml $(DIST)/config.yaml
	cd $(DIST) && sha256sum throttler-* config.yaml > SHA256SUMS

## screenshots: the dashboard's browser test, saving its screenshots into
## docs/ (the README's and docs/operations.md's).
screenshots: need-redis need-browser
	$(GO) test -count=1 -tags integration -run '^TestDashboardInBrowser$$' ./integration_test/ -args -screenshots $(CURDIR)/docs

clean:
	$(GO) clean -testcache
	rm -rf $(DIST)
