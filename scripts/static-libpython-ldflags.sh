#!/usr/bin/env bash
# Print the LDFLAGS that make pip's uWSGI build link the static libpython of PYTHON instead of
# the shared one, after making LINKDIR hold only a link to the archive; print nothing (and say why
# on stderr) when PYTHON has no static archive. Used by make venv and scripts/build-uwsgi.sh static.
#
#   LDFLAGS="$(scripts/static-libpython-ldflags.sh PYTHON LINKDIR)" pip install --no-binary uwsgi uwsgi
#
# Why: Debian's shared libpython3.X.so (what uWSGI links by default) is a second build of Python
# without PGO and without -fno-semantic-interposition; the python3 executable is made of the
# static, PGO-built libpython3.X.a (package libpython3.X-dev). Python code in a uWSGI linked
# against the archive runs fewer instructions (docs/alternatives.md has the figures).
# How: uWSGI's python plugin links -lpython3.X after the -L dirs of LDFLAGS, so a directory holding
# only the archive selects it; -no-pie because the archive is not position-independent; the
# libraries of the archive's built-in modules (MODLIBS: expat, zlib) added, with --no-as-needed
# because LDFLAGS come before the objects that need them. uWSGI links with -rdynamic, so the
# extension modules of the app's virtualenv find libpython's symbols in the binary.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 PYTHON LINKDIR" >&2
    exit 2
fi
python=$1 linkdir=$2
read -r archive version modlibs < <("$python" -c '
import os, sysconfig as s
archive = os.path.join(s.get_config_var("LIBPL") or "", s.get_config_var("LIBRARY") or "")
libs = " ".join(dict.fromkeys((s.get_config_var("MODLIBS") or "").split()))
print(archive, s.get_config_var("VERSION"), libs)')
if [ ! -f "$archive" ] || [ "${archive##*.}" != a ]; then
    echo "note: $python has no static libpython ($archive): uWSGI links the shared one (Debian: apt-get install libpython$version-dev)" >&2
    exit 0
fi
rm -rf "$linkdir"
mkdir -p "$linkdir"
ln -s "$archive" "$linkdir/libpython$version.a"
echo "-no-pie -Wl,--no-as-needed -L$linkdir $modlibs"
