"""Arguments every experiment kind shares: the ranges and validators their options are parsed with
(``uwsgi_layouts.arguments``), the output directory, the data set, the tools a kind needs, and the
command line a run records.

A value out of its range is refused while parsing (argparse, exit 2). A check that needs more than
one option, or the machine, raises ``BadArgument`` with one line naming the field and what is
allowed; the CLI prints it and exits 2, before anything is written.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from uwsgi_layouts.arguments import EXIT_BAD_INPUT, Ints, Numbers, refuse
from uwsgi_layouts.bench import dataset as ds
from uwsgi_layouts.deploy.machine import is_unix_address
from uwsgi_layouts.deploy.model import MAX_PROCESSES, MAX_THREADS


def results_root() -> Path:
    """Where a run writes results/<timestamp>-KIND/ unless --out says: the current directory's
    results/ (in a checkout run with make: the checkout's)."""
    return Path.cwd() / "results"


def default_data_dir() -> Path:
    return ds.default_root()

INSTALL_HINTS = {
    "wrk": "wrk is not installed: run scripts/install-system-deps.sh",
    "httperf": "httperf is not installed: apt-get install httperf (or run scripts/install-system-deps.sh)",
}


class BadArgument(ValueError):
    """A command-line value that is not allowed; the message starts with the field's name."""


class MissingTool(RuntimeError):
    """A program the kind drives is not installed (exit 1: the machine, not the input)."""


# Ranges the kinds' options share (uwsgi_layouts.arguments: each checks the value while parsing
# and shows its range in the help).
PROCESSES = Ints(1, MAX_PROCESSES)
THREADS = Ints(1, MAX_THREADS)
CONNECTIONS = Ints(1, 1000)  # requests in flight: wrk's connections, tune's concurrency
TIMEOUT_S = Numbers(1, 600)  # wrk's (or plan's httperf's) per-request timeout
# httperf (openloop, plan) samples the reply rate every 5 s: a step of 15 s holds 2 full samples.
MIN_STEP_S = 15
STEP_S = Numbers(MIN_STEP_S, 600)
HTTPERF_WARMUP_S = Numbers(1, 60)
CLIENT_NICE = Ints(0, 19)  # httperf busy-polls a core: 19 (the default) lets the server win


# What httperf requests (openloop, plan) unless --path says: the article's request.
DEFAULT_PATH = "/?rounds=5&fib=25&io_ms=10"


def request_path(raw) -> str:
    """--path: one path for httperf's command line, starting with / and without spaces."""
    path = str(raw)
    if not path.startswith("/") or any(c.isspace() for c in path) or len(path) > 2000:
        raise refuse("a path starting with / and without spaces (at most 2000 characters)", repr(raw))
    return path


def add_httperf_client(p) -> None:
    """The options of httperf's side that openloop and plan share: its request, its warm-up and
    its niceness."""
    p.add_argument("--path", type=request_path, help=f"request path (default {DEFAULT_PATH}, the article's request)")
    p.add_argument("--warmup", type=HTTPERF_WARMUP_S, default=2.0,
                   help=f"seconds of one-connection warm-up before the first step ({HTTPERF_WARMUP_S}; default 2)")
    p.add_argument("--client-nice", type=CLIENT_NICE, default=19,
                   help=f"niceness of httperf, which busy-polls a core ({CLIENT_NICE}; default 19; 0 = not niced; "
                        "with @cpus it runs in a lowest-priority cgroup of its own, where nice changes nothing)")


def stats_address(raw) -> str:
    """A uWSGI stats server's address (doctor, watch): HOST:PORT or a unix socket path."""
    text = str(raw or "").strip()
    if is_unix_address(text):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise refuse("HOST:PORT (e.g. 127.0.0.1:9191) or a unix socket path", repr(raw))
    return text


def chosen_transport(raw: str | None, hosts: int = 0) -> str:
    """uWSGI's sockets (``--transport``, parsed with ``choices=TRANSPORTS``): ``unix`` by default,
    ``tcp`` with hosts, which bind their own addresses (and with --transport tcp: any local user
    can reach a loopback port, so measure with it, do not serve with it)."""
    return raw or ("tcp" if hosts else "unix")


def split_specs(text: str) -> tuple[str, ...]:
    """Comma-separated layouts, where a variant's own options also use commas:
    ``2x4-mapped@aio=off,sendfile=on,2x4-mapped@aio=threads`` is two layouts. An item that is
    ``OPTION=VALUE`` (no ``PxT-`` in front) continues the previous layout's options."""
    specs: list[str] = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        if specs and "@" in specs[-1] and "=" in item and "@" not in item and not re.match(r"[+-]?\d+x", item):
            specs[-1] += "," + item
        else:
            specs.append(item)
    return tuple(dict.fromkeys(specs))


def require_tools(*names: str) -> None:
    """Raise MissingTool naming how to install the first program that is not on PATH."""
    for name in names:
        if not shutil.which(name):
            raise MissingTool(INSTALL_HINTS.get(name, f"{name} is not installed"))


def command_line(kind: str, argv: list[str] | None = None) -> str:
    """The command that reproduces this run: ``argv`` (the arguments after ``uwsgi-layouts``)
    when known, else this process's own arguments if they start with ``kind``."""
    if argv is None:
        argv = sys.argv[1:] if sys.argv[1:2] == [kind] else [kind]
    return "uwsgi-layouts " + shlex.join(argv)


# --------------------------------------------------------------------------- output directory


def timestamp_dir() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def prepare_out(path: str | None, suffix: str = "") -> Path:
    """The run's output directory, created empty: ``path``, else results/<timestamp><suffix>.
    Refused (BadArgument) when it exists with files in it or cannot be made."""
    out = Path(path) if path else results_root() / (timestamp_dir() + suffix)
    blocker = next((a for a in [out, *out.parents] if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise BadArgument(f"out: {blocker} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        raise BadArgument(f"out: {out} is not empty; choose a new directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadArgument(f"out: cannot create {out}: {exc.strerror or exc}") from None
    return out


# --------------------------------------------------------------------------- the data set


def unreachable_parent(path: Path) -> Path | None:
    """Under root the stack runs as an unprivileged user, who must traverse every directory
    above ``path``: the first one that others cannot enter (no o+x), else None."""
    if os.geteuid() != 0:
        return None
    for d in [path, *path.parents]:
        try:
            if not d.stat().st_mode & 0o001:
                return d
        except OSError:
            return d
    return None


def prepare_dataset(root: Path):
    """The data set at ``root`` as it is if valid and complete (its nginx map added if missing),
    else the default one made there."""
    index = ds.read_index(root)
    if index is None or not ds.is_complete(index):
        print(f"creating the data set in {root} (uwsgi-layouts dataset)", flush=True)
        try:
            index, _ = ds.ensure_dataset(root)
        except ds.DatasetError as exc:
            raise BadArgument(f"data_dir: {exc}") from None
    elif ds.ensure_map(index):  # a data set made before the nginx map existed
        print(f"wrote the nginx map of the data set in {root}", flush=True)
    blocked = unreachable_parent(index.files_dir)
    if blocked is not None:
        raise BadArgument(f"data_dir: {blocked} is not enterable by others (mode "
                          f"{blocked.stat().st_mode & 0o777:o}), so the stack's nginx workers cannot read the "
                          f"data set: chmod o+x {blocked}, or use --data-dir under /tmp")
    return index


def dataset_facts(index) -> dict:
    """What a report says about the data set: sizes, where, on which filesystem."""
    return {**index.params(), "total_bytes": index.total_bytes, "root": str(index.root),
            "fs_type": ds.fs_type(index.root), "block_device": ds.disk_read_bytes(index.files_dir) is not None}


def tool_main(build_parser, run, argv: list[str] | None = None) -> int:
    """A tool's entry point: parse ``argv`` (default: the command line), run, and a BadArgument
    becomes its one line on stderr and exit 2."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
