#!/usr/bin/env bash
# Build uWSGI again, with other flags, into build/uwsgi/PROFILE/ (a venv holding only uWSGI), so
# that a benchmark can run it beside the project's own build: a layout's `uwsgi_bin` option, e.g.
# '2x4-mapped@uwsgi_bin=/path/to/build/uwsgi/o3/bin/uwsgi' (scripts/overhead.py finds them).
#
#   scripts/build-uwsgi.sh PROFILE...    (make uwsgi-builds builds o3, shared, static and pyuwsgi;
#   pcre and nopcre stay for the record: a build without PCRE cannot run our uwsgi.ini, whose
#   route-if-not lines need routing)
#
# The project's own uWSGI (make venv) is pyuwsgi. The binary builds are pip's uwsgi package (it
# compiles uWSGI with -O2 and whatever it finds: PCRE, hence internal routing, only if
# libpcre2-dev was installed when it built), embedding Debian's shared libpython3.X.so unless:
#   o3      CFLAGS=-O3 (uWSGI's -O2 comes first; gcc takes the last -O), PCRE as in the project's
#   pcre    PCRE and internal routing on (needs libpcre2-dev; fails loudly without it)
#   nopcre  PCRE and internal routing off
#   shared  nothing changed: the uWSGI pip builds by default, on the shared libpython (a second
#           build of Python without PGO: Python code runs about 1.14x the instructions of python3)
#   static  uWSGI linked against the static libpython3.X.a (the PGO build the python3 executable
#           is made of, without its LTO; package libpython3.X-dev): scripts/static-libpython-ldflags.sh
#           says how (about 1.06x python3's instructions). make venv's default before pyuwsgi.
#   pyuwsgi uWSGI as a Python extension module (what PyPI's pyuwsgi is) started by the python3
#           executable (python3's own instructions), built from the sdist of the project's uWSGI
#           version by scripts/install-pyuwsgi.sh (PyPI's pyuwsgi trails uwsgi's releases, and its
#           wheels have no SSL), so it has SSL and PCRE as ours does. Its bin/uwsgi is a script
#           run by this venv's python; the lab starts its pyuwsgi with the app's virtualenv's
#           python instead (deploy/run/peer_launch.py), so the app runs in its own virtualenv.
# Each is the same uWSGI version as the project's, built from source by pip (--no-binary, and no
# cache: a cached wheel would silently be the old build) with the same Python, so its libpython
# is the one the app's virtualenv was made with. BUILD.json beside it records how it was built.
# About 40 s per build on 2 cores (uWSGI compiles ~100 C files).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV_PY="$ROOT/.venv/bin/python"
OURS="$ROOT/.venv/bin/uwsgi"
OUT_ROOT="${UWSGI_BUILDS:-$ROOT/build/uwsgi}"
PROFILES="o3, pcre, nopcre, shared, static, pyuwsgi"

if [ $# -eq 0 ]; then
    echo "error: profile: give one or more of $PROFILES" >&2
    exit 2
fi
for profile in "$@"; do
    case "$profile" in o3|pcre|nopcre|shared|static|pyuwsgi) ;; *)
        echo "error: profile: unknown profile '$profile'; allowed: $PROFILES" >&2; exit 2 ;;
    esac
done
if [ ! -x "$VENV_PY" ] || [ ! -x "$OURS" ]; then
    echo "error: no project venv with uWSGI at $ROOT/.venv: run make venv first" >&2
    exit 2
