"""Measure one layout: start its stack once, warm up, load it at each level, stop it.

Per cell: wrk's figures, the per-worker request counts (uWSGI stats server, delta over
the cell), and the CPU seconds of the uWSGI tree, the nginx tree and wrk. File scenarios
also record, in ``extra``, the bytes the data set's block device read during the cell,
the page-cache residency before and after (cold-cache cells are evicted first), the hot
file's latencies, and for ``nginx_spread`` scenarios the connections and CPU of each nginx
worker. From wrk's figures and the CPU come
two bounds on throughput and the efficiency = throughput / the smaller bound:
  * capacity: cores / CPU-seconds per request (all three share the machine's cores);
  * closed loop: connections / the latency of one request alone (wrk -c1 while warming up).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import dataset as ds
from bench.files import RANDOM_FILES_LUA, request_paths, weighted_paths, write_lines
from bench.results import Cell
from bench.scenarios import Scenario
from bench.wrk import LUA_REPORT, WrkProcess, run_wrks
from deploy.layout import Layout, parse_variant
from deploy.ports import free_consecutive_ports
from deploy.render import write_layout
from deploy.stack import Stack


@dataclass(frozen=True)
class Ports:
    listen: int
    stats: int
    base: int  # first uWSGI socket port; the next `span` ports are free too


def find_free_ports(span: int) -> Ports:
    """Free ports on 127.0.0.1 for nginx, the stats server and ``span`` uWSGI sockets."""
    listen, stats, *sockets = free_consecutive_ports(span + 2, 18000, 60000)
    return Ports(listen=listen, stats=stats, base=sockets[0])


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU of a process and its live descendants (threads included)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def worker_requests(stats: dict) -> dict[str, int]:
    """Requests served so far per uWSGI worker id, from the stats server's JSON document."""
    return {str(w["id"]): int(w["requests"]) for w in stats["workers"]}


@dataclass
class Snapshot:
    workers: dict[str, int]
    uwsgi_cpu: float
    nginx_cpu: float

    @classmethod
    def take(cls, stack: Stack) -> "Snapshot":
        return cls(worker_requests(stack.stats()), tree_cpu_seconds(stack.pids["uwsgi"]),
                   tree_cpu_seconds(stack.pids["nginx"]))


def nginx_workers(master_pid: int) -> list[psutil.Process]:
    """The nginx master's worker processes (its children)."""
    try:
        return psutil.Process(master_pid).children()
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return 0.0


