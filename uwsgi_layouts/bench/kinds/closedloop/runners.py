"""The runners that measure a block of cells (``LiveRunner``) or replay stored ones (``ReplayRunner``).

``LiveRunner.run_block`` starts one layout's stack once (``bench.stack.Lab``), warms it up,
loads it at each level (``bench.load.wrk``) and stops it. The app server is uWSGI or a peer
(gunicorn, granian): every cell is measured the same way, except where only uWSGI can say. Per
cell: wrk's figures, the per-worker request counts (uWSGI: its stats server, delta over the
cell; a peer has none: the answers wrk counted per ``X-Worker-Pid`` header, mapped to worker
numbers with ``Stack.worker_pids``; absent for an app without the header), and the CPU seconds
of the app server's tree (``cpu_s["app"]``), the nginx tree and wrk (``bench.observe``), the
requests in flight per worker sampled from the stats server while the load runs (``inflight``,
``--inflight-hz`` times a second; not for peers), wrk's latency histogram of the measured
requests (``histogram``), the answers per status class (``status``: report.lua's count) and,
right after the load, the memory of the app server's tree (PSS, USS, RSS; PSS per worker) and
of nginx (``memory``). A scenario with the user's requests
(``Scenario.mix``) sends them through a generated wrk script (``bench.load.traffic``), seeded with
the repeat number. File scenarios also record, in
``extra``, the bytes the data set's block device read during the cell, the page-cache
residency before and after (cold-cache cells are evicted first), the hot file's latencies,
and for ``nginx_spread`` scenarios the connections and CPU of each nginx worker. From wrk's
figures and the CPU come two bounds on throughput and the efficiency = throughput / the
smaller bound:
  * capacity: cores / CPU-seconds per request (all three share the machine's cores);
  * closed loop: connections / the latency of one request alone (wrk -c1 while warming up).
"""

from __future__ import annotations

import resource
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

from uwsgi_layouts.bench import dataset as ds
from uwsgi_layouts.bench.load.files import RANDOM_FILES_LUA, request_paths, weighted_paths, write_lines
from uwsgi_layouts.bench.load.scenarios import Scenario
from uwsgi_layouts.bench.load.traffic import Mix, write_mix_script
from uwsgi_layouts.bench.load.wrk import WrkProcess, fraction_script, run_wrks
from uwsgi_layouts.bench.observe import (
    Sampler,
    Snapshot,
    busiest_connections,
    cpu_seconds,
    inflight_summary,
    limit_record,
    nginx_workers,
    requests_by_worker,
    spread_extra,
    stack_memory,
)
from uwsgi_layouts.bench.results import Cell, Results
from uwsgi_layouts.bench.stack import Lab, dir_name
from uwsgi_layouts.deploy.machine import usable_cpus
from uwsgi_layouts.deploy.model import Layout, total_limits


def host_shares(before: Snapshot, after: Snapshot) -> dict:
    """With several app hosts: each host's share of the requests served during the cell
    (``host1_share``... in the order of the layout's hosts) and the busiest host's share."""
    served = [max(0, after.hosts[h] - before.hosts.get(h, 0)) for h in after.hosts]
    total = sum(served)
    if not total:
        return {}
    return {"hosts": len(served), "host_share_max": max(served) / total,
            **{f"host{i}_share": n / total for i, n in enumerate(served, 1)}}


class Runner(Protocol):
    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str],
                  on_cell: Callable[[Cell], None] | None = None,
                  durations: dict[int, float] | None = None) -> list[Cell]: ...

    def run_pair(self, specs: tuple[str, str], repeat: int, levels: list[int], scenarios: list[str],
                 on_cell: Callable[[Cell], None] | None = None,
                 durations: dict[str, dict[int, float]] | None = None) -> list[Cell]:
        """Both layouts' stacks up at once, each level measured on one then the other (``specs``'
        order), back to back: the two cells of a pair lie seconds apart instead of a block apart."""
        ...


