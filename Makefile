# The README's commands. `make test` runs everything: unit tests under -race,
# examples, fuzz seeds, and the integration tests against real servers in
# containers (set up by ../shared/testenv/up where it exists, else a local Docker).
SHELL := /bin/bash
GO ?= go
MODULES := . integration benchmarks
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TESTENV := ../shared/testenv/up
# gotestsum runs `go test` and prints a line per package, each failed
# test's output as it fails, and at the end a summary naming each failure
# ("=== Failed", then "DONE N tests, M failures"); skipped tests are only
# counted (the integration suite skips composite tables on stores that
# take none). Its exit code is go test's. `go run` at a pinned version:
# nothing to install.
GOTESTSUM := $(GO) run gotest.tools/gotestsum@v1.13.0 --format pkgname-and-test-fails --hide-summary=skipped --

.PHONY: all test unit integration race bench fuzz lint demo tidy

all: lint test

test: unit alerts integration

unit:
	$(GOTESTSUM) -race -count=1 ./...
	cd benchmarks && $(GO) vet ./...
	cd benchmarks && $(GOTESTSUM) -count=1 ./cmd/...

# LOADTESTS assert load figures, measured without the race detector (which
# slows every call several times): they skip under -race and run again alone.
LOADTESTS := ^TestMemcachedBadDayHealthyUnderLoad$$

# Integration tests need Docker; the test environment script starts it and
# builds the images where no registry is reachable.
integration:
	@if [ -x $(TESTENV) ]; then eval "$$($(TESTENV))"; fi; \
	cd integration && $(GOTESTSUM) -race -count=1 -timeout 25m ./... && \
	$(GOTESTSUM) -count=1 -timeout 5m -run "$(LOADTESTS)" ./...

race:
	$(GO) test -race -count=1 ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	cd benchmarks && $(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./...

fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 20s $$pkg || exit 1; \
	  done; \
	done

# lint fails on unformatted code, on a module whose go.mod or go.sum is not
# what `go mod tidy` would write (it prints the difference; `make tidy`
# fixes it), and on vet or staticcheck findings.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy -diff) || { echo "$$m: go.mod/go.sum not tidy: run make tidy"; exit 1; }; done
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...) || exit 1; done

demo:
	$(GO) run ./cmd/throttlekit-demo

tidy:
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy) || exit 1; done

# The alert rules' unit tests: each alert fires and stays quiet where it
# should. promtool is in Debian's prometheus package (.ci/run installs it).
.PHONY: alerts
alerts:
	promtool check rules deploy/prometheus/throttlekit-alerts.yml
	promtool test rules deploy/prometheus/throttlekit-alerts_test.yml
