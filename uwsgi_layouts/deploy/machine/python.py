"""The Pythons on this machine: the uWSGI binary we start and the libpython it embeds, a
virtualenv's version, whether our uWSGI has SSL, where a peer server's package is installed.

Why the version check: uWSGI's python plugin is linked against one libpython; with
``virtualenv =`` it takes the venv's ``bin/python`` as program name, so Python looks for the
venv's packages in ``lib/pythonX.Y`` of *its own* X.Y: a venv of another version loads nothing.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError, config_path

TOOL = "uwsgi-layouts"


def tool_command() -> str:
    """How to start this tool again from a shell, for the commands we print or write to run here:
    ``uwsgi-layouts`` when PATH finds this very installation (pipx, an activated venv), else the
    console script beside our interpreter by its absolute path (``make`` in a checkout runs
    ``.venv/bin/uwsgi-layouts`` without putting it on PATH), else ``python -m uwsgi_layouts``."""
    beside = Path(sys.executable).parent / TOOL
    found = shutil.which(TOOL)
    if found and (not beside.exists() or Path(found).resolve() == beside.resolve()):
        return TOOL
    if os.access(beside, os.X_OK):
        return str(beside)
    return f"{sys.executable} -m uwsgi_layouts"


def find_uwsgi() -> str | None:
    """The uwsgi binary the stack starts: the one pip put beside this interpreter, else PATH's."""
    beside_python = Path(sys.executable).parent / "uwsgi"
    return str(beside_python) if beside_python.exists() else shutil.which("uwsgi")


@lru_cache(maxsize=None)
def uwsgi_python() -> tuple[tuple[int, int], str]:
    """(major, minor) of the Python our uWSGI embeds, and how that was determined.

    pip compiles uWSGI against the interpreter that installs it and links that libpython
    (e.g. ``libpython3.11.so.1.0``, a DT_NEEDED entry of the binary): read that name. A build
    linked against the static libpython names none: the Python headers it was compiled against
    say which, else it is this interpreter, whose venv holds it.
    """
    binary = find_uwsgi()
    interpreter = script_interpreter(Path(binary)) if binary else None
    launched = virtualenv_python(interpreter.parent.parent) if interpreter else None
    if launched:  # make venv's pyuwsgi: started by the app's virtualenv's python, of this version
        return launched, f"{binary} is pyuwsgi, built for Python {launched[0]}.{launched[1]}"
    linked = linked_python(binary) if binary else None
    if linked:
        return linked, f"{binary} links libpython{linked[0]}.{linked[1]}"
    compiled = compiled_python(Path(binary)) if binary else None
    if compiled:  # make venv links the static libpython when the Python has one
        return compiled, (f"{binary} holds the static libpython{compiled[0]}.{compiled[1]} (built against its "
                          "headers)")
    version = sys.version_info[:2]
    return (version[0], version[1]), f"pip built {binary or 'uwsgi'} with {sys.executable}"


def server_python(server: str) -> tuple[tuple[int, int], str]:
    """(major, minor) of the Python the app server runs the app with, and how that was determined.
    uWSGI embeds one libpython; gunicorn and granian are packages of our venv, imported into the
    app's own interpreter (deploy/run/servers.py), so that interpreter must be our venv's Python
    (granian is compiled for it)."""
    if server == "uwsgi":
        return uwsgi_python()
    version = sys.version_info[:2]
    return (version[0], version[1]), f"pip installed our {server} for {sys.executable}"


def linked_python(binary: str) -> tuple[int, int] | None:
    """(major, minor) of the libpython a uWSGI binary links (its DT_NEEDED name), or None
    (statically linked, or unreadable)."""
    try:
        match = re.search(rb"libpython(\d+)\.(\d+)", Path(binary).read_bytes())
    except OSError:
        return None
    return (int(match[1]), int(match[2])) if match else None


