"""Named request mixes: the healthy workload, and optionally a second load beside it.

A stall stands for an external API that hangs: some clients (``clients``) send requests
that only wait ``wait_ms``, back to back, while the healthy clients run the normal mix; or
a ``fraction`` of the healthy clients' own requests stall. Stalled clients run in a second
wrk process, so healthy and stalled latencies are measured separately.

The nginx scenarios (``FAMILIES``) request files of the data set (``bench.dataset``) instead
of the app's query: ``files`` wraps the four routes of one file set (``files-accel``:
the app looks the id up and nginx sends the bytes through X-Accel-Redirect; ``files-app``:
Python streams them; ``files-static``: nginx alone, by path; ``files-nginx``: nginx alone,
by id, through a map of the index), ``files-mixed`` adds one hot-file client beside random
cold files (cache evicted before each cell), and ``reuseport``
hammers one small static file through many connections to see how nginx workers share them.
Each family names the layouts and levels it is compared on by default.

The user's traffic (``bench.load.traffic.Mix``: --request, --requests, --access-log) replaces a
scenario's healthy request: ``with_mix``. ``traffic`` is the steady scenario of a mix alone; a
stall scenario with a mix sends the mix plus its stalled clients (``bench.subject`` says which
combinations make sense).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from urllib.parse import urlencode

from uwsgi_layouts.bench.load.traffic import Mix

FILE_MODES = ("accel", "app", "static", "nginx", "hot")  # bench.load.files.MODES
FILE_WHICH = ("small", "large", "all")


@dataclass(frozen=True)
class Workload:
    rounds: int = 5
    fib: int = 25
    io_ms: int = 10

    @property
    def query(self) -> str:
        return urlencode({"rounds": self.rounds, "fib": self.fib, "io_ms": self.io_ms})

    def with_overrides(self, **kw) -> "Workload":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@dataclass(frozen=True)
class Stall:
    clients: int | None = None  # None: T, enough to tie up one worker's threads
    wait_ms: int = 3000
    fraction: float = 0.0  # instead of clients: share of healthy requests that stall

    @property
    def query(self) -> str:
        return urlencode({"rounds": 1, "fib": 0, "io_ms": self.wait_ms})


@dataclass(frozen=True)
class FileLoad:
    """Requests for data-set files (random ids from a list, ``bench/load/lua/random_files.lua``)
    instead of the app's fixed query."""

    mode: str = "accel"  # accel | app | static | nginx | hot (one file): see bench.load.files
    which: str = "small"  # small | large | all
    # Share of requests that ask for a large file (the list repeats large paths to get it);
    # 0 = as many as their count in the list gives.
    large_share: float = 0.0
    hot_clients: int = 0  # a second wrk on the hot file (nginx static), latencies in extra
    cold_cache: bool = False  # evict the data set's pages before every cell

    def __post_init__(self):
        if self.mode not in FILE_MODES:
            raise ValueError(f"mode: must be one of {', '.join(FILE_MODES)}, got {self.mode!r}")
        if self.which not in FILE_WHICH:
            raise ValueError(f"which: must be one of {', '.join(FILE_WHICH)}, got {self.which!r}")
        if not 0 <= self.large_share < 1:
            raise ValueError(f"large_share: must be in 0..1, got {self.large_share!r}")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: Workload
    stall: Stall | None = None
    files: FileLoad | None = None
    # Record connections and CPU per nginx worker (how evenly they share the load).
    nginx_spread: bool = False
    # The user's requests, sent instead of the workload's query (None: the workload's query).
    mix: Mix | None = None
    # Only meaningful with a mix (the ``traffic`` scenario).
    needs_mix: bool = False

    @property
    def family(self) -> str:
        return family_of(self.name)

    def resolved(self, threads: int, **overrides) -> "Scenario":
        """Apply CLI overrides and fill defaults that depend on the layout (T)."""
        workload = self.workload.with_overrides(
            rounds=overrides.get("rounds"), fib=overrides.get("fib"), io_ms=overrides.get("io_ms"))
        stall = self.stall
        if stall is not None:
            fraction = overrides.get("stall_fraction")
            clients = overrides.get("stall_clients")
            stall = replace(
                stall,
                wait_ms=overrides.get("stall_ms") or stall.wait_ms,
                fraction=fraction if fraction is not None else stall.fraction,
                clients=0 if fraction else (clients if clients is not None else (stall.clients or threads)),
            )
        files = self.files
        if files is not None:
            hot = overrides.get("hot_clients")
            cold = overrides.get("cold_cache")
            share = overrides.get("large_share")
            files = replace(
                files,
                hot_clients=hot if hot is not None and files.hot_clients else files.hot_clients,
                cold_cache=cold if cold is not None and files.mode != "hot" else files.cold_cache,
                large_share=share if share is not None and files.which == "all" else files.large_share,
            )
        return replace(self, workload=workload, stall=stall, files=files)

    def with_mix(self, mix: Mix) -> "Scenario":
        """This scenario with ``mix`` as its healthy requests."""
        return replace(self, mix=mix)

    def to_dict(self) -> dict:
        if self.files is not None:  # the app's query is not used
            data = {"description": self.description, "files": asdict(self.files)}
        elif self.mix is not None:  # neither is it with the user's requests
            data = {"description": self.description, "traffic": self.mix.to_dict()}
        else:
            data = {"description": self.description, **asdict(self.workload), "query": self.workload.query}
        if self.stall is not None:
            data["stall"] = asdict(self.stall) | {"query": self.stall.query}
        if self.nginx_spread:
            data["nginx_spread"] = True
        return data


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("article", "the article's request: 5 x (sleep 10 ms + fib(25)), about half of it holding the GIL",
                 Workload(5, 25, 10)),
        Scenario("hello", "a trivial answer (rounds=0: no work at all): what the server itself costs per request",
                 Workload(0, 0, 0)),
        Scenario("traffic", "your requests (--request, --requests or --access-log), no other load", Workload(),
                 needs_mix=True),
        Scenario("io-heavy", "mostly waiting on an external API: 5 x (sleep 40 ms + fib(15))", Workload(5, 15, 40)),
        Scenario("cpu-heavy", "mostly CPU: 5 x fib(27), no waiting", Workload(5, 27, 0)),
        Scenario("overhead", "a request that does almost nothing (1 round, no sleep, fib(0)): what nginx, the "
                 "protocol and TLS cost per request", Workload(1, 0, 0)),
        Scenario("stall", "the article's mix while T extra clients hit an external API that hangs 3 s",
                 Workload(5, 25, 10), Stall()),
        Scenario("stall-io", "the I/O-heavy mix while T extra clients hit an external API that hangs 3 s",
                 Workload(5, 15, 40), Stall()),
        Scenario("files-accel", "random small files: the app looks the id up, nginx sends the bytes "
                 "(X-Accel-Redirect to an internal location)", Workload(), files=FileLoad("accel")),
        Scenario("files-app", "random small files streamed by the app itself (?via=app)", Workload(),
                 files=FileLoad("app")),
        Scenario("files-static", "random small files served by nginx alone (/static/, no app)", Workload(),
                 files=FileLoad("static")),
        Scenario("files-nginx", "random small files by id, nginx alone: it looks the id up in a map of the "
                 "index and sends the file (/nfiles/<id>, no app)", Workload(), files=FileLoad("nginx")),
        Scenario("files-mixed", "random small and large files (nginx static, page cache evicted before each "
                 "cell) while hot-file clients ask for one cached file", Workload(),
                 files=FileLoad("static", which="all", large_share=0.02, hot_clients=4, cold_cache=True)),
        Scenario("reuseport", "one small cached file (nginx static) through many keep-alive connections: "
                 "how nginx workers share connections", Workload(), files=FileLoad("hot"), nginx_spread=True),
    )
}