class ReplayRunner:
    """Serves stored cells in place of measuring: the sweep, results and report logic run
    exactly as live, in milliseconds. Missing cells are an error, not invented."""

    def __init__(self, stored: Results):
        self.cells = {(c.scenario, *c.key): c for c in stored.cells}

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None, durations=None):
        out = []  # a stored cell keeps the duration it was measured with
        for scenario in scenarios:
            for level in levels:
                try:
                    cell = self.cells[(scenario, spec, level, repeat)]
                except KeyError:
                    raise ReplayError(f"replay: no stored {scenario} cell for {spec} at {level} connections, "
                                      f"repeat {repeat}") from None
                out.append(cell)
                if on_cell:
                    on_cell(cell)
        return out

    def run_pair(self, specs, repeat, levels, scenarios, on_cell=None, durations=None):
        """The stored cells in a paired block's order: per scenario and level, one layout then the other."""
        return [c for sc in scenarios for level in levels for spec in specs
                for c in self.run_block(spec, repeat, [level], [sc], on_cell)]


class ReplayError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class LiveRunner:
    """Runs blocks for real. ``run_block`` is the unit the sweep interleaves: one stack
    start, a warm-up, then every scenario at every level, then stop."""

    SPREAD_SAMPLE_S = 0.25  # how often per-nginx-worker connections are counted during a cell

    def __init__(self, lab: Lab, raw_dir: Path, scenarios: dict[str, Scenario],
                 duration: float, warmup: float, timeout: float, layout_options: dict | None = None,
                 inflight_hz: float = 25.0):
        self.lab, self.raw_dir = lab, raw_dir
        self.inflight_hz = inflight_hz
        self.scenarios = scenarios
        self.duration, self.warmup, self.timeout = duration, warmup, timeout
        self.layout_options = layout_options or {}
        self.cores = usable_cpus()  # a quota on this process (a pod) bounds what the three can share
        self._index: ds.Index | None = None
        self._lists: dict[str, Path] = {}
        self._mix_scripts: dict[Mix, Path] = {}

    # --- file scenarios -----------------------------------------------------------------

    @property
    def index(self) -> ds.Index:
        if self._index is None:
            root = self.layout_options.get("data_dir")
            index = ds.read_index(Path(root)) if root else None
            if index is None:
                raise ds.DatasetError("data_dir", f"no valid data set at {root!r}: run uwsgi-layouts dataset")
            self._index = index
        return self._index

    def path_list(self, scenario: Scenario) -> Path:
        """The scenario's request list (written once per run)."""
        if scenario.name not in self._lists:
            f = scenario.files
            paths = weighted_paths(self.index, f.mode, f.which, f.large_share)
            self._lists[scenario.name] = write_lines(self.lab.work_dir / "lists" / f"{scenario.name}.txt", paths)
        return self._lists[scenario.name]

    def hot_url(self, layout: Layout) -> str:
        return f"http://{layout.listen}{request_paths(self.index, 'hot')[0]}"

    def main_load(self, layout: Layout, scenario: Scenario, connections: int, duration: float, seed: int = 1,
                  timeout: float | None = None) -> WrkProcess:
        """The scenario's own load: the app's query, or random paths from its file list."""
        timeout = self.timeout if timeout is None else timeout
        if scenario.mix is not None:
            return WrkProcess(layout.url, connections, duration, timeout_s=timeout,
                              script=self.mix_script(scenario.mix), script_args=[str(seed)])
        if scenario.files is not None:
            return WrkProcess(layout.url, connections, duration, timeout_s=timeout, script=RANDOM_FILES_LUA,
                              script_args=[str(self.path_list(scenario)), str(seed)])
        return WrkProcess(f"{layout.url}?{scenario.workload.query}", connections, duration, timeout_s=timeout)

    def mix_script(self, mix: Mix) -> Path:
        """The wrk script sending the user's requests (written once per run)."""
        if mix not in self._mix_scripts:
            path = self.lab.work_dir / "traffic" / f"mix-{len(self._mix_scripts) + 1}.lua"
            self._mix_scripts[mix] = write_mix_script(path, mix)
        return self._mix_scripts[mix]

    # --- blocks and cells ---------------------------------------------------------------

    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str], on_cell=None,
                  durations: dict[int, float] | None = None) -> list[Cell]:
        """``spec`` may carry options (``2x4-mapped@aio=threads``); it stays the cells' label.
        ``durations``: level -> seconds of this block's cells (a key cell, a round added until
        decided), else the planned duration."""
        planned = self.duration
        try:
            return self._run_block(spec, repeat, levels, scenarios, on_cell, durations or {}, planned)
        finally:
            self.duration = planned

    def _run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str], on_cell,
                   durations: dict[int, float], planned: float) -> list[Cell]:
        cells = []
        with self.lab.stack(spec, name=dir_name(spec), **self.layout_options) as stack:
            layout = stack.layout
            for name in scenarios:
                scenario = self.scenarios[name]
                unloaded_ms = self._warm(layout, scenario, repeat)
                for level in levels:
                    self.duration = durations.get(level, planned)  # the cell's, and its sampler window
                    cell = self.measure(stack, layout, scenario, level, repeat, unloaded_ms, label=spec)
                    stack.check_alive()
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
        return cells

    def run_pair(self, specs: tuple[str, str], repeat: int, levels: list[int], scenarios: list[str], on_cell=None,
                 durations: dict[str, dict[int, float]] | None = None) -> list[Cell]:
        """Both stacks started (each its own ports and run directory) and warmed up, then each
        level measured on one and at once on the other: one stack idles while the other is
        loaded. ``durations``: layout -> level -> seconds."""
        planned = self.duration
        durations = durations or {}
        try:
            with ExitStack() as running:
                stacks = [running.enter_context(self.lab.stack(spec, name=dir_name(spec), **self.layout_options))
                          for spec in specs]
                return self._measure_pair(specs, stacks, repeat, levels, scenarios, on_cell, durations, planned)
        finally:
            self.duration = planned

    def _measure_pair(self, specs, stacks, repeat, levels, scenarios, on_cell, durations, planned) -> list[Cell]:
        cells = []
        for name in scenarios:
            scenario = self.scenarios[name]
            unloaded = [self._warm(stack.layout, scenario, repeat) for stack in stacks]
            for level in levels:
                for spec, stack, probe_ms in zip(specs, stacks, unloaded, strict=True):
                    self.duration = durations.get(spec, {}).get(level, planned)
                    cell = self.measure(stack, stack.layout, scenario, level, repeat, probe_ms, label=spec)
                    stack.check_alive()
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
        return cells

    def _warm(self, layout: Layout, scenario: Scenario, repeat: int) -> float:
        """The warm-up, which doubles as the unloaded-latency probe (one connection, nothing
        queued): its p50 in ms."""
        if scenario.files is not None and not scenario.files.cold_cache:
            ds.warm(self.index.paths())  # a warm-cache scenario measures nginx and the app, not the disk
        (probe,), _ = run_wrks(self.main_load(layout, scenario, 1, self.warmup, seed=repeat))
        self._save_raw(f"{scenario.name}-{layout.name}-warmup-r{repeat}", probe.raw)
        return probe.latency_ms.p50

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
        """Each nginx worker's client connections while the loads run (the busiest sample)."""
        return busiest_connections(nginx_workers(stack.pids["nginx"]), layout.listen_port,
                                   running=lambda: any(w.proc.poll() is None for w in loads),
                                   deadline=time.monotonic() + max(w.limit for w in loads),
                                   interval=self.SPREAD_SAMPLE_S)

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
        # The sampler first: started after wrk, its thread's start and first read (a good part of a
        # second on a busy machine) left the load's first moments out of the in-flight record.
        with self._inflight_sampler(layout) as sampler, ExitStack() as stopping:
            # Each wrk stopped and reaped on every way out from the moment it runs: a later one that
            # cannot start, or the spread sampler raising, must not leave it loading the stack.
            loads: list[WrkProcess] = []

            def started(load: WrkProcess) -> None:
                stopping.callback(load.stop)
                loads.append(load)

            if stall and stall.fraction:
                script = fraction_script(script_dir, f"/?{scenario.workload.query}", f"/?{stall.query}",
                                         stall.fraction)
                started(WrkProcess(healthy_url, level, self.duration,
                                   timeout_s=self.timeout + stall.wait_ms / 1000, script=script))
            else:
                started(self.main_load(layout, scenario, level, self.duration, seed=repeat))
            if stall and stall.clients:
                # Stalled clients in their own wrk, so their latencies don't mix with the healthy ones.
                started(WrkProcess(f"{layout.url}?{stall.query}", stall.clients, self.duration,
                                   timeout_s=self.timeout + stall.wait_ms / 1000))
            if files is not None and files.hot_clients:
                # The hot-file clients in their own wrk too: their latencies are the figure of interest.
                started(WrkProcess(self.hot_url(layout), files.hot_clients, self.duration, timeout_s=self.timeout))
            conns = self._sample_spread(stack, layout, loads) if workers else []
            runs, wrk_cpu = run_wrks(*loads, rusage_before=rusage)
        inflight = self._inflight_record(sampler, loads[0])
        memory = stack_memory(stack)  # right after the load, before the next cell
        after = Snapshot.take(stack)
        name = dir_name(f"{scenario.name}-{label}-c{level}-r{repeat}")
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
        # With replicas: every replica's cgroup summed, against every replica's quota.
        limit = limit_record(*total_limits(layout), before.limit, after.limit, after.t - before.t)
        return self.make_cell(label, level, repeat, scenario.name, runs[0], wrk_cpu, before, after,
                              unloaded_ms, raw_name, extra, inflight=inflight, histogram=runs[0].histogram,
                              status=runs[0].status, memory=memory, limit=limit)

    def _inflight_sampler(self, layout: Layout) -> Sampler:
        """The stats-server sampler of a cell (a context manager), to start before its load; it
        records nothing at ``inflight_hz`` 0 or without a stats server."""
        hz = self.inflight_hz
        # Peer servers (gunicorn, granian) have no stats server (``Layout.has_stats``): nothing to sample;
        # nor across several app hosts or replicas (one stats server each: the in-flight record is per stack).
        stats = layout.stats_address if hz and getattr(layout, "has_stats", True) and \
            not getattr(layout, "hosts", ()) and getattr(layout, "replicas", 1) == 1 else None
        return Sampler(stats, interval=1 / hz if hz else 1.0)

    def _inflight_record(self, sampler: Sampler, load: WrkProcess) -> dict:
        """The cell's ``inflight`` record over the load's own window (``bench.observe.inflight_summary``,
        plus the sampler's own CPU seconds); {} when the sampler recorded nothing."""
        start = load.started - sampler.t0
        summary = inflight_summary(sampler.samples, start, start + self.duration)
        return {**summary, "sampler_cpu_s": round(sampler.cpu_s, 4)} if summary else {}

    def make_cell(self, spec, level, repeat, scenario, run, wrk_cpu, before, after, unloaded_ms, raw_name,
                  extra=None, **optional) -> Cell:
        """``optional``: Cell's optional fields (``inflight``, ``histogram``, ...)."""
        cpu = {
            "app": max(0.0, after.app_cpu - before.app_cpu),
            "nginx": max(0.0, after.nginx_cpu - before.nginx_cpu),
            "wrk": wrk_cpu,
        }
        # Stalled requests cost almost no CPU; counting only healthy ones keeps the bound honest.
        per_request = sum(cpu.values()) / run.requests if run.requests else 0.0
        capacity = self.cores / per_request if per_request else 0.0
        cpus = optional.get("limit", {}).get("cpus")
        if cpus and cpu["app"] > 0 and run.requests:  # a quota of its own bounds the server alone
            capacity = min(capacity, cpus / (cpu["app"] / run.requests))
        closed_loop = level / (unloaded_ms / 1000) if unloaded_ms else 0.0
        bounds = [b for b in (capacity, closed_loop) if b > 0]
        bound = min(bounds) if bounds else 0.0
        extra = dict(extra or {})
        if before.pids or after.pids:  # no stats server: the answers wrk counted per X-Worker-Pid
            workers, unmatched = requests_by_worker(run.worker_pids, before.pids, after.pids)
            if unmatched:
                extra["worker_pid_unmatched"] = unmatched  # answers from pids that were no worker we saw
        else:
            workers = {w: max(0, after.workers.get(w, 0) - before.workers.get(w, 0)) for w in after.workers}
        extra |= host_shares(before, after)
        return Cell(
            layout=spec, concurrency=level, repeat=repeat, scenario=scenario,
            duration_s=run.duration_s, requests=run.requests, rps=run.rps,
            latency_ms=run.latency_ms, worker_requests=workers, cpu_s=cpu,
            # A worker the OOM killer ended is an error, whatever the clients saw.
            errors=replace(run.errors, oom=optional.get("limit", {}).get("oom_kills", 0)),
            unloaded_latency_ms=unloaded_ms, capacity_rps=capacity, closed_loop_rps=closed_loop,
            efficiency=run.rps / bound if bound else 0.0, raw_output=raw_name, extra=extra, round=repeat, **optional,
        )

    def _save_raw(self, name: str, text: str) -> str:
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        path = self.raw_dir / f"{name}.txt"
        path.write_text(text)
        return str(Path(self.raw_dir.name) / path.name)
