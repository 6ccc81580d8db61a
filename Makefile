# The two commands of the README: `make demo` (the main job on an embedded Kafka) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast test-long test-matrix lint docs bench bench-10m bench-export-10m soak chaos sysdeps

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[spark,typed,docs,test,bench]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/globald demo
	@echo "globald is installed in $(BIN)/: run it as $(BIN)/globald, or put it on PATH with: source $(BIN)/activate"

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (docs/, mkdocs.yml) into build/site; any warning fails the build. It works opened as files
# (build/site/index.html), offline: mermaid and the search worker's shim are bundled (docs/bundled.py fetches them
# with npm once), search reads its index from a script (mkdocs.yml's offline plugin), and no font comes from the web.
docs: $(BIN)/.installed
	$(BIN)/mkdocs build --strict --site-dir build/site

# Every run keeps its timings: the 25 slowest in the output, each test's in build/test-results/<lane>.xml (JUnit).
PYTEST = $(BIN)/python -m pytest -q -ra --durations=25 --junitxml=build/test-results/$@.xml

# Two workers (pytest-xdist), one file to a worker: a file's tests share its module fixtures (a Spark session, a
# broker of their own) and run in their order; each worker has its own session broker.
test: lint docs sysdeps
	$(PYTEST) -n 2 --dist loadfile -m "not long"

# The inner loop: lint and the unit tests, in about a minute and a half.
test-fast: lint
	$(PYTEST) -n 2 --dist loadfile tests/unit

# The long lane (marker `long`), by one rule: a campaign's CI form (chaos, power loss, SIGKILL at random points),
# the multi-host Spark cluster, or a test whose call takes over 15 s on an idle 2-core machine (the demo, the
# tutorial, the disk-filling restores, the bench smoke...). Not part of the 10-minute make test; CI (.ci/run) runs
# it after, on the same two workers, one file to a worker.
# The oldest and the newest PySpark the matrix (below) tests: set before the rules that name their venvs.
MATRIX_OLDEST := 4.0
MATRIX_NEWEST := 4.3
test-long: $(BIN)/.installed sysdeps build/matrix/$(MATRIX_OLDEST)/.installed
	$(PYTEST) -n 2 --dist loadfile -m long
	$(call matrix_pytest,$(MATRIX_OLDEST),$@-pyspark$(MATRIX_OLDEST)) $(MATRIX_SMOKE)

# The supported PySpark (pyproject.toml's spark extra, >=4.0,<5; globald/spark/versions.py) on its oldest and newest
# minor: each has a venv of its own, build/matrix/<minor>/, holding only what tests/matrix/constraints-<minor>.txt
# lists (PySpark itself: every other dependency 4.x needs is the main venv's, read after the venv's own packages
# through a .pth), and globald from this clone (PYTHONPATH). 1-2 minutes to build each from a cold pip cache, mostly
# pip building PySpark's wheel from its 320 MB sdist.
build/matrix/%/.installed: tests/matrix/constraints-%.txt $(BIN)/.installed
	rm -rf build/matrix/$*
	$(BIN)/python -m venv build/matrix/$*
	build/matrix/$*/bin/pip install --quiet --no-deps -r $<
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))' \
	    > "$$(build/matrix/$*/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/main-venv.pth"
	touch $@

# $(1): the minor, $(2): the JUnit file's name.
matrix_pytest = PYTHONPATH=$(CURDIR) build/matrix/$(1)/bin/python -m pytest -q -ra --durations=10 \
	--junitxml=build/test-results/$(2).xml -p no:cacheprovider
# Every Spark test but the multi-host cluster's and the pages' recipes, classic and Connect, on both ends of the range.
MATRIX_TESTS := tests/integration/test_spark*.py
MATRIX_XDIST ?= -n 2 --dist loadfile
test-matrix: build/matrix/$(MATRIX_OLDEST)/.installed build/matrix/$(MATRIX_NEWEST)/.installed sysdeps
	$(call matrix_pytest,$(MATRIX_OLDEST),$@-pyspark$(MATRIX_OLDEST)) $(MATRIX_XDIST) -m "not cluster" $(MATRIX_TESTS)
	$(call matrix_pytest,$(MATRIX_NEWEST),$@-pyspark$(MATRIX_NEWEST)) $(MATRIX_XDIST) -m "not cluster" $(MATRIX_TESTS)

