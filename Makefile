# Switchyard: the verbs a newcomer types. `make demo` and `make test` are the two set-up commands.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
CLUSTER_DIR := e2e/.cluster

.PHONY: help
help: ## List the verbs
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

.PHONY: deps
deps: ## Install what the build needs from the package registries (idempotent)
	@bash e2e/hack/install-deps.sh

.PHONY: build
build: deps ## Build every binary
	$(CARGO) build --workspace --all-targets

.PHONY: install-cli
install-cli: ## Install the switchyard CLI and its kubectl plugin name (kubectl switchyard) into ~/.cargo/bin
	$(CARGO) install --locked --path cli --bin switchyard --bin kubectl-switchyard

.PHONY: generate
generate: ## Regenerate crds/ and docs/reference/api.md from the Rust API types, then the packaging copies derived from them
	$(CARGO) run -q -p switchyard-operator --bin crdgen -- --reference docs/reference/api.md crds
	@bash e2e/hack/sync-packaging.sh

.PHONY: check-generated
check-generated: ## Fail when crds/ or docs/reference/api.md has drifted from the Rust API types
	$(CARGO) run -q -p switchyard-operator --bin crdgen -- --check --reference docs/reference/api.md crds

.PHONY: lint
lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --quiet
	@# Every module says what it owns in a //! line at its top.
	@missing=$$(for f in $$(git ls-files 'api/src/*.rs' 'operator/src/*.rs' 'cli/src/*.rs' 'driver-agent/src/*.rs' 'e2e/src/*.rs'); do \
	  head -1 "$$f" | grep -q '^//!' || echo "$$f"; done); \
	  if [ -n "$$missing" ]; then echo "lint: modules without a //! line: $$missing" >&2; exit 1; fi
	@# The CLI uses the operator's judgements and reads, never its process (allocator, HTTP server).
	@if $(CARGO) tree -p switchyard-cli -e normal --prefix none | grep -E '^(axum|tikv-jemalloc)'; then \
	  echo "lint: switchyard-cli links the operator process's allocator or HTTP server (see operator/Cargo.toml, feature runtime)" >&2; exit 1; fi

.PHONY: unit
unit: ## Unit tests only (no cluster), the NVML mock through NVIDIA's Go bindings and under NVIDIA's GPU Feature Discovery
	$(CARGO) test --workspace --exclude switchyard-e2e
	@bash e2e/hack/nvml-mock-check.sh

.PHONY: controlplane
controlplane: ## Build (or reuse) the cached upstream control-plane binaries
	@bash e2e/hack/build-controlplane.sh >/dev/null

.PHONY: images
images: deps ## Build every image as an OCI archive in target/images (operator, agent, e2e images)
	@bash e2e/hack/build-images.sh

.PHONY: cluster-up
cluster-up: deps images ## Start a real v1.37 control plane and 3 real nodes (kubeconfig: e2e/.cluster/kubeconfig)
	@bash e2e/hack/cluster-up.sh

.PHONY: cluster-down
cluster-down: ## Stop exactly what cluster-up started and undo its host changes
	@bash e2e/hack/cluster-down.sh

.PHONY: e2e
e2e: deps ## End-to-end tests against the real control plane (starts one if none runs)
	@bash e2e/hack/run-e2e.sh

.PHONY: check-packaging
check-packaging: deps ## Argo CD health (lua5.4), kstatus, helm lint/template, promtool, dashboard, kustomize
	@bash e2e/hack/check-packaging.sh

.PHONY: helm
helm: ## Build (or reuse) the cached helm CLI and print its path
	@bash e2e/hack/build-helm.sh

.PHONY: test
test: deps lint check-generated check-packaging unit e2e ## Everything CI runs

.PHONY: demo
demo: deps ## A live migration on a local real control plane with three real nodes (KEEP=1 leaves it running)
	@DEMO_KEEP=$${DEMO_KEEP:-$(KEEP)} bash e2e/hack/demo.sh

.PHONY: bench
bench: deps ## Benchmarks; figures go to docs/benchmarks.md (SCALE=<nodes> sizes the scale pool, default 100)
	@bash e2e/hack/bench.sh