def virtualenv_python(venv: Path) -> tuple[int, int] | None:
    """(major, minor) a virtualenv was made with: pyvenv.cfg's ``version`` (venv) or
    ``version_info`` (virtualenv, uv), else what its bin/python says."""
    try:
        text = (venv / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() in ("version", "version_info"):
            match = re.match(r"\s*(\d+)\.(\d+)", value)
            if match:
                return int(match[1]), int(match[2])
    try:
        out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def venv_base_stdlib(venv: Path) -> Path | None:
    """The standard library a venv's workers load: under pyvenv.cfg's ``home`` (its base Python)."""
    try:
        text = (venv / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        return None
    home = next((v.strip() for k, _, v in (line.partition("=") for line in text.splitlines())
                 if k.strip() == "home"), "")
    version = virtualenv_python(venv)
    if not home or version is None:
        return None
    stdlib = Path(home).parent / "lib" / f"python{version[0]}.{version[1]}"
    return stdlib if stdlib.is_dir() else None


def check_virtualenv(raw, server: str = "uwsgi") -> str:
    """The resolved virtualenv directory, or LayoutError("virtualenv", ...). Its Python
    major.minor must be the one ``server`` (uwsgi, gunicorn, granian) runs on."""
    text = config_path("virtualenv", str(raw))
    venv = Path(os.path.expanduser(text)).resolve()
    config_path("virtualenv", str(venv))  # where a symlink led
    (major, minor), how = server_python(server)
    label = "uWSGI" if server == "uwsgi" else server
    make = f"python{major}.{minor} -m venv {venv}"
    try:
        exists = venv.is_dir()
        shaped = (venv / "pyvenv.cfg").is_file() and os.access(venv / "bin" / "python", os.X_OK)
    except OSError as exc:
        raise LayoutError("virtualenv", f"unusable path {text!r}: {exc.strerror}") from None
    if not exists:
        raise LayoutError("virtualenv", f"{text!r} does not exist: create it with {make}")
    if not shaped:
        raise LayoutError("virtualenv", f"{venv} is not a virtualenv (it needs pyvenv.cfg and bin/python): "
                                        f"create one with {make}")
    found = virtualenv_python(venv)
    if found is None:
        raise LayoutError("virtualenv", f"cannot tell the Python version of {venv} (no version in pyvenv.cfg, "
                                        f"bin/python does not run): recreate it with {make}")
    if found != (major, minor):
        raise LayoutError(
            "virtualenv",
            f"{venv} is Python {found[0]}.{found[1]} but our {label} runs Python {major}.{minor} ({how}): recreate it "
            f"with {make} and reinstall your requirements, or rebuild our venv with that Python "
            f"(rm -rf .venv; make venv PYTHON=python{found[0]}.{found[1]})",
        )
    return str(venv)


def check_uwsgi_bin(raw: str, tls: bool = False) -> str:
    """Another build of uWSGI to run (the layout's ``uwsgi_bin``), resolved, or LayoutError: an
    executable file running the Python our uWSGI runs (so the app's virtualenv fits it too),
    that only root or we can change: started as root, it runs as root until it drops privileges.
    Three kinds (scripts/build-uwsgi.sh): a binary linking a shared libpython (its DT_NEEDED name
    says which), a binary linked against the static libpython (its BUILD.json says which, else the
    Python headers it was compiled against), and pyuwsgi's launcher, a script whose venv holds
    uWSGI as an extension module (the lab starts it with the app's virtualenv's python:
    ``pyuwsgi_site``). It must have internal routing (every uwsgi.ini refuses code-loading packets
    with route-if-not lines) and, for ``tls``, SSL."""
    if not raw.startswith("/"):
        raise LayoutError("uwsgi_bin", f"{raw!r} must be an absolute path to a uwsgi binary")
    binary = Path(raw).resolve()
    build = "build one with scripts/build-uwsgi.sh o3, static or pyuwsgi (make uwsgi-builds)"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise LayoutError("uwsgi_bin", f"{raw} is not an executable file: {build}")
    owned_by_us_or_root(binary)
    interpreter = script_interpreter(binary)
    if interpreter is not None:
        owned_by_us_or_root(interpreter.resolve())
        linked = virtualenv_python(interpreter.parent.parent)
        if pyuwsgi_site(binary) is None:
            raise LayoutError("uwsgi_bin", f"{raw} is a script whose venv holds no pyuwsgi module: {build}")
    else:
        linked = linked_python(str(binary)) or recorded_python(binary) or compiled_python(binary)
    major, minor = uwsgi_python()[0]
    if linked != (major, minor):
        got = f"runs Python {linked[0]}.{linked[1]}" if linked else "links no libpython we can read (and neither " \
                                                                    "a BUILD.json nor Python headers name one)"
        raise LayoutError("uwsgi_bin", f"{binary} {got}, but our uWSGI runs Python {major}.{minor} (as the app's "
                                       f"virtualenv): {build}")
    if not uwsgi_has_routing(str(binary)):
        raise LayoutError("uwsgi_bin", f"{binary} was built without PCRE (no internal routing, so no route-if-not "
                                       "to refuse code-loading packets): install libpcre2-dev "
                                       f"(scripts/install-system-deps.sh), then {rebuild_hint(str(binary))}")
    if tls and not uwsgi_has_ssl(str(binary)):
        raise LayoutError("uwsgi_bin", f"{binary} was built without SSL (no ssl-socket, which uwsgi_tls needs): "
                                       "install libssl-dev (scripts/install-system-deps.sh), then "
                                       f"{rebuild_hint(str(binary))}")
    return str(binary)


def rebuild_hint(binary: str) -> str:
    """How to get a uWSGI build with what this one lacks: for a pyuwsgi launcher (PyPI's wheels have
    no SSL) from source; for another build, scripts/build-uwsgi.sh."""
    if script_interpreter(Path(binary)) is not None:
        return ("reinstall pyuwsgi from source into its venv (pip install --no-cache-dir --no-binary pyuwsgi pyuwsgi) "
                "or build one: scripts/build-uwsgi.sh pyuwsgi")
    return "rebuild it: scripts/build-uwsgi.sh PROFILE (make uwsgi-builds)"


def owned_by_us_or_root(path: Path) -> None:
    """LayoutError unless only root or we can change ``path`` and every directory above it."""
    for each in (path, *path.parents):
        st = each.stat()
        sticky = each.is_dir() and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky:
            raise LayoutError("uwsgi_bin", f"{each} is writable by group or others: whoever can write there could "
                                           "replace the uWSGI we start")
        if st.st_uid not in (0, os.geteuid()):
            raise LayoutError("uwsgi_bin", f"{each} belongs to another user (uid {st.st_uid}), who could replace the "
                                           "uWSGI we start")


def script_interpreter(binary: Path) -> Path | None:
    """The interpreter of a #! script (pyuwsgi's bin/uwsgi), or None for a binary."""
    try:
        with binary.open("rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]) if words else None


def recorded_python(binary: Path) -> tuple[int, int] | None:
    """(major, minor) that scripts/build-uwsgi.sh recorded for a build (BUILD.json, one level above
    bin/): how a uWSGI linked against the static libpython says which Python it holds."""
    try:
        record = json.loads((binary.parent.parent / "BUILD.json").read_text())
        match = re.fullmatch(r"(\d+)\.(\d+)", str(record.get("python", "")))
    except (OSError, ValueError, AttributeError):
        return None
    return (int(match[1]), int(match[2])) if match else None


def compiled_python(binary: Path) -> tuple[int, int] | None:
    """(major, minor) of the Python headers uWSGI's python plugin was compiled against, from the
    header paths its assertions keep (``/usr/include/python3.11/...``): how a uWSGI linked against
    the static libpython without a BUILD.json (make venv's own, copied) says which Python it holds.
    None when absent or when headers of two versions appear."""
    try:
        found = set(re.findall(rb"include/python(\d+)\.(\d+)/", binary.read_bytes()))
    except OSError:
        return None
    if len(found) != 1:
        return None
    (major, minor), = found
    return int(major), int(minor)


def site_packages(venv: Path, version: tuple[int, int]) -> Path:
    return venv / "lib" / f"python{version[0]}.{version[1]}" / "site-packages"


def pyuwsgi_site(binary: Path) -> Path | None:
    """The site-packages directory holding pyuwsgi's extension module, for a pyuwsgi launcher
    (bin/uwsgi, a script run by its venv's python), else None (a uWSGI binary). The lab loads the
    module from there into the app's virtualenv's python (deploy/run/pyuwsgi_launch.py)."""
    interpreter = script_interpreter(binary)
    version = virtualenv_python(interpreter.parent.parent) if interpreter else None
    if version is None:
        return None
    site = site_packages(interpreter.parent.parent, version)
    found = [m for suffix in importlib.machinery.EXTENSION_SUFFIXES for m in site.glob(f"pyuwsgi{suffix}")]
    return site if found else None


def default_virtualenv() -> str:
    """Without --virtualenv: this project's venv (ours holds uWSGI and the demo app), if we run in one."""
    return sys.prefix if sys.prefix != sys.base_prefix else ""


def app_virtualenv(app_dir: Path, environ=None) -> tuple[str, str]:
    """The virtualenv an app in ``app_dir`` runs in when --virtualenv is not given, and how it
    was found: the active one ($VIRTUAL_ENV, unless it is this tool's own), else ``.venv`` or
    ``venv`` in the app's directory when it holds bin/python. ("", why) when there is none."""
    environ = os.environ if environ is None else environ
    active = environ.get("VIRTUAL_ENV", "")
    ours = Path(sys.prefix).resolve()
    if active and Path(active).resolve() != ours:
        return active, "$VIRTUAL_ENV"
    for name in (".venv", "venv"):
        candidate = Path(app_dir) / name
        if os.access(candidate / "bin" / "python", os.X_OK) and candidate.resolve() != ours:
            return str(candidate), f"{name} in the app's directory"
    skipped = " ($VIRTUAL_ENV is this tool's own)" if active else ""
    return "", f"no $VIRTUAL_ENV{skipped}, .venv or venv in {app_dir}"


def uwsgi_help(binary: str) -> str:
    """``uwsgi --help``: the options this build has ("" if it does not run). Run once per process
    for a binary as it is now: the answer is kept by the path and the file's identity (inode, size,
    times), so a build replaced at the same path is asked again, the one it replaced never."""
    return _probed_help(binary, file_identity(binary))


def file_identity(path: str) -> tuple[int, ...] | None:
    """What changes when a file is rewritten or replaced: device, inode, size, mtime and ctime
    (ns). None when it cannot be read (the probe then says what running it says)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@lru_cache(maxsize=None)
def _probed_help(binary: str, identity: tuple[int, ...] | None) -> str:
    try:
        return subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def uwsgi_has_ssl(binary: str) -> bool:
    """Was this uWSGI built with SSL (libssl-dev present when pip compiled it)? Its --help lists
    ssl-socket only then."""
    return "--ssl-socket" in uwsgi_help(binary)


def uwsgi_has_routing(binary: str) -> bool:
    """Was this uWSGI built with internal routing (PCRE, libpcre2-dev present when pip compiled
    it)? The route-if-not lines that refuse code-loading packets need it; --help lists them only then."""
    return "--route-if-not" in uwsgi_help(binary)


# Where the peers' packages are looked up: None = this interpreter's sys.path (our venv).
PEER_SEARCH_PATH: list[str] | None = None


def server_package_dir(package: str) -> Path | None:
    """A peer server's installed package directory in our venv (gunicorn, granian), or None if it
    is not installed. deploy/run/peer_launch.py imports it from there into the app's interpreter."""
    spec = importlib.machinery.PathFinder.find_spec(package, PEER_SEARCH_PATH)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])
