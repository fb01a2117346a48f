# The two commands of the README: `make demo` and `make test`. Both set up everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test e2e lint typecheck unit venv bench chaos chaos-node restate-server kube-bins helm-bin mcp-servers otelcol promtool chromium iptables clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP) restate-server
	$(BIN)/python examples/crash_demo.py
	$(BIN)/python examples/restate_demo.py

lint: $(STAMP)
	$(BIN)/ruff check worker operator tests bench examples e2e
	$(BIN)/ruff format --check worker operator tests bench examples e2e
	$(BIN)/shellcheck scripts/*.sh e2e/*.sh .ci/run
	$(BIN)/hadolint Dockerfile
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The real restate-server binary from npm (cached outside the repo), for the Restate tests.
restate-server:
	bash scripts/install-restate.sh >/dev/null

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok for the
# Kubernetes tests, built from the Go module proxy into ~/.cache/tether (minutes once, then ms).
kube-bins:
	bash scripts/build-control-plane.sh >/dev/null

# The helm CLI for the chart tests (tests/helm), built the same way (about a minute, once).
helm-bin:
	bash scripts/build-helm.sh >/dev/null

# Real MCP servers from PyPI (mcp-server-time, -git, -fetch) and mcp-proxy, pinned, each in a venv
# of its own in ~/.cache/tether/mcp, for tests/mcp (about a minute once, then milliseconds).
mcp-servers:
	bash scripts/install-mcp-servers.sh >/dev/null

# An OpenTelemetry Collector (OTLP receiver, file exporter) for the trace tests, built with the
# collector builder from the Go module proxy into ~/.cache/tether/otelcol (two minutes once, then ms).
otelcol:
	bash scripts/build-otelcol.sh >/dev/null

# Prometheus's promtool for the alert tests (tests/helm/test_alerts.py: the chart's alerting rules
# checked and unit-tested), built from the Go module proxy into ~/.cache/tether/prometheus
# (minutes once, then ms).
promtool:
	bash scripts/build-promtool.sh >/dev/null

# Debian's chromium for the browser test of the approval page (tests/restate), driven by the
# playwright package, which never downloads a browser of its own. Needs root on Debian/Ubuntu.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >/dev/null

# Debian's iptables for the tests that cut a process off with a DROP rule on loopback: a Restate
# node (tests/helm, tests/restate) and the operator's API server (tests/operator/test_ha.py).
iptables:
	@command -v iptables >/dev/null || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables; } >/dev/null

unit: $(STAMP) restate-server kube-bins helm-bin mcp-servers otelcol promtool chromium iptables
	$(BIN)/pytest -q

test: lint typecheck unit

# The platform on a real single-node cluster brought up on this host: images built from the
# Dockerfile, `helm install`, the user path with pods killed, Prometheus, NetworkPolicy
# (e2e/README.md). Needs Linux, root and Docker (installed from Debian's packages if missing);
# says what is missing and fails otherwise. Slow builds are cached in ~/.cache/tether.
e2e: $(STAMP) restate-server kube-bins helm-bin
	$(BIN)/pytest -v -s e2e

bench: $(STAMP)
	$(BIN)/python bench/sqlite_steps.py

# Chaos on a local stack (tests/chaos): CHAOS_RUNS runs at once while a killer seeded with
# CHAOS_SEED SIGKILLs the worker, restate-server and the sidecar (CHAOS_KILLS) for CHAOS_SECONDS;
# fails if a run ended otherwise than scripted, a tool body ran twice, an approval or a budget did
# not hold.
CHAOS_SECONDS ?= 60
CHAOS_SEED ?= 1
CHAOS_RUNS ?= 100
CHAOS_KILLS ?= worker,restate,sidecar
chaos: $(STAMP) restate-server
	$(BIN)/python -m tests.chaos --seconds $(CHAOS_SECONDS) --seed $(CHAOS_SEED) \
		--runs $(CHAOS_RUNS) --kinds $(CHAOS_KILLS)

# The same scenario on the real node (e2e/test_node_chaos.py, needs what `make e2e` needs): the
# platform helm-installed, worker pods, the Restate pod and an operator pod SIGKILLed and
# force-deleted. `make e2e` runs a short one (30 s, 20 runs).
chaos-node: $(STAMP) restate-server kube-bins helm-bin
	CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) CHAOS_RUNS=$(CHAOS_RUNS) \
		$(BIN)/pytest -v -s e2e/test_node_chaos.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
