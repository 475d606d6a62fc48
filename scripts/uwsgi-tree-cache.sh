# The per-user cache of compiled uWSGI source trees that scripts/build-uwsgi.sh builds in (sourced by
# it; tests/test_uwsgi_tree_cache.py calls these functions on their own). One tree per set of compile
# inputs, shared by every clone of this user's on this machine, as pip's and ccache's caches are:
#   ${UWSGI_TREE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/uwsgi-layouts/uwsgi-trees}
# A tree's objects are linked into a uWSGI that may start as root, so the cache is made 0700 and
# used only while it is a directory of this user's that nobody else can write. Trees unused for
# TREE_MAX_AGE_DAYS are removed at the start of a build, then the least recently used ones while the
# cache holds more than TREE_CACHE_MAX_KIB; removing the directory by hand is always safe between
# builds (it is made again, and the next build compiles).

TREES="${UWSGI_TREE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/uwsgi-layouts/uwsgi-trees}"
TREE_MAX_AGE_DAYS=7
TREE_CACHE_MAX_KIB=$((1024 * 1024))  # a tree of uWSGI 2.0 with its objects is about 10 MB

trusted_tree_cache() {  # $TREES, made 0700 if missing; exit 2 unless ours alone to write
    (umask 077 && mkdir -p "$TREES") 2>/dev/null || true  # what is there instead is refused below
    if [ -L "$TREES" ] || [ ! -d "$TREES" ] || [ "$(stat -c %u "$TREES")" != "$(id -u)" ] \
        || (( 8#$(stat -c %a "$TREES") & 8#022 )); then
        echo "error: UWSGI_TREE_CACHE: $TREES is not a directory of uid $(id -u) that only it can write: remove it (it is made again) or point UWSGI_TREE_CACHE elsewhere" >&2
        exit 2
    fi
}

header_packages() {  # PYTHON_VERSION: the installed versions of the headers uWSGI probes and includes (none off Debian)
    dpkg-query -W -f='${Package}=${Version}\n' libssl-dev libpcre2-dev "libpython$1-dev" libc6-dev gcc \
        zlib1g-dev libxml2-dev libexpat1-dev libcap-dev uuid-dev libjansson-dev libyajl-dev 2>/dev/null || true
}

compiler() {  # CC: what uwsgiconfig.py runs (CC, else the Python's own), by path and version
    local cc=$1 path
    path=$(command -v "${cc%% *}" || true)
    printf '%s\n%s\n' "$cc" "$( [ -n "$path" ] && readlink -f "$path")"
    ${cc%% *} --version 2>/dev/null | head -n 1 || true  # gcc's Debian package keeps its version when gcc-12 changes
}

build_environment() {  # the variables uwsgiconfig.py, its plugins and gcc read, as set in ours
    local name
    for name in $(compgen -e | LC_ALL=C sort); do
        case "$name" in
            UWSGI_BUILDS|UWSGI_TREE_CACHE) ;;  # ours: where things go, not what is compiled
            UWSGI_*|CC|CPP|APPEND_CFLAGS|CPATH|C_INCLUDE_PATH|PKG_CONFIG_PATH|PKG_CONFIG_LIBDIR|PKG_CONFIG_SYSROOT_DIR)
                printf '%s=%s\n' "$name" "${!name}" ;;
        esac
    done
    # a profile given as a file outside the tree (UWSGI_PROFILE=/path/x.ini): its content too
    if [[ "${UWSGI_PROFILE:-}" == /* ]] && [ -f "$UWSGI_PROFILE" ]; then sha256sum <"$UWSGI_PROFILE"; fi
}

tree_key() {  # PYTHON VERSION CFLAGS OVERRIDE: 16 hex digits naming every compile input, nothing of the clone
    local python=$1 version=$2 cflags=$3 override=$4 identity
    # What uwsgiconfig.py compiles against, asked of the Python that runs it (a venv's answers are its
    # base interpreter's, wherever the venv is): sys.version has the version and the build; the base
    # interpreter; the -I directories its python plugin adds; the CC it compiles with unless CC is set.
    identity=$("$python" -c 'import os, sys, sysconfig
print(sys.version)
print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
print(sysconfig.get_path("include"), sysconfig.get_path("platinclude"))
print("%d.%d" % sys.version_info[:2])
print(sysconfig.get_config_var("CC") or "cc")')
    printf '%s\n' "$version" "$cflags" "$override" "$identity" "$(compiler "${CC:-$(sed -n 5p <<<"$identity")}")" \
        "$(header_packages "$(sed -n 4p <<<"$identity")")" "$(build_environment)" | sha256sum | cut -c1-16
}

prune_trees() {  # KEEP: trees unused for TREE_MAX_AGE_DAYS, then the least recently used while over the size
    local keep=$1 now total mtime lock stem size
    now=$(date +%s)
    total=$(du -sk "$TREES" | cut -f1)
    # A tree's lock is touched at each build: its mtime is when the tree was last used; oldest first.
    while read -r mtime lock; do
        stem=${lock%.lock}
        [ "$stem" = "$keep" ] && continue
        if (( now - mtime > TREE_MAX_AGE_DAYS * 86400 || total > TREE_CACHE_MAX_KIB )); then
            # du fails on the parts that are not there (most often .sdist and .building)
            size=$({ du -sk "$stem" "$stem.sdist" "$stem.building" 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
            touch "$stem.building"  # were this removal killed, the next build would start afresh
            rm -rf "$stem" "$stem.sdist"
            rm -f "$stem.building" "$lock"
            total=$((total - size))
            echo "removed the uWSGI tree $stem (last used $(date -u -d "@$mtime" +%F))"
        fi
    done < <(find "$TREES" -maxdepth 1 -name 'uwsgi-*.lock' -printf '%T@ %p\n' | sed 's/\.[0-9]* / /' | sort -n)
}

open_tree_cache() {  # KEEP: the cache's lock held shared in fd CACHE_LOCK, after pruning if no build uses it
    exec {CACHE_LOCK}>>"$TREES/.lock"
    if flock -n -x "$CACHE_LOCK"; then
        prune_trees "$1"
    fi
    flock -s "$CACHE_LOCK"  # waits for a pruning elsewhere to end
}
