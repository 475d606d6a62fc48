#!/usr/bin/env bash
# Install pyuwsgi (uWSGI built as a Python extension module, started by the python3 executable)
# into the virtualenv of PYTHON, compiled from the sdist of uWSGI VERSION (or the newest that a
# requirement such as 'uwsgi>=2.0.28,<2.1' allows: make venv passes pyproject.toml's) with its own
# setup.pyuwsgi.py, and make its launcher the venv's bin/uwsgi. Used by make venv (the lab's
# default uWSGI) and scripts/build-uwsgi.sh pyuwsgi.
#
#   scripts/install-pyuwsgi.sh PYTHON VERSION|REQUIREMENT [KEEP_DIR]
#   scripts/install-pyuwsgi.sh PYTHON WHEEL
#
# PYUWSGI_PIP (optional): a python whose environment has pip, run against PYTHON's environment (pip
# --python) for a PYTHON without a pip of its own (scripts/build-uwsgi.sh makes its venvs so).
#
# KEEP_DIR: the wheel just compiled is left there (the only file in it), so that another venv can
# get the very same build without compiling it again: make venv keeps .venv's in .venv/pyuwsgi-wheel,
# which scripts/build-uwsgi.sh pyuwsgi installs (the second form) when it is the build .venv runs.
#
# Why pyuwsgi: the app's Python then runs in the python3 executable (Debian's PGO+LTO build), not
# in the libpython an embedding uWSGI links (the shared one: no PGO; the static archive: PGO
# without LTO), so it runs as fast as under gunicorn or granian (docs/alternatives.md).
# Why from uWSGI's sdist: PyPI's pyuwsgi trails uWSGI's releases and its wheels have no SSL;
# built here it has what the machine's headers give, like pip's uwsgi (PCRE: libpcre2-dev,
# SSL: libssl-dev), checked by the caller. No pip cache: a cached wheel could lack PCRE.
# bin/uwsgi: setup.pyuwsgi.py installs the launcher as bin/pyuwsgi only; PyPI's pyuwsgi also
# names it bin/uwsgi ("a drop-in replacement for the uwsgi script"), which is what we start.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 PYTHON VERSION|REQUIREMENT [KEEP_DIR]  or  $0 PYTHON WHEEL" >&2
    exit 2
fi
python=$1 wanted=$2 keep=${3:-}
venv_bin=$(dirname "$python")
if [ -n "${PYUWSGI_PIP:-}" ]; then pip=("$PYUWSGI_PIP" -m pip --python "$python"); else pip=("$python" -m pip); fi
# uWSGI's setup.py still names its licence by classifier: newer setuptools warns of it three times,
# about 40 lines in all, above make compare's first progress line. Only that warning is silenced
# (last, as a later filter wins over an earlier one).
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:License classifiers are deprecated"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
case "$wanted" in
    *.whl)
        # A wheel this script compiled and kept: installed as it is (nothing compiled).
        if [ -n "$keep" ]; then
            echo "error: KEEP_DIR: only a compiled wheel is kept, not one given ($wanted)" >&2
            exit 2
        fi
        wheel=$wanted ;;
    *)
        case "$wanted" in [0-9]*) wanted="uwsgi==$wanted" ;; esac
        "${pip[@]}" download -q --no-cache-dir --no-deps --no-binary :all: -d "$src" "$wanted"
        sdists=("$src"/uwsgi-*.tar.gz)
        if [ ${#sdists[@]} -ne 1 ] || [ ! -f "${sdists[0]}" ]; then
            echo "error: pip downloaded no single uWSGI sdist for $wanted" >&2
            exit 1
        fi
        version=$(basename "${sdists[0]}" .tar.gz)
        version=${version#uwsgi-}
        tar -xzf "${sdists[0]}" -C "$src"
        cp "$src/uwsgi-$version/setup.pyuwsgi.py" "$src/uwsgi-$version/setup.py"
        # A wheel first, then installed: what pip install of the directory does in one step.
        "${pip[@]}" wheel -q --no-cache-dir --no-deps -w "$src/wheel" "$src/uwsgi-$version"
        wheels=("$src"/wheel/pyuwsgi-*.whl)
        if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
            echo "error: pip built no single pyuwsgi wheel from uWSGI $version" >&2
            exit 1
        fi
        wheel=${wheels[0]} ;;
esac
"${pip[@]}" install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
cp -p "$venv_bin/pyuwsgi" "$venv_bin/uwsgi"
if [ -n "$keep" ]; then
    # only our own wheels are replaced: KEEP_DIR may be a directory that holds other files
    mkdir -p "$keep"
    rm -f "$keep"/pyuwsgi-*.whl
    cp -p "$wheel" "$keep/"
fi