# Names that stand for several scenarios.
ALIASES = {"files": ("files-accel", "files-app", "files-static", "files-nginx")}

# Per family: default layouts ({p}, {t} filled in) and connection levels when none are given.
FAMILIES = {
    "files": {"layouts": ("{p}x{t}-mapped",), "levels": (8, 32)},
    # aio threads moves blocking reads off nginx's event loop, open_file_cache skips open():
    # each alone and both (Cloudflare's lesson: both block).
    "files-mixed": {"layouts": ("{p}x{t}-mapped@aio=off", "{p}x{t}-mapped@aio=threads",
                                "{p}x{t}-mapped@aio=off,open_file_cache=on",
                                "{p}x{t}-mapped@aio=threads,open_file_cache=on"), "levels": (32,)},
    "reuseport": {"layouts": ("{p}x{t}-mapped@nginx_workers=2,reuseport=off",
                              "{p}x{t}-mapped@nginx_workers=2,reuseport=on"), "levels": (64,)},
}


def family_of(name: str) -> str:
    """``files`` for files-accel/-app/-static/-nginx, else the name if it is a family, else ""."""
    if name in ALIASES["files"]:
        return "files"
    return name if name in FAMILIES else ""


def expand(names) -> tuple[str, ...]:
    """Scenario names with aliases expanded, in order, without repeats."""
    out: list[str] = []
    for name in names:
        out.extend(ALIASES.get(name, (name,)))
    return tuple(dict.fromkeys(out))


def needs_dataset(names) -> bool:
    return any(SCENARIOS[n].files is not None for n in names if n in SCENARIOS)


def family_defaults(names, processes: int, threads: int) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """Default (layouts, levels) when every scenario belongs to an nginx family, else None."""
    families = list(dict.fromkeys(family_of(n) for n in names))
    if not families or "" in families:
        return None
    layouts = [x.format(p=processes, t=threads) for f in families for x in FAMILIES[f]["layouts"]]
    levels = sorted({lv for f in families for lv in FAMILIES[f]["levels"]})
    return tuple(dict.fromkeys(layouts)), tuple(levels)