def client_connections(proc: psutil.Process, port: int) -> int:
    """Established TCP connections ``proc`` holds on local ``port`` (accepted clients)."""
    try:
        return sum(1 for c in proc.net_connections(kind="tcp")
                   if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def spread_extra(conns: list[int], cpu: list[float]) -> dict:
    """Per-nginx-worker figures for a cell's ``extra``: connections (the busiest sample) and
    CPU seconds, each sorted high to low, and the busiest worker's share of each."""
    conns, cpu = sorted(conns, reverse=True), sorted((round(c, 4) for c in cpu), reverse=True)
    return {
        "nginx_workers": len(conns),
        "nginx_worker_conns": conns,
        "nginx_worker_cpu_s": cpu,
        "nginx_conn_max_share": conns[0] / sum(conns) if conns and sum(conns) else 0.0,
        "nginx_cpu_max_share": cpu[0] / sum(cpu) if cpu and sum(cpu) else 0.0,
    }


def fraction_script(directory: Path, healthy_path: str, stall_path: str, fraction: float) -> Path:
    """A wrk script that sends every Nth request to the stalled path (deterministic, so
    repeats are comparable), plus the JSON done() hook."""
    every = max(2, round(1 / fraction))
    path = directory / f"stall-every-{every}.lua"
    path.write_text(
        f"-- every {every}th request of each wrk thread stalls ({fraction:.1%} of requests)\n"
        f"local n = 0\n"
        f"request = function()\n"
        f"  n = n + 1\n"
        f"  if n % {every} == 0 then return wrk.format(nil, {stall_path!r}) end\n"
        f"  return wrk.format(nil, {healthy_path!r})\n"
        f"end\n" + LUA_REPORT.read_text()
    )
    return path


class LiveRunner:
    """Runs blocks for real. ``run_block`` is the unit the sweep interleaves: one stack
    start, a warm-up, then every scenario at every level, then stop."""

    SPREAD_SAMPLE_S = 0.25  # how often per-nginx-worker connections are counted during a cell

    def __init__(self, work_dir: Path, raw_dir: Path, ports: Ports, scenarios: dict[str, Scenario],
                 duration: float, warmup: float, timeout: float, layout_options: dict | None = None):
        self.work_dir, self.raw_dir, self.ports = work_dir, raw_dir, ports
        self.scenarios = scenarios
        self.duration, self.warmup, self.timeout = duration, warmup, timeout
        self.layout_options = layout_options or {}
        self.cores = os.cpu_count() or 1
        self._index: ds.Index | None = None
        self._lists: dict[str, Path] = {}

    def layout(self, spec: str) -> Layout:
        """``spec`` may carry options (``2x4-mapped@aio=threads``); it stays the cells' label."""
        run_dir = self.work_dir / spec.replace("@", "_").replace(",", "_").replace("=", "-")
        return parse_variant(
            spec, run_dir=str(run_dir), listen=f"127.0.0.1:{self.ports.listen}",
            stats_port=self.ports.stats, base_port=self.ports.base, **self.layout_options,
        )

    # --- file scenarios -----------------------------------------------------------------

    @property
    def index(self) -> ds.Index:
        if self._index is None:
            root = self.layout_options.get("data_dir")
            index = ds.read_index(Path(root)) if root else None
            if index is None:
                raise ds.DatasetError("data_dir", f"no valid data set at {root!r}: run python -m bench.dataset")
            self._index = index
        return self._index

    def path_list(self, scenario: Scenario) -> Path:
        """The scenario's request list (written once per run)."""
        if scenario.name not in self._lists:
            f = scenario.files
            paths = weighted_paths(self.index, f.mode, f.which, f.large_share)
            self._lists[scenario.name] = write_lines(self.work_dir / "lists" / f"{scenario.name}.txt", paths)
        return self._lists[scenario.name]

    def hot_url(self, layout: Layout) -> str:
        return f"http://{layout.listen}{request_paths(self.index, 'hot')[0]}"

    def main_load(self, layout: Layout, scenario: Scenario, connections: int, duration: float, seed: int = 1,
                  timeout: float | None = None) -> WrkProcess:
        """The scenario's own load: the app's query, or random paths from its file list."""
        timeout = self.timeout if timeout is None else timeout
        if scenario.files is not None:
            return WrkProcess(layout.url, connections, duration, timeout_s=timeout, script=RANDOM_FILES_LUA,
                              script_args=[str(self.path_list(scenario)), str(seed)])
        return WrkProcess(f"{layout.url}?{scenario.workload.query}", connections, duration, timeout_s=timeout)

    # --- blocks and cells ---------------------------------------------------------------

    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str], on_cell=None) -> list[Cell]:
        layout = self.layout(spec)
        write_layout(layout, layout.run_dir)
        cells = []
        with Stack(layout) as stack:
            for name in scenarios:
                scenario = self.scenarios[name]
                if scenario.files is not None and not scenario.files.cold_cache:
                    ds.warm(self.index.paths())  # a warm-cache scenario measures nginx and the app, not the disk
                # Warm-up doubles as the unloaded-latency probe: one connection, nothing queued.
                (probe,), _ = run_wrks(self.main_load(layout, scenario, 1, self.warmup, seed=repeat))
                self._save_raw(f"{name}-{layout.name}-warmup-r{repeat}", probe.raw)
                for level in levels:
                    cell = self.measure(stack, layout, scenario, level, repeat, probe.latency_ms.p50, label=spec)
                    stack.check_alive()
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
        return cells

    def _before_files(self, scenario: Scenario) -> dict:
        """Evict (cold cache) and note the residency and the disk's read counter."""
        state: dict = {}
        if scenario.files.cold_cache:
            state["evicted_mb"] = ds.evict(self.index.root) / 1e6
            hot = self.index.path(self.index.hot_id)
            ds.warm([hot])  # the hot file stays hot, as in the thread-pool article
            state["resident_before"] = self._resident()
        state["disk"] = ds.disk_read_bytes(self.index.files_dir)
        return state

    def _after_files(self, scenario: Scenario, state: dict) -> dict:
        extra: dict = {}
        disk = ds.disk_read_bytes(self.index.files_dir)
        if disk is not None and state["disk"] is not None:
            extra["disk_read_mb"] = max(0, disk - state["disk"]) / 1e6
        if scenario.files.cold_cache:
            extra["evicted_mb"] = state["evicted_mb"]
            after = self._resident()
            if state["resident_before"] is not None and after is not None:
                extra["resident_before"] = state["resident_before"]
                extra["resident_after"] = after
        return extra

    def _resident(self) -> float | None:
        try:
            return ds.resident_fraction(self.index.paths())
        except ds.MincoreUnavailable:
            return None

    def _sample_spread(self, stack, layout: Layout, loads: list[WrkProcess]) -> list[int]:
        """While the loads run, count each nginx worker's client connections; keep the
        sample with the most connections in total (wrk opens its connections once)."""
        workers = nginx_workers(stack.pids["nginx"])
        best: list[int] = [0] * len(workers)
        deadline = time.monotonic() + max(w.limit for w in loads)
        while any(w.proc.poll() is None for w in loads) and time.monotonic() < deadline:
            sample = [client_connections(w, layout.listen_port) for w in workers]
            if sum(sample) > sum(best):
                best = sample
            time.sleep(self.SPREAD_SAMPLE_S)  # sampling interval while wrk runs, not a readiness wait
        return best

    def measure(self, stack, layout, scenario: Scenario, level: int, repeat: int, unloaded_ms: float,
                label: str = "") -> Cell:
        label = label or layout.name
        healthy_url = f"{layout.url}?{scenario.workload.query}"
        stall = scenario.stall
        files = scenario.files
        script_dir = Path(layout.run_dir)
        file_state = self._before_files(scenario) if files is not None else None
        workers = nginx_workers(stack.pids["nginx"]) if scenario.nginx_spread else []
        worker_cpu = [cpu_seconds(w) for w in workers]
        before = Snapshot.take(stack)
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if stall and stall.fraction:
            script = fraction_script(script_dir, f"/?{scenario.workload.query}", f"/?{stall.query}", stall.fraction)
            loads = [WrkProcess(healthy_url, level, self.duration, timeout_s=self.timeout + stall.wait_ms / 1000,
                                script=script)]
        else:
            loads = [self.main_load(layout, scenario, level, self.duration, seed=repeat)]
        if stall and stall.clients:
            # Stalled clients in their own wrk, so their latencies don't mix with the healthy ones.
            loads.append(WrkProcess(f"{layout.url}?{stall.query}", stall.clients, self.duration,
                                    timeout_s=self.timeout + stall.wait_ms / 1000))
        if files is not None and files.hot_clients:
            # The hot-file clients in their own wrk too: their latencies are the figure of interest.
            loads.append(WrkProcess(self.hot_url(layout), files.hot_clients, self.duration, timeout_s=self.timeout))
        conns = self._sample_spread(stack, layout, loads) if workers else []
        runs, wrk_cpu = run_wrks(*loads, rusage_before=rusage)
        after = Snapshot.take(stack)
        name = f"{scenario.name}-{label}-c{level}-r{repeat}".replace("@", "_").replace(",", "_").replace("=", "-")
        raw_name = self._save_raw(name, "\n".join(r.raw for r in runs))
        extra = {}
        if stall and stall.clients:
            s = runs[1]
            extra = {"stall_clients": stall.clients, "stalled_requests": s.requests,
                     "stalled_p50_ms": s.latency_ms.p50, "stalled_p99_ms": s.latency_ms.p99,
                     "stalled_max_ms": s.latency_ms.max, "stalled_errors": s.errors.total}
        elif stall and stall.fraction:
            extra = {"stall_fraction": stall.fraction}
        if files is not None:
            extra.update(self._after_files(scenario, file_state))
            if files.hot_clients:
                h = runs[-1]
                extra.update({"hot_clients": files.hot_clients, "hot_requests": h.requests, "hot_rps": h.rps,
                              "hot_p50_ms": h.latency_ms.p50, "hot_p99_ms": h.latency_ms.p99,
                              "hot_errors": h.errors.total})
        if workers:
            extra.update(spread_extra(conns, [max(0.0, cpu_seconds(w) - c) for w, c in zip(workers, worker_cpu,
                                                                                           strict=True)]))
        return self.make_cell(label, level, repeat, scenario.name, runs[0], wrk_cpu, before, after,
                              unloaded_ms, raw_name, extra)

    def make_cell(self, spec, level, repeat, scenario, run, wrk_cpu, before, after, unloaded_ms, raw_name,
                  extra=None) -> Cell:
        cpu = {
            "uwsgi": max(0.0, after.uwsgi_cpu - before.uwsgi_cpu),
            "nginx": max(0.0, after.nginx_cpu - before.nginx_cpu),
            "wrk": wrk_cpu,
        }
        # Stalled requests cost almost no CPU; counting only healthy ones keeps the bound honest.
        per_request = sum(cpu.values()) / run.requests if run.requests else 0.0
        capacity = self.cores / per_request if per_request else 0.0
        closed_loop = level / (unloaded_ms / 1000) if unloaded_ms else 0.0
        bounds = [b for b in (capacity, closed_loop) if b > 0]
        bound = min(bounds) if bounds else 0.0
        workers = {w: max(0, after.workers.get(w, 0) - before.workers.get(w, 0)) for w in after.workers}
        return Cell(
            layout=spec, concurrency=level, repeat=repeat, scenario=scenario,
            duration_s=run.duration_s, requests=run.requests, rps=run.rps,
            latency_ms=run.latency_ms, errors=run.errors, worker_requests=workers, cpu_s=cpu,
            unloaded_latency_ms=unloaded_ms, capacity_rps=capacity, closed_loop_rps=closed_loop,
            efficiency=run.rps / bound if bound else 0.0, raw_output=raw_name, extra=extra or {},
        )

    def _save_raw(self, name: str, text: str) -> str:
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        path = self.raw_dir / f"{name}.txt"
        path.write_text(text)
        return str(Path(self.raw_dir.name) / path.name)
