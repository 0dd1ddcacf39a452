# Targets a fresh clone needs: `make demo` runs the worker on embedded Redis,
# `make test` runs every test against redis-server processes the tests start.
GO       ?= go
PKGS     ?= ./...
BENCH    ?= .

.PHONY: all build demo test race bench fuzz lint need-redis need-browser clean

all: build test

build:
	$(GO) build $(PKGS)

## demo: the worker on embedded Redis (config.yaml) with the log provider, a
## burst for four recipients, sends and deferrals as they happen, a summary.
DEMOTIME ?= 20s
demo:
	$(GO) run ./cmd/worker -config config.yaml -demo $(DEMOTIME)

## test: vet, then every test (unit, differential, multi-process, cluster) on
## real redis-server processes the tests start on free loopback ports.
test: need-redis need-browser
	$(GO) vet $(PKGS)
	$(GO) test -count=1 $(PKGS)

## race: the tests again under the race detector.
race: need-redis need-browser
	$(GO) test -race -count=1 $(PKGS)

## bench: throughput against the baselines in one run, batch speed-up and
## memory per recipient. Numbers are ratios measured side by side.
bench: need-redis
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(PKGS)

## fuzz: each fuzz target briefly (FUZZTIME each): key encoding, rule
## validation, the config parser, JSONL lines, task payloads and their field
## names. FUZZTIME is a duration (15s) or a count of executions (30000x, as
## CI runs it after the tests: see .ci/run).
FUZZTIME ?= 15s
FUZZ_TARGETS = ./throttle/:FuzzEncodeSubject ./throttle/:FuzzRuleValidation \
	./config/:FuzzParse ./cmd/enqueue/:FuzzParseLine ./jobs/:FuzzDecode \
	./jobs/:FuzzMemberNames
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
	  $(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME); \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet $(PKGS)

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

clean:
	$(GO) clean -testcache
