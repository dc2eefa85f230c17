# The README's commands. Everything is set up on first use and cached: .venv/ (virtualenv),
# .cache/kafka/ and .cache/apicurio/ (jars from Maven Central); Debian's prometheus package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint unit integration bench bench-peers broker-start broker-stop clean setup \
	kafka-jars registry-jars prometheus-tools helm-tools image container-tools

test: setup lint ## Everything: lint, type-check, unit and integration tests (real broker)
	$(PY) -m pytest tests

demo: $(STAMP) kafka-jars ## The demo: broker, bridge, sample receiver and producer
	$(PY) -m devtools demo

setup: $(STAMP) kafka-jars registry-jars prometheus-tools helm-tools net-tools

lint: $(STAMP)
	$(VENV)/bin/ruff check bridge devtools tests deploy
	$(VENV)/bin/ruff format --check bridge devtools tests deploy
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP) prometheus-tools helm-tools net-tools
	$(PY) -m pytest tests/unit

integration: setup
	$(PY) -m pytest tests/integration

bench: $(STAMP) kafka-jars ## The benchmark (see docs/PERFORMANCE.md)
	$(PY) -m devtools bench

# The bridge beside Quix Streams (installed into .cache/peers/quix on first use) on the same
# backlogs and receiver; also part of `make bench`.
bench-peers: $(STAMP) kafka-jars
	$(PY) -m devtools bench --only peers

broker-start: $(STAMP) kafka-jars
	$(PY) deploy/kafka/broker.py start

broker-stop: $(STAMP)
	$(PY) deploy/kafka/broker.py stop

# Prometheus and promtool (Debian's package) check the dashboard and alert rules in the tests.
prometheus-tools:
	@sh deploy/prometheus/ensure-prometheus.sh

# helm, built from source with Go into .cache/go-bin (once): the tests render and lint the chart.
helm-tools:
	@sh deploy/helm/ensure-helm.sh

# The container image (deploy/docker/Dockerfile): `docker build` where a Docker engine runs, else
# buildah on a local Debian base cached in .cache/container (deploy/docker/build-image.sh).
# IMAGE names the tag. The container test (tests/integration/test_container.py) builds it itself.
IMAGE ?= transaction-webhook-bridge:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' bridge/__init__.py)
image: container-tools
	@sh deploy/docker/build-image.sh $(IMAGE) >/dev/null

# nftables and iproute2 (Debian's packages) for the network-fault tests
# (tests/integration/test_network_faults.py), which cut and thin traffic inside a network
# namespace of their own; they install them themselves too, and fail with the reason where they
# cannot (no root, no apt).
.PHONY: net-tools
net-tools:
	@sh deploy/kafka/ensure-net-tools.sh

# buildah, podman, runc and mmdebstrap (Debian's packages) for `make image` and the container test;
# nothing where a Docker engine runs. The container test installs them itself or is skipped, with
# the reason, where they cannot be installed (no root, no apt).
container-tools:
	@sh deploy/docker/ensure-container-tools.sh

# Apicurio Registry for the schema-registry integration tests.
registry-jars: $(STAMP)
	@$(PY) -m devtools.devregistry fetch >/dev/null

kafka-jars: $(STAMP)
	@$(PY) deploy/kafka/broker.py fetch >/dev/null

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required: install python3.11 (found " + sys.version.split()[0] + ")")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

clean:
	-$(PY) deploy/kafka/broker.py stop
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

# The soak (devtools/soak.py; not part of `make test`): 30 minutes at 200 records/s beside healthy,
# flaky, slow, dead and hung webhooks, with configuration reloads and one broker restart; checks
# that nothing is lost and that the bridge's RSS and file descriptors stay flat. Exit code 1 when
# not. Options through SOAK_ARGS, e.g. make soak SOAK_ARGS="--minutes 5 --rate 100".
.PHONY: soak
soak: $(STAMP) kafka-jars
	$(PY) -m devtools.soak $(SOAK_ARGS)
