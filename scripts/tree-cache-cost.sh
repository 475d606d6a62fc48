#!/usr/bin/env bash
# What the per-user cache of compiled uWSGI trees (scripts/uwsgi-tree-cache.sh) saves a fresh clone:
# the CPU-seconds (user + system, children included) of `bash scripts/build-uwsgi.sh shared` in a
# new clone of this checkout's HEAD, with the cache empty (cold: the compile) and with it filled by
# an earlier clone's build (warm: a link), alternating, RUNS times each.
#
#   bash scripts/tree-cache-cost.sh [RUNS]    (default 5: about 6 min on 2 idle cores)
#
# Each clone's .venv is a link to this checkout's (make venv costs the same with or without the
# cache, and is not the script's). The clones, their builds and the caches are in a directory of the
# run's own, never the user's (~/.cache/uwsgi-layouts, UWSGI_BUILDS), removed when the run ends, is
# interrupted or terminated; a SIGKILL leaves it (its path is printed first: remove it by hand).
# Needs GNU time at /usr/bin/time (Debian's package time) for the CPU-seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${1:-5}
if ! [[ "$RUNS" =~ ^[1-9][0-9]?$ ]]; then
    echo "error: RUNS: '$RUNS' is not a number of runs from 1 to 99" >&2
    exit 2
fi
if [ ! -x "$ROOT/.venv/bin/uwsgi" ]; then
    echo "error: no project venv with uWSGI at $ROOT/.venv: run make venv first" >&2
    exit 2
fi
if ! /usr/bin/time --version 2>&1 | grep -q 'GNU'; then
    echo "error: /usr/bin/time: GNU time is needed for the CPU-seconds: apt-get install time" >&2
    exit 2
fi
WORK=$(mktemp -d -t tree-cache-cost.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "working in $WORK (removed at the end)"

fresh_clone() {  # DIR: a clone of HEAD whose .venv is this checkout's
    git clone -q "$ROOT" "$1"
    ln -s "$ROOT/.venv" "$1/.venv"
}

build() {  # CLONE CACHE [TIME...]: build-uwsgi.sh shared in CLONE (under TIME), its output kept for a failure
    local clone=$1 cache=$2
    shift 2
    # without the caller's UWSGI_BUILDS: each build goes into its clone (build-uwsgi.sh replaces what it builds)
    if ! (cd "$clone" && env -u UWSGI_BUILDS UWSGI_TREE_CACHE="$cache" "$@" bash -c 'bash scripts/build-uwsgi.sh shared >"$0" 2>&1' "$WORK/log"); then
        echo "error: scripts/build-uwsgi.sh shared failed in $clone:" >&2
        tail -n 20 "$WORK/log" >&2
        exit 1
    fi
}

build_cpu() {  # CLONE CACHE: user+system CPU-seconds of the build, its children included
    build "$1" "$2" /usr/bin/time -f '%U %S' -o "$WORK/time"
    awk '{printf "%.1f", $1 + $2}' "$WORK/time"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
fresh_clone "$WORK/filler"  # fills the warm cache once, not counted
build "$WORK/filler" "$WORK/warm"
for run in $(seq "$RUNS"); do
    for way in cold warm; do
        cache="$WORK/warm"
        [ "$way" = cold ] && cache="$WORK/cold"
        fresh_clone "$WORK/clone"
        echo "$way $run: $(build_cpu "$WORK/clone" "$cache") CPU-s (load $(cut -d' ' -f1 /proc/loadavg))"
        rm -rf "$WORK/clone" "$WORK/cold"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
