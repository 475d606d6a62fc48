#!/usr/bin/env bash
# Build uWSGI again, with other flags, into build/uwsgi/PROFILE/ (a venv holding only uWSGI), so
# that a benchmark can run it beside the project's own build: a layout's `uwsgi_bin` option, e.g.
# '2x4-mapped@uwsgi_bin=/path/to/build/uwsgi/o3/bin/uwsgi' (scripts/overhead.py finds them).
#
#   scripts/build-uwsgi.sh PROFILE...    (make uwsgi-builds builds o3; pcre and nopcre stay for the
#   record: a build without PCRE cannot run our uwsgi.ini, whose route-if-not lines need routing)
#
# Profiles: the project's build (pip compiles uWSGI with -O2 and whatever it finds: PCRE, hence
# internal routing, only if libpcre2-dev was installed when it built) changed in one thing:
#   o3      CFLAGS=-O3 (uWSGI's -O2 comes first; gcc takes the last -O), PCRE as in the project's
#   pcre    PCRE and internal routing on (needs libpcre2-dev; fails loudly without it)
#   nopcre  PCRE and internal routing off
# Each is the same uWSGI version as the project's, built from source by pip (--no-binary, and no
# cache: a cached wheel would silently be the old build) with the same Python, so its libpython
# is the one the app's virtualenv was made with. BUILD.json beside it records how it was built.
# About 40 s per build on 2 cores (uWSGI compiles ~100 C files).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV_PY="$ROOT/.venv/bin/python"
OURS="$ROOT/.venv/bin/uwsgi"
OUT_ROOT="${UWSGI_BUILDS:-$ROOT/build/uwsgi}"

if [ $# -eq 0 ]; then
    echo "error: profile: give one or more of o3, pcre, nopcre" >&2
    exit 2
fi
for profile in "$@"; do
    case "$profile" in o3|pcre|nopcre) ;; *)
        echo "error: profile: unknown profile '$profile'; allowed: o3, pcre, nopcre" >&2; exit 2 ;;
    esac
done
if [ ! -x "$VENV_PY" ] || [ ! -x "$OURS" ]; then
    echo "error: no project venv with uWSGI at $ROOT/.venv: run make venv first" >&2
    exit 2
fi
version=$("$OURS" --version)
# The project's build has internal routing only if it was built with PCRE.
if "$OURS" --help 2>/dev/null | grep -q -- '--route-if'; then ours_pcre=true; else ours_pcre=false; fi

for profile in "$@"; do
    dir="$OUT_ROOT/$profile"
    cflags="" override=""
    case "$profile" in
        o3) cflags="-O3"; override="pcre=$ours_pcre;routing=$ours_pcre" ;;
        pcre) override="pcre=true;routing=true" ;;
        nopcre) override="pcre=false;routing=false" ;;
    esac
    echo "building uWSGI $version, profile $profile (CFLAGS='$cflags' UWSGI_PROFILE_OVERRIDE='$override') into $dir"
    rm -rf "$dir.tmp"
    "$VENV_PY" -m venv "$dir.tmp"
    "$dir.tmp/bin/python" -m pip install -q --upgrade pip >/dev/null
    CFLAGS="$cflags" UWSGI_PROFILE_OVERRIDE="$override" \
        "$dir.tmp/bin/python" -m pip install -q --no-cache-dir --no-binary uwsgi "uwsgi==$version"
    if "$dir.tmp/bin/uwsgi" --help 2>/dev/null | grep -q -- '--route-if'; then routing=true; else routing=false; fi
    "$dir.tmp/bin/python" - "$dir.tmp/BUILD.json" "$profile" "$version" "$cflags" "$override" "$routing" \
        "$("$dir.tmp/bin/uwsgi" --cflags)" <<'EOF'
import json, sys
path, profile, version, cflags, override, routing, built = sys.argv[1:]
json.dump({"profile": profile, "version": version, "env": {"CFLAGS": cflags, "UWSGI_PROFILE_OVERRIDE": override},
           "routing": routing == "true",  # the code-generation flags uwsgi --cflags reports (gcc takes the last -O)
           "cflags": [t for t in built.split() if t.startswith(("-O", "-f", "-m", "-g"))]},
          open(path, "w"), indent=2)
EOF
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    # The stack may run as another user (www-data under root): it must reach the binary.
    chmod -R a+rX "$dir"
    echo "built $dir/bin/uwsgi (routing: $routing)"
done
