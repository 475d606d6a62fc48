# Entry points. The first use of any target creates .venv and installs what it needs.
# A system Python by default: when started as root the stack runs as www-data, which must
# be able to read the interpreter (a pyenv under /root is not readable by other users).
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
LAYOUT ?= 2x4-mapped
OUT    ?= build/$(LAYOUT)
ARGS   ?=

.PHONY: help venv system-deps render run reload faults compare tune tune-accuracy report dataset nginx-scenarios map-scale openloop sampler-cost overhead uwsgi-builds doctor doctor-cost watch test test-unit test-integration lint clean

help:
	@echo "make compare            compare layouts with wrk until the key comparisons are decided (the main job; --budget auto; ARGS='--budget 8' etc.)"
	@echo "make tune [ARGS='--p99-ms 250 --budget 10']  recommend a layout from a budgeted search + its configs"
	@echo "make tune-accuracy [ARGS='--mixes article']   tune against an exhaustive grid (about an hour)"
	@echo "make test               unit + integration tests (real nginx, uWSGI, gunicorn, granian, wrk)"
	@echo "make render LAYOUT=2x4-mapped [OUT=dir]   write nginx.conf + uwsgi.ini"
	@echo "make run LAYOUT=2x4-mapped                serve on http://127.0.0.1:8000 until Ctrl-C"
	@echo "make reload LAYOUT=2x4-mapped             chain-reload the running layout's workers"
	@echo "make faults [ARGS='--layouts 2x4-mapped --only kill-worker']   faults under load: figures table + results dir"
	@echo "make report RESULTS=results/.../results.json   re-render a stored run (compare, openloop, faults or tune)"
	@echo "make dataset [ARGS='--small-count 10000']  the file set for the file-offload scenarios"
	@echo "make nginx-scenarios [ARGS='--duration 8']  files, files-mixed and reuseport, one results dir each"
	@echo "make map-scale [ARGS='--counts 10000,1000000 --repeats 3']  nginx's id map: build, start, memory"
	@echo "make openloop [ARGS='--rates 5,10,15,20']   httperf at fixed rates until replies fall behind (the knee)"
	@echo "make sampler-cost [ARGS='--pairs 12']       throughput with and without the in-flight sampler, interleaved"
	@echo "make overhead [ARGS='--rounds 5']          uWSGI's CPU per request vs the peers, each candidate change paired against it"
	@echo "make uwsgi-builds                          uWSGI built again: -O3, shared and static libpython, pyuwsgi (layout option uwsgi_bin)"
	@echo "make doctor ARGS='--stats /run/NAME/SLOT/stats.sock'   diagnose a running uWSGI (60 s window; findings + tune line)"
	@echo "make doctor-cost [ARGS='--pairs 12']        throughput with and without doctor attached, paired rounds"
	@echo "make watch ARGS='--stats /run/NAME/SLOT/stats.sock'    Prometheus metrics of a running service on 127.0.0.1:9717"

# The venv is rebuilt when pyproject.toml or its build scripts change.
# It holds the peers too (gunicorn, granian: dependencies), which run the app in its own venv, and
# the console script uwsgi-layouts (an editable install: it runs this checkout).
# The lab's uWSGI is pyuwsgi (scripts/install-pyuwsgi.sh: uWSGI as an extension module, from the
# sdist of the newest uWSGI pyproject.toml allows, with PCRE and SSL), started by the app's
# virtualenv's python3: the app's Python runs in the python3 executable (PGO+LTO), as fast as
# under gunicorn or granian (docs/alternatives.md). It is compiled first, with --no-cache-dir: its
# internal routing (the route-if-not lines that refuse code-loading packets) needs PCRE
# (libpcre2-dev) at build time, and pip would otherwise reuse a wheel it once built without it.
# The checks fail the build instead of a later start. The uwsgi package pyproject.toml requires (a
# binary embedding libpython: a second compile, about 40 s on 2 cores) is left out here
# (scripts/venv-requirements.py, then the project with --no-deps): the main job never runs it, and
# the tests that run such a build make it on demand (make uwsgi-builds, scripts/build-uwsgi.sh).
# The pyuwsgi wheel compiled here is kept in .venv/pyuwsgi-wheel: scripts/build-uwsgi.sh pyuwsgi
# installs that very build into a venv of its own instead of compiling it a second time.
UWSGI_REQ := $(shell sed -n 's/^ *"\(uwsgi[<>=!~][^"]*\)".*/\1/p' pyproject.toml)
$(BIN)/.installed: pyproject.toml scripts/install-pyuwsgi.sh scripts/venv-requirements.py | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	rm -rf $(BIN)/uwsgi $(BIN)/uwsgi-static $(BIN)/uwsgi-shared $(VENV)/pyuwsgi-wheel
	bash scripts/install-pyuwsgi.sh $(BIN)/python '$(UWSGI_REQ)' $(VENV)/pyuwsgi-wheel
	@$(BIN)/uwsgi --help | grep -q -- '--route-if-not' || { echo "error: $(BIN)/uwsgi was built without PCRE (no internal routing): install libpcre2-dev (make system-deps), then rm -rf $(VENV) && make venv" >&2; exit 1; }
	@$(BIN)/uwsgi --help | grep -q -- '--ssl-socket' || { echo "error: $(BIN)/uwsgi was built without SSL (no ssl-socket, which uwsgi_tls needs): install libssl-dev (make system-deps), then rm -rf $(VENV) && make venv" >&2; exit 1; }
	$(BIN)/python scripts/venv-requirements.py pyproject.toml test > $(VENV)/requirements.txt
	$(BIN)/python -m pip install -q -r $(VENV)/requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# Byte-compiled once here, not by every interpreter: with PYTHONDONTWRITEBYTECODE set (as in many
