"""Socket strategies: which server runs the app, how its workers get requests, and how nginx
balances them.

A strategy names its app server (uWSGI, or a peer: gunicorn, granian; deploy/render/servers.py says
how each is configured and read back, deploy/run/servers.py how it is started and watched) and decides two lists:
  * the server's sockets, each with the workers that accept on it (None = every worker);
  * the nginx upstream servers, one per socket nginx should use, with their parameters.
Addresses (TCP port or unix path) come from the layout, so a strategy never deals with them.
Adding a strategy = one class here + registering it in STRATEGIES; the templates are generic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from uwsgi_layouts.deploy.model.errors import LayoutError


@dataclass(frozen=True)
class SocketPlan:
    workers: tuple[int, ...] | None  # 1-based uWSGI worker ids; None = all workers accept
    role: str  # "shared" | "worker" | "overflow": only used in comments and reports


@dataclass(frozen=True)
class ServerPlan:
    socket_index: int  # 0-based, the position of the socket line in uwsgi.ini
    params: tuple[str, ...] = ()  # nginx `server` parameters, e.g. ("max_conns=4",)


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    # The program that runs the app: one of SERVERS.
    server: str = "uwsgi"
    # Layout options only this kind of strategy takes (e.g. ``2x4-gunicorn@reuse_port=on``);
    # deploy/model/layout.py refuses them on any other strategy.
    options: frozenset[str] = frozenset()
    # Variants (``option=value,...`` after the ``@``) a search tries beside the plain strategy:
    # settings whose best value depends on the workload (bench tune, the peers comparison).
    variants: tuple[str, ...] = ()
    # Extra uWSGI options: (key, value, why) triples rendered verbatim.
    uwsgi_options: tuple[tuple[str, str, str], ...] = ()
    # nginx balancing directive inside `upstream`, or "" for nginx's default round robin.
    balancer: str = ""
    balancer_why: str = ""
    # True when every worker must own exactly one socket and every socket one worker.
    one_socket_per_worker: bool = False
    # True when nginx must share per-server counters across its workers even with one
    # worker (max_conns is only exact with a zone).
    needs_zone: bool = False
    notes: tuple[str, ...] = field(default=())

    def sockets(self, processes: int, threads: int) -> list[SocketPlan]:
        raise NotImplementedError

    def servers(self, sockets: list[SocketPlan], threads: int) -> list[ServerPlan]:
        return [ServerPlan(i) for i in range(len(sockets))]


SERVERS = ("uwsgi", "gunicorn", "granian")


class Shared(Strategy):
    def sockets(self, processes, threads):
        return [SocketPlan(workers=None, role="shared")]


class Mapped(Strategy):
    def sockets(self, processes, threads):
        # Socket i is served by worker i+1: uWSGI numbers sockets from 0 and workers from 1.
        return [SocketPlan(workers=(i + 1,), role="worker") for i in range(processes)]


class Overflow(Strategy):
    def sockets(self, processes, threads):
        own = [SocketPlan(workers=(i + 1,), role="worker") for i in range(processes)]
        # The last socket has no map-socket line, so every worker also accepts on it.
        return own + [SocketPlan(workers=None, role="overflow")]

    def servers(self, sockets, threads):
        # Never queue more on a worker than it has threads; the excess goes to the
        # backup server, the shared socket, which any worker's free thread drains.
        own = [ServerPlan(i, (f"max_conns={threads}",)) for i, s in enumerate(sockets) if s.role == "worker"]
        shared = [ServerPlan(i, ("backup",)) for i, s in enumerate(sockets) if s.role == "overflow"]
        return own + shared


class Peer(Strategy):
    """Another WSGI server behind the same nginx: one address for all its workers (gunicorn
    shares one socket, or with reuse_port each worker binds the same port; granian binds one
    SO_REUSEPORT listener per worker). Which worker takes a connection is the server's (or the
    kernel's) business, so nginx has one server to send to."""

    def sockets(self, processes, threads):
        return [SocketPlan(workers=None, role="shared")]


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Shared(
            name="shared",
            summary="every worker accepts on one shared socket (the article's baseline)",
        ),
        Shared(
            name="thunder",
            summary="one shared socket, accept() serialised with thunder-lock",
            uwsgi_options=(
                ("thunder-lock", "true", "serialise accept() across workers (does not fix balancing: see SEEDS.md)"),
            ),
            options=frozenset({"lock_engine"}),
        ),
        Mapped(
            name="mapped",
            summary="one socket per worker (map-socket), nginx balances with least_conn",
            balancer="least_conn",
            balancer_why=(
                "least_conn sends each request to the worker with the fewest requests in flight, "
                "so a busy worker's GIL is not contended while another idles"
            ),
            one_socket_per_worker=True,
        ),
        Overflow(
            name="overflow",
            summary="one socket per worker capped at T in flight (max_conns), excess to a shared backup socket",
            balancer="least_conn",
            balancer_why=(
                "least_conn over per-worker sockets as in `mapped`; max_conns=T stops nginx from queueing "
                "behind a worker whose threads are all busy (an open-source stand-in for nginx Plus `queue`)"
            ),
            needs_zone=True,
        ),
        Peer(
            name="gunicorn",
            summary="gunicorn: P workers on one socket, gthread with T threads each (the sync worker when T = 1)",
            server="gunicorn",
            options=frozenset({"reuse_port", "keepalive"}),
            # Keep-alive pins nginx's pooled connections to the gthread worker that accepted them
            # (one worker's worth of throughput on GIL-bound work) but saves a connect per request.
            variants=("keepalive=off",),
        ),
        Peer(
            name="granian",
            summary="granian (WSGI): P workers with T blocking threads each, one SO_REUSEPORT listener per worker",
            server="granian",
            options=frozenset({"keepalive"}),
            variants=("keepalive=off",),
        ),
    )
}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise LayoutError("strategy", f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}") from None
