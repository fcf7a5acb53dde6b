# Trireme developer tasks.
#
#   make venv     - .venv with the package (editable) and the test extras
#   make clients  - every stock client the compat tests drive: kcat, the
#                   Apache Kafka Java clients 3.9.0 / 4.3.0 (+ compiled
#                   harness), kafkajs; chromium + chromedriver for the
#                   status page's browser test; Debian's postgresql (the server
#                   binaries the tests' throwaway databases run).  Cached under .cache/ and
#                   compat_tests/js/node_modules; a warm run needs no network.
#   make serve    - run a broker on 127.0.0.1:9092 with data in ./data
#   make test     - venv + clients, then the whole test suite (2 workers),
#                   then the Spark phase (make test-spark)
#   make test-spark - the Spark tests alone, serially.  When Spark's Kafka
#                   connector is at hand (../shared/spark-connector), PySpark (the
#                   `spark` extra) is installed into .cache/spark/venv and
#                   the tests run against it; without it they skip, saying why.
#   make fuzz     - the transactional fuzzer's long run against a trireme serve: FUZZ_FRAMES
#                   mutated transactional requests (default 20000), seed FUZZ_SEED (default 20);
#                   `make test` runs a short seeded one (compat_tests/test_fuzz_transactions.py)
#   make fuzz-auth - the authentication fuzzer's long run: FUZZ_AUTH_ATTEMPTS (default 20000) mutated
#                   SASL exchanges, seed FUZZ_SEED; `make test` runs a short one
#                   (compat_tests/test_fuzz_authentication.py)
#   make compat   - the compatibility suite's client x feature matrix (tools/compat.py) against
#                   BOOTSTRAP=host:port (and BOOTSTRAP2=host:port side by side), or against a
#                   trireme serve of its own; COMPAT_ARGS=--quick, --clients ..., see compat_tests/README.md
#   make compat-cluster - the same matrix against a cluster of three trireme serve processes on a
#                   PostgreSQL the target starts and removes (tools/compat_cluster.py; report in
#                   compat-report/cluster.{json,md}); COMPAT_ARGS as for make compat

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
CACHE   := .cache
JAVA_VERSIONS := 3.9.0 4.3.0
JS_DIR  := compat_tests/js

VENV_STAMP    := $(VENV)/.trireme-installed

# Spark's Kafka connector jars (not in any registry reachable here), beside the
# repository.  PySpark goes into a venv of its own under .cache/ (kept like the
# Java clients; the main venv stays without a 400 MB package the rest of the
# suite never imports).
SPARK_CONNECTOR := ../shared/spark-connector
SPARK_VENV      := $(CACHE)/spark/venv
SPARK_STAMP     := $(SPARK_VENV)/.trireme-installed
SPARK_TESTS     := compat_tests/test_spark*.py
# The harness build is keyed by its sources (tools/java_clients.py harness_dir): worktrees share .cache.
HARNESS_KEY   := $(shell cat compat_tests/java/Harness.java tools/java_clients.py | sha256sum | cut -c1-12)
JAVA_STAMPS   := $(foreach v,$(JAVA_VERSIONS),$(CACHE)/java/$(v)-$(HARNESS_KEY)/.complete)
JS_STAMP      := $(JS_DIR)/node_modules/.trireme-installed

# Modules the test suite imports; used to accept an already-complete venv
# when pip cannot reach the index (offline re-runs).
VENV_IMPORTS := trio, re2, crc32c, cramjam, kafka, pytest, xdist, pytest_timeout, hypothesis, confluent_kafka, aiokafka, lz4, zstandard, snappy, psycopg, trireme.server

.PHONY: venv clients sysdeps java-clients js-clients serve test test-spark spark-venv compat compat-cluster clean-clients fuzz fuzz-auth

# ---------------------------------------------------------------- venv

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	@# The distribution was called `trireme` before it became `trireme-broker`: drop an old install of it.
	@if $(PY) -m pip show -q trireme >/dev/null 2>&1; then $(PY) -m pip uninstall -y -q trireme; fi
	@if $(PY) -m pip install --disable-pip-version-check -q -e '.[test]'; then \
	    :; \
	elif $(PY) -c 'import $(VENV_IMPORTS)' 2>/dev/null; then \
	    echo "make venv: pip install failed (offline?); the existing venv has everything, keeping it" >&2; \
	else \
	    exit 1; \
	fi
	@touch $@

# ------------------------------------------------------------- clients

