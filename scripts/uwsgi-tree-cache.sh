# The per-user cache of compiled uWSGI source trees that scripts/build-uwsgi.sh builds in (sourced by
# it; tests/test_uwsgi_tree_cache.py calls these functions on their own). One tree per set of compile
# inputs, shared by every clone of this user's on this machine, as pip's and ccache's caches are:
#   $UWSGI_TREE_CACHE, else $XDG_CACHE_HOME/uwsgi-layouts/uwsgi-trees (XDG_CACHE_HOME absolute),
#   else $HOME/.cache/uwsgi-layouts/uwsgi-trees (HOME from the passwd database when unset)
# A tree's objects are linked into a uWSGI that may start as root, so the cache is used only while
# it is a directory of this user's that nobody else can write, under directories that only root or
# this user can write (root's sticky ones, like /tmp, allowed): else anyone who could rename a parent
# could swap in a cache of theirs. Directories it makes are 0700. A build works from inside the cache
# (cd -P, then `.` checked again) with names relative to it, so a rename cannot redirect it.
# Trees unused for TREE_MAX_AGE_DAYS are removed at the start of a build, then the least recently used
# ones while the trees hold more than TREE_CACHE_MAX_KIB; removing the whole directory by hand is safe
# between builds (the next build makes it again, and compiles).
# The functions expect strict mode with inherit_errexit (build-uwsgi.sh's), so that a failure inside
# a command substitution (tree_key's probe) fails the build.

TREE_FORMAT=2  # in every key: raise it when how a tree is prepared changes (clones at other commits share the cache)
TREE_MAX_AGE_DAYS=7
TREE_CACHE_MAX_KIB=$((1024 * 1024))  # a tree of uWSGI 2.0 with its objects is about 10 MB
TREE_NAME_PATTERN='uwsgi-[0-9][0-9A-Za-z.+]*-[0-9a-f]{16}'  # uwsgi-VERSION-KEY: the only names pruned