fi
version=$("$OURS" --version)
python_version=$("$VENV_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
STATIC_LDFLAGS="$ROOT/scripts/static-libpython-ldflags.sh"
for profile in "$@"; do
    probe=$(mktemp -d)
    if [ "$profile" = static ] && [ -z "$(bash "$STATIC_LDFLAGS" "$VENV_PY" "$probe/libpython" 2>/dev/null)" ]; then
        rm -rf "$probe"
        echo "error: profile: static needs the static libpython of $VENV_PY: apt-get install libpython$python_version-dev" >&2
        exit 2
    fi
    rm -rf "$probe"
done
# The project's build has internal routing only if it was built with PCRE.
if "$OURS" --help 2>/dev/null | grep -q -- '--route-if'; then ours_pcre=true; else ours_pcre=false; fi

for profile in "$@"; do
    dir="$OUT_ROOT/$profile"
    rm -rf "$dir.tmp"
    cflags="" ldflags="" override=""
    case "$profile" in
        o3) cflags="-O3"; override="pcre=$ours_pcre;routing=$ours_pcre" ;;
        pcre) override="pcre=true;routing=true" ;;
        nopcre) override="pcre=false;routing=false" ;;
        static) ldflags=$(bash "$STATIC_LDFLAGS" "$VENV_PY" "$dir.tmp/libpython") ;;
    esac
    echo "building uWSGI $version, profile $profile (CFLAGS='$cflags' LDFLAGS='$ldflags' UWSGI_PROFILE_OVERRIDE='$override') into $dir"
    "$VENV_PY" -m venv "$dir.tmp"
    "$dir.tmp/bin/python" -m pip install -q --upgrade pip >/dev/null
    # uwsgiconfig.py reads UWSGI_PROFILE_OVERRIDE whenever it is set, even empty (and then fails).
    overrides=()
    [ -n "$override" ] && overrides=("UWSGI_PROFILE_OVERRIDE=$override")
    if [ "$profile" = pyuwsgi ]; then
        bash "$ROOT/scripts/install-pyuwsgi.sh" "$dir.tmp/bin/python" "$version"
    else
        env CFLAGS="$cflags" LDFLAGS="$ldflags" "${overrides[@]}" \
            "$dir.tmp/bin/python" -m pip install -q --no-cache-dir --no-binary uwsgi "uwsgi==$version"
    fi
    rm -rf "$dir.tmp/libpython"  # only the link step needed it
    if [ "$profile" = static ] && ldd "$dir.tmp/bin/uwsgi" | grep -q libpython; then
        echo "error: static: $dir.tmp/bin/uwsgi still links a shared libpython" >&2
        exit 1
    fi
    if [ ! -x "$dir.tmp/bin/uwsgi" ]; then
        echo "error: $profile: pip installed no $dir.tmp/bin/uwsgi" >&2
        exit 1
    fi
    help=$("$dir.tmp/bin/uwsgi" --help 2>/dev/null || true)
    if grep -q -- '--route-if' <<<"$help"; then routing=true; else routing=false; fi
    if grep -q -- '--ssl-socket' <<<"$help"; then ssl=true; else ssl=false; fi
    "$dir.tmp/bin/python" - "$dir.tmp/BUILD.json" "$profile" "$version" "$python_version" "$cflags" "$ldflags" \
        "$override" "$routing" "$ssl" "$("$dir.tmp/bin/uwsgi" --cflags)" <<'EOF'
import json, sys
path, profile, version, python, cflags, ldflags, override, routing, ssl, built = sys.argv[1:]
json.dump({"profile": profile, "version": version,
           "python": python,  # a static build names no libpython: its Python is recorded here
           "env": {"CFLAGS": cflags, "LDFLAGS": ldflags, "UWSGI_PROFILE_OVERRIDE": override},
           "routing": routing == "true", "ssl": ssl == "true",
           # the code-generation flags uwsgi --cflags reports (gcc takes the last -O)
           "cflags": [t for t in built.split() if t.startswith(("-O", "-f", "-m", "-g"))]},
          open(path, "w"), indent=2)
EOF
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    if [ "$profile" = pyuwsgi ]; then
        # pip wrote the venv's path into the scripts' #! lines: point them at where it now is.
        sed -i "1s|^#!$dir.tmp/|#!$dir/|" "$dir/bin/uwsgi" "$dir/bin/pyuwsgi"
    fi
    # The stack may run as another user (www-data under root): it must reach the binary.
    chmod -R a+rX "$dir"
    echo "built $dir/bin/uwsgi (routing: $routing, SSL: $ssl)"
done