clients: sysdeps java-clients js-clients
	@echo "clients ready: kcat=$$(command -v kcat) java=$(JAVA_VERSIONS) kafkajs=$$(node -p 'require("./$(JS_DIR)/node_modules/kafkajs/package.json").version')"

# System packages: installed with apt only when missing and we are root.  PostgreSQL (for the tests'
# throwaway servers, trireme/postgresql.py) counts as present when a server's initdb and postgres are
# under /usr/lib/postgresql/*/bin, where Debian puts them (psql on PATH is not what the tests use).
# `apt-get update` runs at most once per invocation.  Always re-checked
# (cheap); the other client targets depend on it order-only.
sysdeps:
	@pkgs=""; \
	command -v kcat >/dev/null 2>&1 || pkgs="$$pkgs kcat"; \
	command -v javac >/dev/null 2>&1 || pkgs="$$pkgs openjdk-17-jdk-headless"; \
	command -v node >/dev/null 2>&1 || pkgs="$$pkgs nodejs"; \
	command -v npm >/dev/null 2>&1 || pkgs="$$pkgs npm"; \
	command -v chromium >/dev/null 2>&1 || pkgs="$$pkgs chromium"; \
	command -v chromedriver >/dev/null 2>&1 || pkgs="$$pkgs chromium-driver"; \
	ls /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || pkgs="$$pkgs postgresql"; \
	if [ -n "$$pkgs" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        echo "installing:$$pkgs" >&2; \
	        apt-get update; \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$pkgs; \
	    else \
	        echo "missing:$$pkgs (install them, or run as root on a Debian-like system)" >&2; \
	        exit 1; \
	    fi; \
	fi
	@kcat -V >/dev/null && javac -version >/dev/null 2>&1 && node --version >/dev/null && npm --version >/dev/null \
	    && chromedriver --version >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null

java-clients: $(JAVA_STAMPS)

$(CACHE)/java/%/.complete: compat_tests/java/Harness.java tools/java_clients.py | $(VENV_STAMP) sysdeps
	$(PY) tools/java_clients.py $(firstword $(subst -, ,$*))

js-clients: $(JS_STAMP)

$(JS_STAMP): $(JS_DIR)/package.json $(wildcard $(JS_DIR)/package-lock.json) | sysdeps
	@cd $(JS_DIR) && if [ -f package-lock.json ]; then \
	    npm ci --no-audit --no-fund --prefer-offline; \
	else \
	    npm install --no-audit --no-fund --prefer-offline; \
	fi
	@touch $@

clean-clients:
	rm -rf $(CACHE)/jars $(CACHE)/java $(JS_DIR)/node_modules

# ------------------------------------------------------------ serve/test

serve: venv
	$(VENV)/bin/trireme serve --data-dir ./data --listen 127.0.0.1:9092

test: venv clients
	$(PY) -m pytest -p no:cacheprovider -n 2 -q --ignore-glob='$(SPARK_TESTS)'
	@$(MAKE) --no-print-directory test-spark

# ------------------------------------------------------------------ fuzz

FUZZ_FRAMES ?= 20000
FUZZ_SEED   ?= 20

# The long run of the transactional fuzzer (and its codec-level half with as many frames); the timeout
# scales with the frames.
fuzz: venv
	TRIREME_FUZZ_FRAMES=$(FUZZ_FRAMES) TRIREME_FUZZ_SEED=$(FUZZ_SEED) $(PY) -m pytest -p no:cacheprovider -q -rA \
	    --timeout=$$(( 600 + $(FUZZ_FRAMES) / 10 )) compat_tests/test_fuzz_transactions.py \
	    tests/test_codec_fuzz.py::test_transactional_frames_mutated_decode_or_raise_codec_error

# The long run of the authentication fuzzer (mutated SASL frames, truncated exchanges, slow logins).
FUZZ_AUTH_ATTEMPTS ?= 20000
fuzz-auth: venv
	TRIREME_FUZZ_AUTH_ATTEMPTS=$(FUZZ_AUTH_ATTEMPTS) TRIREME_FUZZ_SEED=$(FUZZ_SEED) $(PY) -m pytest -p no:cacheprovider \
	    -q -rA -s --timeout=$$(( 600 + $(FUZZ_AUTH_ATTEMPTS) / 20 )) compat_tests/test_fuzz_authentication.py

# ----------------------------------------------------------------- Spark

spark-venv: $(SPARK_STAMP)

$(SPARK_STAMP): pyproject.toml
	@test -x $(SPARK_VENV)/bin/python || $(PYTHON3) -m venv $(SPARK_VENV)
	@if $(SPARK_VENV)/bin/python -m pip show -q trireme >/dev/null 2>&1; then $(SPARK_VENV)/bin/python -m pip uninstall -y -q trireme; fi
	@if $(SPARK_VENV)/bin/python -m pip install --disable-pip-version-check -q -e '.[spark]'; then \
	    :; \
	elif $(SPARK_VENV)/bin/python -c 'import pyspark, confluent_kafka' 2>/dev/null; then \
	    echo "make spark-venv: pip install failed (offline?); the existing venv has PySpark, keeping it" >&2; \
	else \
	    exit 1; \
	fi
	@touch $@

# One serial pytest process after the main run: a local[2] Spark JVM beside
# other xdist workers would starve them (and they it).
test-spark: venv
	@if [ -d $(SPARK_CONNECTOR) ]; then \
	    $(MAKE) --no-print-directory spark-venv; \
	    export TRIREME_SPARK_KAFKA_JARS="$$(cd $(SPARK_CONNECTOR) && pwd)"; \
	    export TRIREME_SPARK_PYTHON="$(CURDIR)/$(SPARK_VENV)/bin/python"; \
	    echo "Spark phase: connector $$TRIREME_SPARK_KAFKA_JARS, PySpark in $(SPARK_VENV)"; \
	else \
	    echo "Spark phase: no $(SPARK_CONNECTOR), the Spark tests skip"; \
	fi; \
	start=$$(date +%s); rc=0; \
	$(PY) -m pytest -p no:cacheprovider -n 0 -q -rs $(SPARK_TESTS) || rc=$$?; \
	echo "Spark phase wall time: $$(( $$(date +%s) - start ))s"; \
	exit $$rc

compat: venv clients
	$(PY) tools/compat.py $(if $(BOOTSTRAP),--bootstrap $(BOOTSTRAP)) $(if $(BOOTSTRAP2),--bootstrap $(BOOTSTRAP2)) $(COMPAT_ARGS)

compat-cluster: venv clients
	$(PY) tools/compat_cluster.py $(COMPAT_ARGS)

# ------------------------------------------------------------ crash loop
# make crash-loop - kill -9 the broker right after acknowledged AddPartitionsToTxn / AddOffsetsToTxn /
#                   EndTxn answers CRASH_KILLS times (TRIREME_CRASH_SEED varies the kill points), and
#                   CRASH_ADD_ROUNDS rounds of 40 adds killed the instant they are answered
# make compaction-crash-loop - kill -9 the broker while its log cleaner compacts a dirty partition, CRASH_KILLS
#                   times (TRIREME_CRASH_SEED varies the kill points); `make test` runs 3
#                   (compat_tests/test_crash_compaction.py)
# make cluster-fault-loop - a three-broker cluster on a PostgreSQL of its own: kill -9 a random broker (down
#                   0-3.5 s, restarted on its data directory) CLUSTER_FAULT_KILLS times (default 40, seed
#                   TRIREME_CLUSTER_FAULT_SEED) under two transactional producers and the exactly-once loop,
#                   then crash PostgreSQL under the same load; `make test` runs 5 kills and one crash
#                   (compat_tests/test_cluster_faults.py)

.PHONY: crash-loop compaction-crash-loop cluster-fault-loop

CRASH_KILLS      ?= 60
CRASH_ADD_ROUNDS ?= 20
CLUSTER_FAULT_KILLS ?= 40

crash-loop: venv
	TRIREME_CRASH_LOOP_KILLS=$(CRASH_KILLS) TRIREME_CRASH_ADD_ROUNDS=$(CRASH_ADD_ROUNDS) \
	    $(PY) -m pytest -p no:cacheprovider -n 0 -q -s compat_tests/test_crash_transactions.py \
	    -k 'crash_loop or acknowledged_add'

compaction-crash-loop: venv
	TRIREME_COMPACTION_CRASH_KILLS=$(CRASH_KILLS) $(PY) -m pytest -p no:cacheprovider -n 0 -q -s \
	    compat_tests/test_crash_compaction.py

cluster-fault-loop: venv
	TRIREME_CLUSTER_FAULT_KILLS=$(CLUSTER_FAULT_KILLS) $(PY) -m pytest -p no:cacheprovider -n 0 -q -s \
	    compat_tests/test_cluster_faults.py