# CI and container environments) each process compiles the package's 35,000 lines from source
# again (about 0.8 CPU-s per bench command; the test suite starts over a thousand interpreters).
# compileall writes the .pyc files regardless of that variable and skips what is up to date; an
# edited module is compiled in memory again until the next make. Only a speed-up: a file it cannot
# compile or write (a syntax error, a __pycache__ owned by root) is a warning, not a failed make.
venv: $(BIN)/.installed
	@$(BIN)/python -m compileall -q -j 0 uwsgi_layouts tests scripts deploy.py bench.py \
	  || echo "warning: not all of the package could be byte-compiled (above): every command compiles those files again" >&2

system-deps:
	@bash scripts/install-system-deps.sh

render: venv
	$(BIN)/uwsgi-layouts render $(LAYOUT) --out $(OUT) $(ARGS)

run: venv
	$(BIN)/uwsgi-layouts run $(LAYOUT) $(ARGS)

reload: venv
	$(BIN)/uwsgi-layouts reload $(LAYOUT) $(ARGS)

faults: venv
	$(BIN)/uwsgi-layouts faults $(ARGS)

# --budget auto: 5 min on 2 cores (the planned rounds' estimate + 75 s where that is more), so
# that a bare machine's system packages, a fresh clone's venv build and this fit in 6 min: the
# planned rounds, then rounds of the key comparisons still undecided, then the verdict's tails; a
# --budget in ARGS comes later and wins.
compare: venv
	$(BIN)/uwsgi-layouts compare --budget auto $(ARGS)

tune: venv
	$(BIN)/uwsgi-layouts tune $(ARGS)

tune-accuracy: venv
	$(BIN)/uwsgi-layouts tune-accuracy $(ARGS)

report: venv
	$(BIN)/uwsgi-layouts report $(RESULTS) $(ARGS)

dataset: venv
	$(BIN)/uwsgi-layouts dataset $(ARGS)

nginx-scenarios: venv
	$(BIN)/uwsgi-layouts compare --scenario files $(ARGS)
	$(BIN)/uwsgi-layouts compare --scenario files-mixed $(ARGS)
	$(BIN)/uwsgi-layouts compare --scenario reuseport $(ARGS)

map-scale: venv
	$(BIN)/uwsgi-layouts map-scale $(ARGS)

openloop: venv
	$(BIN)/uwsgi-layouts openloop $(ARGS)

sampler-cost: venv
	$(BIN)/python scripts/sampler-cost.py $(ARGS)

# Paired rounds of the baseline uWSGI layout against each candidate change and the peers' variants,
# hello and article, then a perf profile (about 25 min on 2 cores with the builds; see README).
overhead: venv
	$(BIN)/python scripts/overhead.py $(ARGS)

# Other builds of the same uWSGI, into build/uwsgi/PROFILE: -O3, the binary on the shared libpython
# (pip's default), on the static one (the same objects linked again), and pyuwsgi (make venv's own
# wheel, in a venv of its own): docs/alternatives.md. Two compiles, about 40 s each on 2 idle cores,
# kept in a per-user cache outside the clone (make clean leaves it): a later clone only links.
uwsgi-builds: venv
	bash scripts/build-uwsgi.sh o3 shared static pyuwsgi

doctor: venv
	$(BIN)/uwsgi-layouts doctor $(ARGS)

doctor-cost: venv
	$(BIN)/python scripts/doctor-cost.py $(ARGS)

watch: venv
	$(BIN)/uwsgi-layouts watch $(ARGS)

# The suite runs in parallel (pytest-xdist), three workers per core: its tests wait on real
# processes (stack start-up, load windows, containers) in between the CPU they use, and the four
# xdist_group groups (network namespaces, systemd, podman, the wheel) each hold a worker from the
# start. Two per core left the cores about 70% busy; four starved plan's httperf, which runs at
# the lowest CPU priority beside a quota-limited stack (bench/load/generator.py), so that its
# test took 255 s once. Figures: docs/repository.md.
# loadgroup hands out one test at a time and keeps each xdist_group on one worker. At most 16.
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell n=$$(( $$(nproc) * 3 )); echo $$(( n < 16 ? n : 16 )))
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

test: venv
	$(PYTEST) $(ARGS)

test-unit: venv
	$(PYTEST) -m "not integration" $(ARGS)

test-integration: venv
	$(PYTEST) -m integration $(ARGS)

lint: venv
	$(BIN)/ruff check uwsgi_layouts tests scripts deploy.py bench.py

clean:
	rm -rf build .pytest_cache .hypothesis
