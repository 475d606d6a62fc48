"""Parsers for the layout's fields: each takes what a user or layout.json gave and returns the
value, or raises LayoutError naming the field and what is allowed. Pure: paths are checked
for what the generated files can hold, never looked up (deploy.machine does that).
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from uwsgi_layouts.deploy.model.errors import LayoutError


def int_in(field_name: str, raw, low: int, high: int) -> int:
    if isinstance(raw, bool):
        raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
    if isinstance(raw, str):
        text = raw.strip()
        if not re.fullmatch(r"[+-]?\d{1,9}", text):
            raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
        raw = int(text)
    if not isinstance(raw, int) or not low <= raw <= high:
        raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
    return raw


def boolean(field_name: str, raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise LayoutError(field_name, f"must be on or off, got {raw!r}")


# uWSGI expands %x and $(VAR) in uwsgi.ini values; nginx.conf takes socket paths and the
# data-set alias unquoted, so its syntax characters would change what it reads.
UWSGI_EXPANDS = "%$"
NGINX_SYNTAX = " \t;{}#'\"\\"


def config_path(field_name: str, path: str, nginx: bool = False) -> str:
    """A directory that is written into uwsgi.ini (and, with ``nginx``, into nginx.conf)."""
    refused = UWSGI_EXPANDS + (NGINX_SYNTAX if nginx else "")
    bad = next((c for c in path if not c.isprintable() or c in refused), None)
    if bad is not None:
        raise LayoutError(field_name, f"{path!r} contains {bad!r}, which the generated config files cannot "
                                      "hold; use another directory")
    return path


def parse_host_port(field_name: str, raw: str) -> tuple[str, int]:
    host, sep, port = str(raw).rpartition(":")
    if not sep or not host:
        raise LayoutError(field_name, f"expected IPV4:PORT such as 127.0.0.1:8000, got {raw!r}")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise LayoutError(field_name, f"expected an IPv4 address before ':PORT', got {host!r}") from None
    return host, int_in(field_name, port, 1, 65535)


# --- the app's environment: env, static ----------------------------------------------------

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# uWSGI reads uwsgi.ini values through three passes that replace $(VAR) with an environment
# variable, @(FILE) with a file's content (read as root, before dropping privileges) and
# %(NAME) with an option (core/uwsgi.c uwsgi_apply_config_pass). None has an escape.
UWSGI_VALUE_SEQUENCES = {"$(": "an environment variable", "@(": "a file's content", "%(": "another option"}
# Keys the stack sets itself (or uWSGI reads as options).
RESERVED_ENV = {"PYTHONHOME": "--virtualenv sets it", "UL_DATA_DIR": "--data-dir sets it"}
STATIC_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._~-]+$")
# Locations the project's own data set takes (--data-dir): nginx serves /static/,
# /_internal_files/ and /nfiles/<id> (through its map of the index), the app answers /files/<id>.
DATA_DIR_PREFIXES = ("/files", "/_internal_files", "/static", "/nfiles")
# open_file_cache: "on" keeps this many entries per nginx worker; a number sets it.
OPEN_FILE_CACHE_ON = 1000
MAX_OPEN_FILE_CACHE = 1_000_000


def pairs(field_name: str, raw, example: str) -> list[tuple[str, str]]:
    """Accept "K=V" strings or (k, v) pairs (from layout.json), one or many."""
    items = [raw] if isinstance(raw, str) else list(raw or ())
    out = []
    for item in items:
        if isinstance(item, str):
            key, sep, value = item.partition("=")
            if not sep:
                raise LayoutError(field_name, f"expected {example}, got {item!r}")
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
            key, value = item
        else:
            raise LayoutError(field_name, f"expected {example}, got {item!r}")
        out.append((key, value))
    return out


def parse_env(raw) -> tuple[tuple[str, str], ...]:
    """``--env KEY=VALUE`` items -> ((key, value), ...): uWSGI ``env = KEY=VALUE`` lines."""
    out: list[tuple[str, str]] = []
    for key, value in pairs("env", raw, "KEY=VALUE such as DJANGO_SETTINGS_MODULE=shop.settings"):
        if not ENV_KEY_RE.match(key):
            raise LayoutError("env", f"key {key!r} must be a name of letters, digits and _ (not starting with a "
                                     "digit), e.g. DJANGO_SETTINGS_MODULE")
        if key.upper().startswith("UWSGI_"):
            raise LayoutError("env", f"{key} is refused: uWSGI reads UWSGI_* variables as its own options")
        if key.upper().startswith("GRANIAN_"):
            raise LayoutError("env", f"{key} is refused: granian reads GRANIAN_* variables as its own options")
        if key in RESERVED_ENV:
            raise LayoutError("env", f"{key} is refused: {RESERVED_ENV[key]}")
        if any(key == k for k, _ in out):
            raise LayoutError("env", f"{key} is given twice")
        bad = next((c for c in value if not c.isprintable()), None)
        if bad is not None:
            raise LayoutError("env", f"value of {key} contains {bad!r}: uwsgi.ini values are one line of "
                                     "printable characters")
        if value != value.rstrip(" \t"):
            raise LayoutError("env", f"value of {key} ends with whitespace, which uWSGI strips from ini values")
        for seq, what in UWSGI_VALUE_SEQUENCES.items():
            if seq in value:
                raise LayoutError("env", f"value of {key} contains {seq!r}, which uWSGI replaces with {what} "
                                         "in uwsgi.ini (no escape exists): have the app read that value from a "
                                         "file instead (the workers get only --env and PATH, LANG, LC_*, TZ, HOME)")
        out.append((key, value))
    return tuple(out)


# The risks a user can accept by name (--allow-NAME, layout field ``allow``); deploy.machine
# refuses each of them otherwise.
RISKS = {
    "world-writable": "the app dir, virtualenv or a static dir (or a parent without the sticky bit) is writable by "
                      "users other than its owner, who could plant code the workers run or files nginx serves",
    "root": "the app runs as root (--user root)",
    "system-static": "nginx serves a directory under /etc, /proc, /sys, /dev, /boot, /root, /run or /var/lib",
    "public-listen": "nginx listens on an address other machines can reach (the lab's stacks are for loopback)",
    "tcp-stats": "uWSGI's stats server on 127.0.0.1 TCP (--stats-port), where every local user reads the variables "
                 "of requests in flight: cookies, Authorization headers",
}


def parse_allow(raw) -> tuple[str, ...]:
    """Accepted risks: names of RISKS, as "a,b" (a variant's ``@allow=a``) or a sequence."""
    items = str(raw).replace("+", ",").split(",") if isinstance(raw, str) else list(raw or ())
    names = sorted({str(item).strip() for item in items if str(item).strip()})
    unknown = [n for n in names if n not in RISKS]
    if unknown:
        raise LayoutError("allow", f"unknown risk {unknown[0]!r}; the risks you can accept: {', '.join(RISKS)}")
    return tuple(names)


def nests(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def parse_static(raw, data_dir: str = "", local: bool = True) -> tuple[tuple[str, str], ...]:
    """``--static PREFIX=DIR`` items -> ((prefix, dir), ...), prefix without a trailing slash.
    nginx serves DIR under PREFIX/ itself. ``local``: DIR is a directory of this machine, kept
    as given here and resolved by deploy.machine; ``local=False``: DIR is a path on another
    machine (a bundle's server), only normalised."""
    out: list[tuple[str, str]] = []
    for prefix, directory in pairs("static", raw, "PREFIX=DIR such as /static=/srv/shop/static"):
        clean = prefix[:-1] if prefix.endswith("/") and prefix != "/" else prefix
        if clean == "/":
            raise LayoutError("static", "prefix '/' would hide the app behind nginx: use a path such as /static")
        segments = clean.split("/")[1:]
        if (not clean.startswith("/") or any(s in ("", ".", "..") for s in segments)
                or not all(STATIC_SEGMENT_RE.match(s) for s in segments)):
            raise LayoutError("static", f"prefix {prefix!r} must be a clean URL path such as /static or "
                                        "/media/uploads (segments of letters, digits, . _ ~ -; no . or ..)")
        if not directory:
            raise LayoutError("static", f"{prefix}= needs a directory after '='")
        if local:
            path = config_path("static", directory, nginx=True)
        else:
            if not directory.startswith("/"):
                raise LayoutError("static", f"{directory!r} (for {clean}/) must be an absolute path on the server")
            path = str(Path(os.path.normpath(config_path("static", directory, nginx=True))))
        check_static_dir(clean, path)
        for other, _ in out:
            if nests(clean, other):
                raise LayoutError("static", f"prefixes {other}/ and {clean}/ overlap: nginx would serve one "
                                            "from inside the other; give each its own path")
        if data_dir:
            taken = next((p for p in DATA_DIR_PREFIXES if nests(clean, p)), None)
            if taken:
                raise LayoutError("static", f"prefix {clean}/ overlaps {taken}/, which --data-dir uses; "
                                            "choose another prefix")
        out.append((clean, path))
    return tuple(out)


def check_static_dir(prefix: str, path: str) -> str:
    """A static directory as it goes into nginx.conf: never the whole filesystem."""
    if path == "/":
        raise LayoutError("static", f"{prefix}/ would serve the whole filesystem: name the static directory")
    return config_path("static", path, nginx=True)


# The smallest CFS quota the kernel takes is 1 ms per period; over the 100 ms period a container
# runtime uses, that is 0.01 CPU. The largest is only a sanity bound: the machine room refuses
# more than the host has.
MIN_CPUS = 0.01
MAX_CPUS = 4096
MAX_MEMORY_MB = 16 * 1024 * 1024


def parse_cpus(raw) -> float | None:
    """A CPU limit (``@cpus=1.5``): CPUs, fractions allowed, to the hundredth. ""/None: none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    text = str(raw).strip()
    allowed = f"a number of CPUs in {MIN_CPUS:g}..{MAX_CPUS} (fractions allowed, e.g. 0.5 or 1.5)"
    if isinstance(raw, bool) or not re.fullmatch(r"\d{1,4}(\.\d{1,2})?|\.\d{1,2}", text):
        raise LayoutError("cpus", f"must be {allowed}, got {raw!r}")
    value = float(text)
    if not MIN_CPUS <= value <= MAX_CPUS:
        raise LayoutError("cpus", f"must be {allowed}, got {raw!r}")
    return value


def parse_memory_mb(raw) -> int | None:
    """A memory limit (``@memory=512``) in MB (MiB). ""/None: none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    return int_in("memory", raw, 1, MAX_MEMORY_MB)


def parse_open_file_cache(raw) -> int:
    """``off`` (0), ``on`` (OPEN_FILE_CACHE_ON entries) or a number of entries per nginx worker."""
    text = str(raw).strip().lower() if not isinstance(raw, bool) else ("on" if raw else "off")
    if text in ("off", "false", "no"):
        return 0
    if text in ("on", "true", "yes"):
        return OPEN_FILE_CACHE_ON
    if re.fullmatch(r"\d{1,7}", text) and int(text) <= MAX_OPEN_FILE_CACHE:
        return int(text)
    raise LayoutError("open_file_cache", f"must be off, on ({OPEN_FILE_CACHE_ON} entries per nginx worker) or a "
                                         f"number of entries in 1..{MAX_OPEN_FILE_CACHE} (0 = off), got {raw!r}")