# The long lane's share of the matrix, kept to a few minutes: the typed join (the feature 4.0 broke, issue 40.3),
# classic and Connect, on the oldest PySpark (make test runs it on the newest): 1:12 with its fixtures on a quiet
# 2-core machine (2.5 min on a loaded one), after the venv's 33 s (1:53 loaded).
MATRIX_SMOKE := tests/integration/test_spark_typed.py::test_typed_join_udf_flatten_and_small_equal_the_reference_decode

# The last line: issue 45's globald as-of join against Spark's own ASOF JOIN, small form (the 1M figures are in
# docs/as-of.md); about 45 s on the loaded 2-core machine.
bench: $(BIN)/.installed
	$(BIN)/python -m bench
	$(BIN)/python -m bench.export_bootstrap --records 1000000
	$(BIN)/python -m bench.spark_as_of --keys 100000 --rows 1000000 --rounds 3

# The 10M column of docs/benchmarks.md (restore at scale and peak RSS): 10M records, not part of `make test`; ~15 minutes.
BENCH_10M_ARGS ?= --records 10000000 --benches restore,rss --repeats 3 --pipelines globald,consume_only,store_only,raw_batch
bench-10m: $(BIN)/.installed
	$(BIN)/python -m bench $(BENCH_10M_ARGS)

# Issue 34's 10M-key figures (a new host RUNNING from an export against from the topic, the broker bytes each
# received, uploads per hour under the default load): bench/results/export-bootstrap-10M.json; not part of
# `make bench` (its 1M form is), nor of `make test`. About half an hour on a quiet 2-core machine, 10 GB of disk.
BENCH_EXPORT_10M_ARGS ?= --records 10000000 --load-minutes 5
bench-export-10m: $(BIN)/.installed
	$(BIN)/python -m bench.export_bootstrap $(BENCH_EXPORT_10M_ARGS)

soak: $(BIN)/.installed
	$(BIN)/python -m tests.soak $(SOAK_ARGS)

# Three hours of the default soak's updates, publications and faults in 45 minutes; the memory verdict (RSS slope
# after warm-up, 95 % interval) is in build/reliability/soak/memory.md. SOAK_ARGS override (e.g. --seed, --minutes).
.PHONY: soak-accelerated
soak-accelerated: $(BIN)/.installed
	nice -n 10 $(BIN)/python -m tests.soak --accelerated $(SOAK_ARGS)

# Tools the suite takes from Debian: libfiu (fiu-run, fiu-ctrl) and libfaketime for the chaos campaign and the clock
# tests, systemd-analyze (package systemd) for the unit files, promtool (package prometheus) for the alert rules,
# setpriv (util-linux, essential in Debian) for the permission tests as root, libjemalloc2, the allocator the
# daemon runs on when installed (docs/operations/memory.md), so that the suite tests what production runs, and
# chromium, the headless browser that opens the built documentation site (tests/integration/test_docs_site.py).
# Installed when missing and root; otherwise this says why, and the tests that need them skip, or fail in CI
# (CI=true: tests/ci.py).
sysdeps:
	@missing=""; \
	{ command -v fiu-run && command -v fiu-ctrl; } >/dev/null || missing="$$missing fiu-utils"; \
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$$missing faketime"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v setpriv >/dev/null || missing="$$missing util-linux"; \
	command -v mkfs.xfs >/dev/null || missing="$$missing xfsprogs"; \
	ls /usr/lib/*/libjemalloc.so.2 >/dev/null 2>&1 || missing="$$missing libjemalloc2"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        $$missing >/dev/null) \
	    || echo "sysdeps: apt-get install$$missing failed: the tests that need them skip (and fail in CI)"; \
	else echo "sysdeps: missing$$missing, and not root (or no apt-get): the tests that need them skip (fail in CI)"; fi

CHAOS_ARGS ?= --seeds 10 --faults-per-seed 22
# The versioned lane (tests/chaos/versioned.py, on Tansu: as-of lookups need record timestamps), after the campaign
# whatever its result; either failing fails the target. Its report: build/chaos/versioned/report.md.
CHAOS_VERSIONED_ARGS ?= --seeds 2 --faults-per-seed 5 --reloads-per-seed 3
chaos: $(BIN)/.installed sysdeps
	@rc=0; $(BIN)/python -m tests.chaos $(CHAOS_ARGS) || rc=1; \
	$(BIN)/python -m tests.chaos.versioned $(CHAOS_VERSIONED_ARGS) || rc=1; exit $$rc
