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
#           It is make venv's own build: the wheel make venv compiled and kept is installed here
#           when its module is the very one .venv runs (BUILD.json's from_wheel); else compiled.
# Each is the same uWSGI version as the project's, built from its sdist by pip (no pip cache: a
# cached wheel would silently be the old build) with the same Python, so its libpython is the one
# the app's virtualenv was made with. BUILD.json beside it records how it was built.
# About 40 s per compile on 2 cores, idle (uWSGI compiles ~100 C files); the binary profiles share
# a source tree per set of compile inputs (below), so static after shared only links again, and so
# does every later build of the same inputs, from any clone of this user's: the trees live in a
# per-user cache, like pip's or ccache's (scripts/uwsgi-tree-cache.sh says where, how it is bounded
# and why a cache someone else could write is refused: exit 2, before anything is built). make clean
# leaves the cache (it is outside the clone); removing it between builds is safe.
# Each venv is made without a pip of its own: the project venv's pip installs into it (pip
# --python), so the venv holds only uWSGI, and each build skips ensurepip and a pip upgrade (about
# 7 CPU-s, more than the static profile's link).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) (tree_key's probe) fails the build

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV_PY="$ROOT/.venv/bin/python"
OURS="$ROOT/.venv/bin/uwsgi"
OUT_ROOT="${UWSGI_BUILDS:-$ROOT/build/uwsgi}"
[[ "$OUT_ROOT" == /* ]] || OUT_ROOT="$PWD/$OUT_ROOT"  # a binary build runs pip from inside the tree cache
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
# The binary builds compile in a source tree kept per set of compile inputs in the per-user cache
# (scripts/uwsgi-tree-cache.sh): uWSGI's own build recompiles only what changed since the tree's last
# build (uwsgiconfig.py compares each object with its source, uwsgi.h and the CFLAGS it recorded), so
# shared and static, which differ only in LDFLAGS, compile once and link twice, and a fresh clone
# links the objects an earlier one compiled. The key (tree_key) names what the compile reads and
# nothing of the clone: the tree format (TREE_FORMAT, raised when how a tree is prepared changes),
# uWSGI's version, CFLAGS, the profile override, the Python that runs
# uwsgiconfig.py (its version and build, its base interpreter, its include directories), the
# compiler, the Debian packages of the headers it probes and includes, and the environment
# uwsgiconfig.py and gcc read (UWSGI_*, CC, CPP, APPEND_CFLAGS, include and pkg-config paths). The
# build date is part of uWSGI's CFLAGS: fixed per tree (SOURCE_DATE_EPOCH, the tree's first build),
# else every build would recompile everything. pip builds a local directory in place (pip >= 21.3).
# One build per tree at a time (flock); a build that failed or died leaves its tree marked, and the
# next one starts from a fresh tree (tree_usable). Builds hold the cache's lock shared; pruning takes it
# exclusive, so it runs only when no build is using the cache.
# shellcheck source=scripts/uwsgi-tree-cache.sh
source "$ROOT/scripts/uwsgi-tree-cache.sh"

build_binary() (  # PYTHON: pip's uwsgi package, compiled for $cflags/$override, linked with $ldflags
    # A subshell: it works from inside the cache (names relative to it), under umask 077 (the tree is
    # this user's alone), holding locks, and all of that ends with it.
    local python=$1 key tree lock sdists
    key=$(tree_key "$python" "$version" "$cflags" "$override")
    tree="uwsgi-$version-$key"
    umask 077
    open_tree_cache "$tree"
    exec {lock}>>"$tree.lock"
    flock "$lock"
    touch "$tree.lock"
    if ! tree_usable "$tree"; then
        rm -rf "$tree" "$tree.building" "$tree.sdist"
        mkdir "$tree.sdist"
        "$VENV_PY" -m pip download -q --no-cache-dir --no-deps --no-binary :all: -d "$tree.sdist" "uwsgi==$version"
        sdists=("$tree.sdist"/uwsgi-*.tar.gz)
        if [ ${#sdists[@]} -ne 1 ] || [ ! -f "${sdists[0]}" ]; then
            echo "error: pip downloaded no single uWSGI $version sdist" >&2
            exit 1
        fi
        # as root, tar would keep the sdist's owners and modes: the tree root compiles must be root's alone
        tar --no-same-owner --no-same-permissions -xzf "${sdists[0]}" -C "$tree.sdist"
        chmod -R go-w "$tree.sdist"
        # the build date, fixed for the tree's life, written before the tree is in place: a tree
        # there always has it
        date +%s >"$tree.sdist/uwsgi-$version/.source-date-epoch"
        mv "$tree.sdist/uwsgi-$version" "$tree"
        rm -rf "$tree.sdist"
        echo "compiling in a new tree: $TREES_REAL/$tree"
    else
        echo "compiling in $TREES_REAL/$tree (only what changed since its last build)"
    fi
    touch "$tree.building"
    # uwsgiconfig.py reads UWSGI_PROFILE_OVERRIDE whenever it is set, even empty (and then fails).
    local overrides=()
    [ -n "$override" ] && overrides=("UWSGI_PROFILE_OVERRIDE=$override")
    env SOURCE_DATE_EPOCH="$(cat "$tree/.source-date-epoch")" CFLAGS="$cflags" LDFLAGS="$ldflags" \
        "${overrides[@]}" "$VENV_PY" -m pip --python "$python" install -q --no-cache-dir "./$tree"
    rm -f "$tree.building"
)

# The pyuwsgi wheel make venv compiled and kept (.venv/pyuwsgi-wheel, scripts/install-pyuwsgi.sh),
# printed if it is of this version and its module has the very bytes .venv runs; else nothing.
venv_pyuwsgi_wheel() {
    local wheels=("$ROOT/.venv/pyuwsgi-wheel/pyuwsgi-$version-"*.whl)
    if [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] && "$VENV_PY" - "${wheels[0]}" <<'PY'; then
import hashlib, importlib.metadata, sys, zipfile
installed = importlib.metadata.distribution("pyuwsgi")  # .venv's: VENV_PY runs this
ours = {str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest()
        for f in installed.files or () if str(f).endswith(".so")}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    kept = {n: hashlib.sha256(wheel.read(n)).hexdigest() for n in wheel.namelist() if n.endswith(".so")}
sys.exit(0 if ours and ours == kept else 1)
PY
        echo "${wheels[0]}"
    fi
}

# Checked before anything is built: a refused cache leaves no profile half done.
for profile in "$@"; do
    if [ "$profile" != pyuwsgi ]; then (enter_tree_cache); break; fi
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
    "$VENV_PY" -m venv --without-pip "$dir.tmp"
    from_wheel=""
    if [ "$profile" = pyuwsgi ]; then
        from_wheel=$(venv_pyuwsgi_wheel)
        if [ -n "$from_wheel" ]; then
            # The same sdist, setup and Python as make venv's compile: its wheel is this build.
            echo "pyuwsgi: make venv's own build, not compiled again: $from_wheel"
            PYUWSGI_PIP="$VENV_PY" bash "$ROOT/scripts/install-pyuwsgi.sh" "$dir.tmp/bin/python" "$from_wheel"
        else
            PYUWSGI_PIP="$VENV_PY" bash "$ROOT/scripts/install-pyuwsgi.sh" "$dir.tmp/bin/python" "$version"
        fi
    else
        build_binary "$dir.tmp/bin/python"
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
        "$override" "$routing" "$ssl" "$("$dir.tmp/bin/uwsgi" --cflags)" "$from_wheel" <<'EOF'
import json, sys
path, profile, version, python, cflags, ldflags, override, routing, ssl, built, wheel = sys.argv[1:]
json.dump({"profile": profile, "version": version,
           # pyuwsgi: the wheel make venv compiled, installed here as it is (null: compiled here)
           "from_wheel": wheel or None,
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
