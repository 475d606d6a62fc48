"""Network namespaces: several "machines" on one, for multi-host tests and benchmarks.

``Net(hosts=N)`` (a context manager; root and iproute2's ``ip`` needed) makes one namespace for
the front and one per app host, each with a veth pair whose outer end is a port of one bridge
in this (the root) namespace, which holds the bridge's first address, so wrk and the tests
reach the front (and the hosts) from here. The addresses come from one /24 of 198.18.0.0/15
(RFC 2544's benchmarking range), chosen only after ``ip -4 addr`` and ``ip -4 route`` show no
overlap. No namespace has a default route and nothing does NAT, so no packet leaves the bridge.

Ownership: every name carries a random run id (parallel runs never collide), and a state file
in /run/ul-netns/ records the owner's pid and every name *before* anything is made. ``close``
(``with`` exits, exceptions, Ctrl-C, and SIGTERM, which ``Net`` turns into SystemExit while it
is open) kills whatever still runs in the namespaces and removes them, the bridge and the file.
A run that died harder (SIGKILL) leaves its state file; the next ``Net`` removes exactly the
names recorded there once that pid is gone (``clean_stale``), nothing else.

While a ``Net`` is open its subnet is marked isolated (``deploy.machine``: the only place
plain uwsgi may go off loopback); stepping into its namespaces is ``deploy.machine``'s too.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.machine import NETNS_DIR, mark_isolated, unmark_isolated
from uwsgi_layouts.deploy.run.owners import dead_owners, state_lock, write_state
from uwsgi_layouts.deploy.run.stack import Placement

STATE_DIR = Path("/run/ul-netns")
RANGE = ipaddress.IPv4Network("198.18.0.0/15")
NS_PREFIX = "ulns-"
BRIDGE_PREFIX = "ulbr"
VETH_PREFIX = "ulv"
GATEWAY_HOST, FRONT_HOST, FIRST_APP_HOST = 1, 2, 11
MAX_HOSTS = 64


class NetnsError(RuntimeError):
    """A namespace could not be made or used."""


def ip_binary() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if Path(p).exists()),
                                      None)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None. Only the lack of root, of
    iproute2 or of kernel support counts: any other failure is an error, never a reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if ip_binary() is None:
        return "network namespaces need iproute2's `ip` (apt-get install iproute2)"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    return None


def ip(*args: str, check: bool = True, json_out: bool = False):
    binary = ip_binary()
    if binary is None:
        raise NetnsError("iproute2's `ip` is not installed (apt-get install iproute2)")
    cmd = [binary, *(["-j"] if json_out else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd[1:])}` failed: {proc.stderr.strip() or proc.returncode}")
    if json_out:
        return json.loads(proc.stdout or "[]")
    return proc


# --- the topology ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    role: str  # "front" or "h1", "h2", ...
    netns: str
    address: str
    veth: str  # its outer end, a port of the bridge (set it down and the node is unreachable)


def _addresses_and_routes() -> list[ipaddress.IPv4Network]:
    nets = []
    for entry in ip("-4", "addr", json_out=True):
        for info in entry.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in ip("-4", "route", "show", "table", "all", json_out=True):
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                continue
    return nets


def free_subnet(in_use: list[ipaddress.IPv4Network], rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 of RANGE that overlaps no address or route in use here."""
    candidates = [n for n in RANGE.subnets(new_prefix=24) if not any(n.overlaps(u) for u in in_use)]
    if not candidates:
        clash = next((u for u in in_use if u.overlaps(RANGE)), None)
        raise NetnsError(f"{RANGE} is in use here ({clash}): no isolated test network can be made")
    return rng.choice(candidates)