tree_cache_path() {  # sets TREES and TREES_SET_BY (the variable it comes from); exit 2 if there is no home
    if [ -n "${UWSGI_TREE_CACHE:-}" ]; then
        TREES=$UWSGI_TREE_CACHE TREES_SET_BY=UWSGI_TREE_CACHE
        return
    fi
    if [[ "${XDG_CACHE_HOME:-}" == /* ]]; then  # a relative one is invalid and ignored (XDG base directory spec)
        TREES=$XDG_CACHE_HOME/uwsgi-layouts/uwsgi-trees TREES_SET_BY=XDG_CACHE_HOME
        return
    fi
    local home=${HOME:-}
    if [[ "$home" != /* ]]; then
        home=$(getent passwd "$(id -u)" | cut -d: -f6 || true)
    fi
    if [[ "$home" != /* ]]; then
        echo "error: HOME: unset, and uid $(id -u) has no home directory in the passwd database: set HOME or UWSGI_TREE_CACHE (where compiled uWSGI trees are kept)" >&2
        exit 2
    fi
    TREES=$home/.cache/uwsgi-layouts/uwsgi-trees TREES_SET_BY=HOME
}

refuse_tree_cache() {  # WHY: one line naming the variable the path came from; exit 2
    echo "error: $TREES_SET_BY: $TREES is refused as the cache of compiled uWSGI trees (they go into a uWSGI that may run as root): $1; point UWSGI_TREE_CACHE at a directory of uid $(id -u) that no one else can write" >&2
    exit 2
}

owner_and_mode() {  # PATH: "UID MODE" (octal) in one stat of it, its last symlink not followed; nothing if stat fails
    stat -c '%u %a' -- "$1" 2>/dev/null || true
}

check_ours_alone() {  # DIR: a directory of ours that neither group nor others can write, else refused
    local uid mode
    read -r uid mode <<<"$(owner_and_mode "$1")"
    if ! [[ "$uid" =~ ^[0-9]+$ && "$mode" =~ ^[0-7]+$ ]] || [ -L "$1" ] || [ ! -d "$1" ]; then
        refuse_tree_cache "it is not a directory whose owner and mode can be read"
    fi
    if [ "$uid" != "$(id -u)" ]; then
        refuse_tree_cache "it is owned by uid $uid"
    fi
    if (( 8#$mode & 8#022 )); then
        refuse_tree_cache "group or others can write it (mode $mode)"
    fi
}

check_ancestors() {  # REAL (resolved): every directory above it root's or ours, written by no one else but in root's sticky ones
    local dir=$1 uid mode
    while [ "$dir" != / ]; do
        dir=$(dirname -- "$dir")
        read -r uid mode <<<"$(owner_and_mode "$dir")"
        if ! [[ "$uid" =~ ^[0-9]+$ && "$mode" =~ ^[0-7]+$ ]]; then
            refuse_tree_cache "the owner and mode of $dir above it cannot be read"
        fi
        if [ "$uid" != 0 ] && [ "$uid" != "$(id -u)" ]; then
            refuse_tree_cache "$dir above it is owned by uid $uid, who could swap it"
        fi
        # in a sticky directory of root's (/tmp) only an entry's owner can rename it
        if (( 8#$mode & 8#022 )) && ! { [ "$uid" = 0 ] && (( 8#$mode & 8#1000 )); }; then
            refuse_tree_cache "$dir above it can be written by group or others (mode $mode)"
        fi
    done
}

enter_tree_cache() {  # cd into the cache (made 0700 where missing) once it is safe; TREES_REAL: its resolved path
    tree_cache_path
    (umask 077 && mkdir -p -- "$TREES") 2>/dev/null || true  # what is there instead is refused below
    TREES_REAL=$(realpath -e -- "$TREES" 2>/dev/null || true)  # a trailing slash or a symlink: what it points at
    if [ -z "$TREES_REAL" ]; then
        refuse_tree_cache "it is missing and cannot be made"
    fi
    check_ancestors "$TREES_REAL"
    check_ours_alone "$TREES_REAL"
    cd -P -- "$TREES_REAL" 2>/dev/null || refuse_tree_cache "it cannot be entered"
    # Whatever was renamed since: `.` is the directory every name below is relative to.
    check_ours_alone .
    if [ "$(pwd -P)" != "$TREES_REAL" ]; then
        refuse_tree_cache "it moved while it was checked"
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
    { ${cc%% *} --version 2>/dev/null || true; } | head -n 1  # gcc's Debian package keeps its version when gcc-12 changes
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
    local python=$1 version=$2 cflags=$3 override=$4 probe
    local -a answer
    # What uwsgiconfig.py compiles against, asked of the Python that runs it (a venv's answers are its
    # base interpreter's, wherever the venv is): sys.version has the version and the build (and may
    # hold a newline, hence JSON); the base interpreter; the -I directories its python plugin adds;
    # then, on lines of their own, its X.Y and the CC it compiles with unless CC is set.
    probe=$("$python" -c 'import json, os, sys, sysconfig
print(json.dumps([sys.version, os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  sysconfig.get_path("include"), sysconfig.get_path("platinclude")]))
print("%d.%d" % sys.version_info[:2])
print((sysconfig.get_config_var("CC") or "cc").replace("\n", " "))')
    mapfile -t answer <<<"$probe"
    if [ ${#answer[@]} -ne 3 ] || [[ "${answer[0]}" != '['*']' ]] || ! [[ "${answer[1]}" =~ ^[0-9]+\.[0-9]+$ ]] \
        || [ -z "${answer[2]}" ]; then
        echo "error: $python did not say what uWSGI would compile against (its probe printed: ${probe//$'\n'/ | })" >&2
        exit 1
    fi
    printf '%s\n' "$TREE_FORMAT" "$version" "$cflags" "$override" "$probe" "$(compiler "${CC:-${answer[2]}}")" \
        "$(header_packages "${answer[1]}")" "$(build_environment)" | sha256sum | cut -c1-16
}

tree_usable() {  # NAME: a tree whose preparation ended and no build of it died since; else it starts afresh
    [ -d "$1" ] && [ ! -e "$1.building" ] && [ -s "$1/.source-date-epoch" ]
}

tree_locks() {  # "MTIME NAME.lock" of each tree's lock, oldest first (a lock is touched at each build of its tree)
    find . -maxdepth 1 -regextype posix-extended -regex "\./$TREE_NAME_PATTERN\.lock" -printf '%T@ %f\n' \
        | sed 's/\.[0-9]* / /' | sort -n
}

tree_kib() {  # NAME: the KiB of a tree and what a build of it leaves beside it (du fails on the parts not there)
    { du -sk -- "$1" "$1.sdist" "$1.building" 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'
}

prune_trees() {  # KEEP (a tree's name): trees unused for TREE_MAX_AGE_DAYS, then the least recently used while over the size
    local keep=$1 now total=0 mtime lock stem size
    local -a locks
    now=$(date +%s)
    mapfile -t locks < <(tree_locks)
    for lock in "${locks[@]}"; do
        stem=${lock#* }
        total=$((total + $(tree_kib "${stem%.lock}")))
    done
    for lock in "${locks[@]}"; do
        mtime=${lock%% *} stem=${lock#* } stem=${stem%.lock}
        [ "$stem" = "$keep" ] && continue
        if (( now - mtime > TREE_MAX_AGE_DAYS * 86400 || total > TREE_CACHE_MAX_KIB )); then
            size=$(tree_kib "$stem")
            touch "$stem.building"  # were this removal killed, the next build would start afresh
            rm -rf -- "$stem" "$stem.sdist"
            rm -f -- "$stem.building" "$stem.lock"
            total=$((total - size))
            echo "removed the uWSGI tree $TREES_REAL/$stem (last used $(date -u -d "@$mtime" +%F))"
        fi
    done
}

open_tree_cache() {  # KEEP: in the cache (enter_tree_cache), its lock held shared in fd CACHE_LOCK, after pruning if no build uses it
    enter_tree_cache
    exec {CACHE_LOCK}>>.lock
    if flock -n -x "$CACHE_LOCK"; then
        prune_trees "$1"
    fi
    flock -s "$CACHE_LOCK"  # waits for a pruning elsewhere to end
}