def _kill_inside(name: str) -> None:
    proc = ip("netns", "pids", name, check=False)
    for text in proc.stdout.split():
        try:
            os.kill(int(text), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            continue


def _teardown(namespaces: list[str], bridge: str) -> None:
    """Remove what a state file names; each step tolerates what is already gone."""
    for name in namespaces:
        if (NETNS_DIR / name).exists():
            _kill_inside(name)
            ip("netns", "del", name, check=False)  # takes its veth end, so the pair goes too
    if bridge and Path(f"/sys/class/net/{bridge}").exists():
        ip("link", "del", bridge, check=False)


NAME_RE = re.compile(rf"^{NS_PREFIX}(?P<id>[0-9a-f]{{6}})-(front|h\d+)$")
BRIDGE_RE = re.compile(rf"^{BRIDGE_PREFIX}(?P<id>[0-9a-f]{{6}})$")


def _locked():
    """This project's namespace lock: runs pick their /24 and clean up stale runs one at a time."""
    return state_lock(STATE_DIR)


def clean_stale() -> list[str]:
    """``_clean_stale`` under the lock."""
    with _locked():
        return _clean_stale()


def _clean_stale() -> list[str]:
    """Remove the namespaces and bridges of runs whose owner died (recorded in their state
    files); then those of this project's exact names that no state file claims and nothing runs
    in (a state directory lost with its owner). Return the run ids cleaned."""
    cleaned = []
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    for path, state in dead_owners(STATE_DIR):
        names = [n for n in state.get("namespaces", []) if n.startswith(NS_PREFIX + state.get("id", "?"))]
        bridge = state.get("bridge", "")
        _teardown(names, bridge if bridge.startswith(BRIDGE_PREFIX) else "")
        path.unlink(missing_ok=True)
        cleaned.append(state.get("id", path.stem))
    claimed = {p.stem for p in STATE_DIR.glob("*.json")}
    for name in existing():
        m = NAME_RE.match(name)
        if m and m["id"] not in claimed and not ip("netns", "pids", name, check=False).stdout.split():
            ip("netns", "del", name, check=False)
            cleaned.append(m["id"])
    for link in ip("link", "show", "type", "bridge", json_out=True):
        m = BRIDGE_RE.match(link.get("ifname", ""))
        if m and m["id"] not in claimed and not any(
                other.get("master") == link["ifname"] for other in ip("link", "show", json_out=True)):
            ip("link", "del", link["ifname"], check=False)
            cleaned.append(m["id"])
    return sorted(set(cleaned))


@dataclass
class Net:
    """One front and ``hosts`` app hosts, each in its own namespace, on one bridge."""

    hosts: int = 2
    front: Node | None = field(default=None, init=False)
    app_hosts: list[Node] = field(default_factory=list, init=False)
    subnet: ipaddress.IPv4Network | None = field(default=None, init=False)
    gateway: str = field(default="", init=False)  # this namespace's address on the bridge
    run_id: str = field(default="", init=False)
    _state: Path | None = field(default=None, init=False)
    _previous_sigterm: object = field(default=None, init=False)

    def __post_init__(self):
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise NetnsError(f"hosts must be in 1..{MAX_HOSTS}, got {self.hosts}")

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.run_id}"

    @property
    def nodes(self) -> list[Node]:
        return ([self.front] if self.front else []) + self.app_hosts

    def node(self, address: str) -> Node:
        return next(n for n in self.nodes if n.address == address)

    @property
    def host_addresses(self) -> tuple[str, ...]:
        return tuple(n.address for n in self.app_hosts)

    def placement(self) -> Placement:
        return Placement(front=self.front.netns, hosts={n.address: n.netns for n in self.app_hosts})

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "Net":
        reason = unavailable()
        if reason:
            raise NetnsError(reason)
        self._catch_sigterm()
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _catch_sigterm(self) -> None:
        # SIGTERM's default action would skip every `finally`: make it an exit that unwinds.
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def open(self) -> None:
        rng = random.Random(secrets.randbits(64))
        with _locked():  # two runs must not pick the same /24, nor clean up each other's
            _clean_stale()
            self.run_id = secrets.token_hex(3)
            self.subnet = free_subnet(_addresses_and_routes(), rng)
            base = self.subnet.network_address
            roles = [("front", FRONT_HOST)] + [(f"h{i + 1}", FIRST_APP_HOST + i) for i in range(self.hosts)]
            planned = [Node(role, f"{NS_PREFIX}{self.run_id}-{role}", str(base + offset),
                            f"{VETH_PREFIX}{self.run_id}{role}") for role, offset in roles]
            self._write_state([n.netns for n in planned])
            self.gateway = str(base + GATEWAY_HOST)
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        mark_isolated(self.subnet)
        for node in planned:
            ip("netns", "add", node.netns)
            ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            ip("link", "set", node.veth, "master", self.bridge, "up")
            ip("-n", node.netns, "addr", "add", f"{node.address}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", node.netns, "link", "set", "eth0", "up")
            ip("-n", node.netns, "link", "set", "lo", "up")
            if node.role == "front":
                self.front = node
            else:
                self.app_hosts.append(node)
        self.wait_reachable()

    def wait_reachable(self, timeout: float = 10.0) -> None:
        """Poll until every node's address answers on the bridge (a TCP connect to a closed port
        is refused: the kernel answered), so the first request does not race link setup."""
        for node in self.nodes:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    socket.create_connection((node.address, 9), timeout=1).close()
                    break
                except ConnectionRefusedError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise NetnsError(f"{node.role} ({node.address}) does not answer on {self.bridge}") from None
                    time.sleep(0.05)  # polling interval while the link comes up

    def _write_state(self, namespaces: list[str]) -> None:
        self._state = write_state(STATE_DIR, self.run_id, namespaces=namespaces, bridge=self.bridge,
                                  subnet=str(self.subnet))

    def close(self) -> None:
        if self._state is not None:
            try:
                state = json.loads(self._state.read_text())
            except (OSError, ValueError):
                state = {"namespaces": [n.netns for n in self.nodes], "bridge": self.bridge}
            _teardown(state["namespaces"], state["bridge"])
            self._state.unlink(missing_ok=True)
            self._state = None
        unmark_isolated(self.subnet)
        self.front, self.app_hosts = None, []
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # --- faults -----------------------------------------------------------------------------

    def set_link(self, address: str, up: bool) -> None:
        """Take a node off the bridge (its packets are dropped: connects to it time out) or back."""
        ip("link", "set", self.node(address).veth, "up" if up else "down")

    def pin_neighbor(self, address: str, pinned: bool = True) -> None:
        """Make the front keep the node's MAC address (a permanent neighbor entry) or forget it.
        Pinned, a node off the bridge never becomes "no route to host" (which fails connects at
        once): every connect to it waits for its timeout, as for a host behind a router."""
        front = self.front.netns
        if not pinned:
            ip("-n", front, "neigh", "del", address, "dev", "eth0", check=False)
            return
        mac = ip("-n", self.node(address).netns, "link", "show", "eth0", json_out=True)[0]["address"]
        ip("-n", front, "neigh", "replace", address, "lladdr", mac, "dev", "eth0", "nud", "permanent")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signal.SIGTERM)


def existing() -> list[str]:
    """Namespaces of this project that exist now (for leak checks)."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(NS_PREFIX))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
