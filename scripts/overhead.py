"""uWSGI's overhead per request, against gunicorn's and granian's, and what each candidate change
does to it: paired interleaved rounds, one change at a time against the baseline.

The arms (``--arms``; each one stack per round, started, warmed up, measured on every scenario,
stopped; the order rotates every round so that none always runs first):

    baseline       the uWSGI layout (default 2x4-mapped) as ``compare`` measures it: the uwsgi
                   protocol, the layout's transport, the in-flight sampler at 25 Hz, our uWSGI build
    sampler-off    the same without the in-flight sampler (a deployed uWSGI has none)
    http           @protocol=http: http-socket per worker, nginx proxy_pass, a connection per request
    http11         @protocol=http11: http11-socket per worker, nginx keeps connections (max_conns=T)
    unix | tcp     the other transport
    build-PROFILE  another uWSGI build (scripts/build-uwsgi.sh: o3, shared, static), each one found under
                   build/uwsgi/ that differs from ours and has internal routing (a build without PCRE
                   cannot run our uwsgi.ini: its route-if-not lines refuse code-loading packets)
    gunicorn, gunicorn-keepalive-off, granian, granian-keepalive-off
                   the peers' variants; per scenario the best of each (``peer_choices``) is the one
                   uWSGI is held against

Every cell is measured as compare measures one (``LiveRunner.measure``), plus the CPU of nginx,
of the server's master and of its workers, user and system (kernel) time apart (/proc). Every
decision is ``compare_groups`` on the paired rounds: throughput and CPU per request (the serving
side: server + nginx; ``bench.analysis.cell_cpu_ms``).

With perf (``--profile``, on by default when perf works here), one profiled cell per scenario
for the baseline and each peer's best variant after the rounds: ``perf record -e cpu-clock``
(a software event: this VM has no hardware counters) on nginx and the server, which splits each
side's CPU by where it ran: the kernel (connect, accept, read, write, epoll), the server's
binary (uWSGI's C core and its python plugin; nginx), libpython (the interpreter: the app, and a
Python server's own code), libc, other libraries. The split is a share of samples, applied to
that cell's /proc CPU per request.

    .venv/bin/python scripts/overhead.py [--uwsgi 2x4-mapped] [--scenario hello,article]
        [--rounds 5] [--duration 8] [--concurrency N] [--arms baseline,http,...] [--transport tcp]
        [--builds build/uwsgi] [--no-profile] [--margin 0.05] [--out DIR]

Writes results.json (a compare run: ``uwsgi-layouts report`` renders it; arms are layouts,
e.g. ``2x4-mapped+sampler-off``), overhead.md (the tables, markdown) and overhead.txt, perf/
(each profile's report by process and library, and its top functions). Run it alone on a quiet
machine: its figures are ratios of a few percent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from uwsgi_layouts.bench import subject as subj  # noqa: E402
from uwsgi_layouts.bench.analysis import (  # noqa: E402
    Group,
    against,
    cell_cpu_ms,
    compare_groups,
    group_cells,
    peer_choices,
    ranked_at_level,
    server_of,
)
from uwsgi_layouts.bench.environment import capture  # noqa: E402
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner  # noqa: E402
from uwsgi_layouts.bench.load import scenarios as sc  # noqa: E402
from uwsgi_layouts.bench.load.wrk import run_wrks  # noqa: E402
from uwsgi_layouts.bench.margin import MARGIN  # noqa: E402
from uwsgi_layouts.bench.options import BadArgument, prepare_out, require_tools  # noqa: E402
from uwsgi_layouts.bench.paired import DEFAULT_MARGIN  # noqa: E402
from uwsgi_layouts.bench.report.text import md_table, table  # noqa: E402
from uwsgi_layouts.bench.results import Results, utc_now  # noqa: E402
from uwsgi_layouts.bench.stack import Lab  # noqa: E402
from uwsgi_layouts.bench.verdict import straddle_words  # noqa: E402
from uwsgi_layouts.deploy.machine import checked, find_uwsgi  # noqa: E402
from uwsgi_layouts.deploy.model import LayoutError, StackError, parse_variant  # noqa: E402

SAMPLER_HZ = 25.0  # compare's default
PERF_HZ = 999
DEFAULT_BUILDS = ROOT / "build" / "uwsgi"
ROLES = ("nginx", "master", "workers")
# The builds that differ from ours (pyuwsgi, make venv's: the app's Python in the python3
# executable) in the libpython the app's Python runs in, not in flags.
INTERPRETER_BUILDS = {"static": "uWSGI linked against the static libpython (python3's PGO build, without LTO)",
                      "shared": "uWSGI embedding Debian's shared libpython (pip's default build)"}


# --------------------------------------------------------------------------- the arms


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str  # what --arms takes
    label: str  # the cells' layout label
    spec: str  # what the lab starts
    what: str  # one line for the tables
    inflight_hz: float = SAMPLER_HZ
    peer: bool = False


def our_build() -> dict:
    """How our uWSGI was built: its code-generation flags and whether it has internal routing (PCRE)."""
    binary = find_uwsgi()
    flags = subprocess.run([binary, "--cflags"], capture_output=True, text=True, timeout=30).stdout.split()
    helptext = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    return {"binary": binary, "cflags": [t for t in flags if t.startswith(("-O", "-f", "-m", "-g"))],
            "routing": "--route-if" in helptext}


def find_builds(root: Path, ours: dict) -> tuple[list[dict], list[str]]:
    """The builds of scripts/build-uwsgi.sh under ``root`` that differ from ours, and notes on
    the ones left out."""
    builds, notes = [], []
    for record in sorted(root.glob("*/BUILD.json")) if root.is_dir() else []:
        try:
            build = json.loads(record.read_text())
        except (OSError, ValueError):
            notes.append(f"{record}: unreadable, left out")
            continue
        binary = record.parent / "bin" / "uwsgi"
        # static and shared keep our flags and change the libpython the app's Python runs in.
        same = build.get("cflags") == ours["cflags"] and build.get("routing") == ours["routing"] and \
            build.get("profile") not in INTERPRETER_BUILDS
        if same:
            notes.append(f"build {build.get('profile')}: the same flags and PCRE as ours, nothing to compare")
        elif not build.get("routing"):
            # Every uwsgi.ini holds the route-if-not lines that refuse code-loading packets, and
            # `strict` makes a uWSGI without internal routing refuse the file: it cannot run them.
            notes.append(f"build {build.get('profile')}: no internal routing (no PCRE), so it cannot run our "
                         "uwsgi.ini (the route-if-not lines are required): left out")
        elif binary.is_file():
            builds.append({**build, "binary": str(binary)})
    return builds, notes


def make_arms(uwsgi: str, transport: str, builds: list[dict], ours: dict) -> list[Arm]:
    base = uwsgi.partition("@")[0]
    p_t = base.split("-")[0]
    other = "unix" if transport == "tcp" else "tcp"
    arms = [
        Arm("baseline", base, base, f"as compare runs it (uwsgi protocol, {transport}, sampler {SAMPLER_HZ:g} Hz, our "
                                    f"build: {' '.join(ours['cflags'])}, PCRE {'on' if ours['routing'] else 'off'})"),
        Arm("sampler-off", f"{base}+sampler-off", base, "the in-flight sampler off", inflight_hz=0.0),
        Arm("http", f"{base}@protocol=http", f"{base}@protocol=http",
            "http-socket per worker, nginx proxy_pass (HTTP/1.0, a connection per request)"),
        Arm("http11", f"{base}@protocol=http11", f"{base}@protocol=http11",
            "http11-socket per worker, nginx keeps connections (max_conns=T)"),
        Arm(other, f"{base}@transport={other}", f"{base}@transport={other}", f"{other} sockets instead of {transport}"),
    ]
    for b in builds:
        pcre = "PCRE" if b.get("routing") else "no PCRE"
        how = INTERPRETER_BUILDS.get(b["profile"], f"uWSGI built with {' '.join(b.get('cflags', []))}")
        arms.append(Arm(f"build-{b['profile']}", f"{base}+build-{b['profile']}", f"{base}@uwsgi_bin={b['binary']}",
                        f"{how}, {pcre} (scripts/build-uwsgi.sh {b['profile']})"))
    for peer in ("gunicorn", "granian"):
        arms.append(Arm(peer, f"{p_t}-{peer}", f"{p_t}-{peer}", f"{peer}, nginx keeps connections", peer=True))
        arms.append(Arm(f"{peer}-keepalive-off", f"{p_t}-{peer}@keepalive=off", f"{p_t}-{peer}@keepalive=off",
                        f"{peer}, a connection per request", peer=True))
    return arms


def select_arms(arms: list[Arm], raw: str | None) -> list[Arm]:
    if not raw:
        return arms
    names = [x.strip() for x in raw.split(",") if x.strip()]
    known = {a.name: a for a in arms}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadArgument(f"arms: unknown arm {unknown[0]!r}; here: {', '.join(known)}")
    if "baseline" not in names:
        names.insert(0, "baseline")
    return [known[n] for n in dict.fromkeys(names)]


# --------------------------------------------------------------------------- measuring


def role_processes(stack) -> dict[str, list[psutil.Process]]:
    """nginx (master and workers), the app server's master(s), and every process below them."""
    try:
        nginx = psutil.Process(stack.pids["nginx"])
        masters = [psutil.Process(p) for p in stack.app_pids]
        return {"nginx": [nginx, *nginx.children(recursive=True)], "master": masters,
                "workers": [c for m in masters for c in m.children(recursive=True)]}
    except psutil.Error as exc:
        raise StackError(f"the stack's processes went away: {exc}") from None


def role_times(stack) -> dict[str, dict[int, tuple[float, float]]]:
    """Per role, pid -> (user, system) CPU seconds (threads included)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for role, procs in role_processes(stack).items():
        out[role] = {}
        for p in procs:
            try:
                t = p.cpu_times()
                out[role][p.pid] = (t.user, t.system)
            except psutil.Error:
                continue
    return out


def role_deltas(before: dict, after: dict) -> dict[str, float]:
    """``cpu_ROLE_user_s`` / ``cpu_ROLE_sys_s`` over processes alive at both ends (a respawned
    worker's CPU before it died is lost: the counts say so by being smaller)."""
    out = {}
    for role in ROLES:
        user = sys_ = 0.0
        for pid, (u, s) in after.get(role, {}).items():
            u0, s0 = before.get(role, {}).get(pid, (0.0, 0.0))
            user, sys_ = user + max(0.0, u - u0), sys_ + max(0.0, s - s0)
        out[f"cpu_{role}_user_s"], out[f"cpu_{role}_sys_s"] = round(user, 4), round(sys_, 4)
    return out


class SplitRunner(LiveRunner):
    """compare's measure, plus the CPU of each role, user and system apart, in the cell's extra."""

    def measure(self, stack, layout, scenario, level, repeat, unloaded_ms, label=""):
        before = role_times(stack)
        cell = super().measure(stack, layout, scenario, level, repeat, unloaded_ms, label=label)
        return dataclasses.replace(cell, extra={**cell.extra, **role_deltas(before, role_times(stack))})


def stack_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def run_arm(runner: SplitRunner, arm: Arm, repeat: int, levels: list[int], scenarios: list[str], options: dict):
    """One stack of ``arm``: every scenario's warm-up (the unloaded latency) and cells."""
    runner.inflight_hz = arm.inflight_hz
    cells = []
    with runner.lab.stack(arm.spec, name=stack_name(arm.label), **options) as stack:
        for name in scenarios:
            scenario = runner.scenarios[name]
            (probe,), _ = run_wrks(runner.main_load(stack.layout, scenario, 1, runner.warmup, seed=repeat))
            for level in levels:
                cells.append(runner.measure(stack, stack.layout, scenario, level, repeat, probe.latency_ms.p50,
                                            label=arm.label))
                stack.check_alive()
    return cells


# --------------------------------------------------------------------------- profiling (perf)


def perf_works() -> str:
    """"" when ``perf record -e cpu-clock`` samples a busy process here, else why not (two tries:
    on a loaded machine the probe may not run during the first window)."""
    if not shutil.which("perf"):
        return "perf is not installed (apt-get install linux-perf)"
    why = ""
    for _ in range(2):
        busy = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
        probe = subprocess.Popen([sys.executable, "-c", busy])
        data = Path(f"/tmp/ul-overhead-perf-probe-{os.getpid()}.data")
        try:
            time.sleep(0.2)
            run = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "99", "-p", str(probe.pid), "-o",
                                  str(data), "--", "sleep", "1"], capture_output=True, text=True, timeout=30)
            report = subprocess.run(["perf", "report", "-i", str(data), "--stdio"], capture_output=True, text=True,
                                    timeout=30)
        finally:
            probe.kill()
            probe.wait()
            data.unlink(missing_ok=True)
        if run.returncode == 0 and "%" in report.stdout:
            return ""
        why = " ".join((run.stderr or report.stderr).split())[:160]
    return f"perf record gave no samples here ({why})"


def dso_group(dso: str, server: str) -> str:
    name = dso.strip()
    if name.startswith("[kernel") or name == "[vdso]":
        return "kernel"
    base = Path(name).name
    if base.startswith("libpython") or base.startswith("python3"):
        return "libpython"
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "libc"
    if base == "uwsgi":
        return "uwsgi"
    if base == "nginx":
        return "nginx"
    if server == "granian" and base.startswith("_granian"):
        return "granian"
    return "other"


def thread_group(tid: int) -> int:
    try:
        for line in Path(f"/proc/{tid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


def parse_perf_report(text: str, roles_of: dict[int, str], server: str) -> dict[str, dict[str, int]]:
    """``perf report --sort pid,dso -F overhead,sample,pid,dso -t '|'`` lines -> role -> group -> samples."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if line.startswith("#") or line.count("|") < 3:
            continue
        _, samples, pid, dso = (x.strip() for x in line.split("|", 3))
        try:
            tid, n = int(pid.split(":")[0]), int(samples)
        except ValueError:
            continue
        role = roles_of.get(thread_group(tid), "other processes")
        group = dso_group(dso, server)
        out.setdefault(role, {}).setdefault(group, 0)
        out[role][group] += n
    return out


def profile_arm(runner: SplitRunner, arm: Arm, scenario: str, level: int, out_dir: Path, options: dict) -> dict:
    """One cell of ``arm`` under perf: CPU ms per request per role and DSO group."""
    runner.inflight_hz = arm.inflight_hz
    data = out_dir / f"{stack_name(arm.label)}-{scenario}.data"
    with runner.lab.stack(arm.spec, name=stack_name(arm.label) + "-perf", **options) as stack:
        sc_ = runner.scenarios[scenario]
        (probe,), _ = run_wrks(runner.main_load(stack.layout, sc_, 1, runner.warmup))
        procs = role_processes(stack)
        roles_of = {p.pid: role for role, ps in procs.items() for p in ps}
        pids = ",".join(str(pid) for pid in roles_of)
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-p", pids, "-o",
                                 str(data), "--", "sleep", str(runner.duration + 1.5)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.5)  # attached before the load starts
            cell = runner.measure(stack, stack.layout, sc_, level, 1, probe.latency_ms.p50, label=arm.label)
            perf.wait(timeout=runner.duration + 30)
        finally:
            if perf.poll() is None:
                perf.kill()
                perf.wait()
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "pid,dso", "-F",
                                 "overhead,sample,pid,dso", "-t", "|"], capture_output=True, text=True, timeout=120)
        (out_dir / f"{stack_name(arm.label)}-{scenario}.txt").write_text(report.stdout)
        # For reading: the functions behind the shares (kernel: tcp_*, unix_*, epoll..., the interpreter's).
        symbols = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "comm,dso,sym",
                                  "--percent-limit", "0.5"], capture_output=True, text=True, timeout=120)
        (out_dir / f"{stack_name(arm.label)}-{scenario}-symbols.txt").write_text(symbols.stdout)
        samples = parse_perf_report(report.stdout, roles_of, stack.layout.server)
    data.unlink(missing_ok=True)  # the text report is kept; the data file is large
    per_request = {role: 1000 * (cell.extra[f"cpu_{role}_user_s"] + cell.extra[f"cpu_{role}_sys_s"]) / cell.requests
                   for role in ROLES} if cell.requests else {}
    split = {}
    for role, side in (("nginx", ("nginx",)), ("server", ("master", "workers"))):
        counts: dict[str, int] = {}
        for r in side:
            for g, n in samples.get(r, {}).items():
                counts[g] = counts.get(g, 0) + n
        total = sum(counts.values())
        ms = sum(per_request.get(r, 0.0) for r in side)
        split[role] = {g: ms * n / total for g, n in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}
    return {"arm": arm.label, "scenario": scenario, "requests": cell.requests, "rps": cell.rps,
            "ms_per_request": split, "samples": samples, "perf_stderr": perf.stderr.read()[-500:] if perf.stderr
            else ""}


# --------------------------------------------------------------------------- the tables


def component_ms(cells) -> dict[str, float]:
    """Median over rounds (cells) of each role's user and system CPU per request, ms."""
    out = {}
    for role in ROLES:
        for kind in ("user", "sys"):
            key = f"cpu_{role}_{kind}_s"
            values = [1000 * c.extra[key] / c.requests for c in cells if key in c.extra and c.requests]
            out[f"{role}_{kind}"] = statistics.median(values) if values else 0.0
    return out


def median_cpu(g: Group) -> float:
    return statistics.median(g.per_repeat["cpu"]) if g.per_repeat.get("cpu") else 0.0


def fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def tables(results: Results, arms: list[Arm], profiles: list[dict], markdown: bool) -> list[str]:
    groups = {(g.scenario, g.layout, g.concurrency): g for g in group_cells(results)}
    by_label = {a.label: a for a in arms}
    base = arms[0]
    out: list[str] = []

    def emit(title: str, header: list[str], rows: list[list[str]], align: str):
        if markdown:
            out.extend([f"### {title}", "", *md_table(header, rows, align), ""])
        else:
            out.extend(["", title + ":", *("  " + x for x in table(header, rows, align))])

    for scenario in results.arguments["scenarios"]:
        for level in results.arguments["concurrency"]:
            here = {a.label: groups[(scenario, a.label, level)] for a in arms if (scenario, a.label, level) in groups}
            b = here.get(base.label)
            if b is None:
                continue
            rows = []
            for a in arms:
                g = here.get(a.label)
                if g is None or a.peer:
                    continue
                if a is base:
                    rows.append([a.name, a.what, f"{g.rps.median:.4g}", fmt_ms(median_cpu(g)), "1", "1"])
                    continue
                rps, cpu = compare_groups(g, b, "rps"), compare_groups(g, b, "cpu")
                rows.append([a.name, a.what, f"{g.rps.median:.4g}", fmt_ms(median_cpu(g)),
                             f"{rps.text()}: {rps.outcome}", f"{cpu.text()}: {cpu.outcome}"])
            emit(f"{scenario} at {level} connections: each option against the baseline (paired by round; CPU = "
                 "server + nginx per request)", ["option", "what", "req/s", "CPU ms/req", "throughput / baseline",
                                                 "CPU per request / baseline"], rows, "<<>>>>")
            rows = []
            for label, g in here.items():
                c = component_ms([x for x in results.cells if (x.scenario, x.layout, x.concurrency) ==
                                  (scenario, label, level)])
                rows.append([by_label[label].name, fmt_ms(c["nginx_user"]), fmt_ms(c["nginx_sys"]),
                             fmt_ms(c["master_user"] + c["master_sys"]), fmt_ms(c["workers_user"]),
                             fmt_ms(c["workers_sys"]), fmt_ms(median_cpu(g))])
            emit(f"{scenario} at {level} connections: CPU per request by component, ms (medians over rounds; sys = "
                 "the kernel: connect, accept, read, write, epoll)",
                 ["arm", "nginx user", "nginx sys", "server master", "workers user", "workers sys", "total"], rows,
                 "<>>>>>>")
            rows = targets(results, here, base, by_label, scenario)
            if rows:
                emit(f"{scenario} at {level} connections: uWSGI against each peer at its best variant",
                     ["comparison", "uWSGI", "peer", "ratio (uWSGI / peer)", "target"], rows, "<<<<<")
    if profiles:
        rows = []
        for p in profiles:
            for side, split in p["ms_per_request"].items():
                rows.append([p["scenario"], p["arm"], side, fmt_ms(sum(split.values())),
                             ", ".join(f"{g} {fmt_ms(ms)}" for g, ms in split.items() if ms >= 0.0005) or "no samples"])
        emit("Where the CPU of one profiled cell went (perf cpu-clock samples x /proc CPU), ms per request",
             ["scenario", "arm", "side", "total", "by library"], rows, "<<<><")
    return out


# A target judged on the paired interval (analysis.against): met only when the whole interval clears it.
VERDICT = {"met": "pass", "missed": "MISS"}


def judged(c, threshold: float, at_most: bool) -> str:
    """``pass``, ``MISS``, or ``undecided: 1% past, 1% short``: by how much its interval straddles."""
    state = against(c, threshold, at_most)
    return VERDICT[state] if state in VERDICT else \
        f"undecided: {straddle_words(c, threshold, at_most)}"


def targets(results: Results, here: dict[str, Group], base: Arm, by_label: dict[str, Arm],
            scenario: str) -> list[list[str]]:
    """uWSGI (the baseline, and its best arm) against each peer's best variant."""
    ours = [g for label, g in here.items() if not by_label[label].peer]
    theirs = [g for label, g in here.items() if by_label[label].peer]
    if not theirs:
        return []
    rows = []
    b = here[base.label]
    fastest = ranked_at_level(ours)[0]
    # uWSGI's leanest arm that serves no worse than the baseline (not worse beyond noise).
    fine = [g for g in ours if g is b or compare_groups(g, b, "rps").outcome != "worse"]
    leanest = min(fine, key=median_cpu)
    for choice in peer_choices(theirs):
        peer = choice.best
        won = f"{peer.layout}" + (f" (over {choice.runner_up.layout}: {choice.rps.text()}, {choice.rps.outcome})"
                                  if choice.runner_up is not None else "")
        for name, g in (("baseline", b), ("leanest", leanest)):
            cpu = compare_groups(g, peer, "cpu")
            ok = judged(cpu, 1.0, at_most=True)
            rows.append([f"CPU per request ({name})", by_label[g.layout].name, won,
                         f"{cpu.text()}: {'uWSGI leaner' if cpu.outcome == 'better' else cpu.outcome}",
                         f"<= 1.0x: {ok}" if choice.server == "gunicorn" else ""])
        rps = compare_groups(fastest, peer, "rps")
        target = ""
        if choice.server == "granian" and scenario == "hello":
            target = f">= 1.0x: {judged(rps, 1.0, at_most=False)}"
        rows.append(["throughput (fastest uWSGI)", by_label[fastest.layout].name, won,
                     f"{rps.text()}: {'uWSGI ahead' if rps.outcome == 'better' else rps.outcome}", target])
    return rows


# --------------------------------------------------------------------------- the run


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uwsgi", default="2x4-mapped", help="the uWSGI layout (default 2x4-mapped)")
    p.add_argument("--scenario", default="hello,article", help="demo mixes, comma-separated (default hello,article)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per cell (default 8)")
    p.add_argument("--concurrency", help="connections, comma-separated (default 2P)")
    p.add_argument("--arms", help="comma-separated arms (default: every one; baseline always)")
    p.add_argument("--transport", help="the baseline's transport (default: the layout's default)")
    p.add_argument("--builds", default=str(DEFAULT_BUILDS), help="where scripts/build-uwsgi.sh put its builds")
    p.add_argument("--no-profile", action="store_true", help="skip the perf pass")
    p.add_argument("--margin", type=MARGIN, default=DEFAULT_MARGIN, help=f"equivalence margin ({MARGIN}; default "
                                                                           f"{DEFAULT_MARGIN})")
    p.add_argument("--out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args, argv)
    except (BadArgument, LayoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run(args, argv) -> int:
    if args.rounds < 3:
        raise BadArgument("rounds: at least 3 (fewer paired rounds decide nothing)")
    if not 1 <= args.duration <= 600:
        raise BadArgument(f"duration: seconds in 1..600, got {args.duration:g}")
    margin = args.margin
    probe = parse_variant(args.uwsgi, run_dir=subj.VALIDATE_RUN_DIR)
    if probe.server != "uwsgi" or "@" in args.uwsgi:
        raise BadArgument(f"uwsgi: a plain uWSGI layout such as 2x4-mapped, got {args.uwsgi!r}")
    transport = args.transport or probe.transport
    options = {"transport": transport} if args.transport else {}
    names = [x.strip() for x in args.scenario.split(",") if x.strip()]
    for name in names:
        s = sc.SCENARIOS.get(name)
        if s is None or s.files is not None or s.stall is not None or s.needs_mix:
            steady = [n for n, x in sc.SCENARIOS.items() if x.files is None and x.stall is None and not x.needs_mix]
            raise BadArgument(f"scenario: {name!r} is not one of the demo app's steady mixes: {', '.join(steady)}")
    levels = [int(x) for x in args.concurrency.split(",")] if args.concurrency else [2 * probe.processes]
    ours = our_build()
    builds, notes = find_builds(Path(args.builds), ours)
    arms = select_arms(make_arms(args.uwsgi, transport, builds, ours), args.arms)
    for arm in arms:  # every arm's layout is valid here before anything starts (LayoutError: exit 2)
        checked(parse_variant(arm.spec, run_dir=subj.VALIDATE_RUN_DIR, **options))
    require_tools("wrk")
    why_no_perf = "--no-profile" if args.no_profile else perf_works()
    out = prepare_out(args.out)
    scenarios = {n: sc.SCENARIOS[n].resolved(probe.threads) for n in names}
    command = "python scripts/overhead.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    arguments = {"layouts": [a.label for a in arms], "concurrency": levels, "repeats": args.rounds,
                 "duration": args.duration, "processes": probe.processes, "threads": probe.threads,
                 "scenarios": names, "inflight_hz": SAMPLER_HZ, "margin": margin, "transport": transport,
                 "command": command, "app": {"app": probe.app, "demo": True},
                 "arms": [dataclasses.asdict(a) for a in arms], "our_build": ours}
    environment = capture()
    cells = []
    profiles: list[dict] = []
    for note in notes:
        print(note, flush=True)
    print(f"{len(arms)} arms x {len(names)} scenarios x {len(levels)} level(s) x {args.rounds} rounds of "
          f"{args.duration:g} s: {', '.join(a.name for a in arms)}", flush=True)

    def save():
        results = Results(environment=environment, arguments=arguments, cells=tuple(cells), created=utc_now(),
                          workload={n: s.to_dict() for n, s in scenarios.items()})
        results.save(out / RESULTS_NAME)
        return results

    failed: dict[str, str] = {}
    started = time.monotonic()
    with Lab() as lab, sigterm_interrupts():
        runner = SplitRunner(lab, out / "raw", scenarios, args.duration, 1.0, 10.0, inflight_hz=SAMPLER_HZ)
        try:
            for r in range(1, args.rounds + 1):
                shift = (r - 1) % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    if arm.name in failed:
                        continue
                    try:
                        new = run_arm(runner, arm, r, levels, names, options)
                    except StackError as exc:
                        failed[arm.name] = str(exc).splitlines()[0]
                        print(f"round {r} {arm.name}: failed ({failed[arm.name]}); left out from now on", flush=True)
                        continue
                    cells.extend(new)
                    figures = ", ".join(f"{c.scenario} {c.rps:.4g} req/s {cell_cpu_ms(c):.2f} ms CPU/req" for c in new)
                    print(f"round {r}/{args.rounds} {arm.name}: {figures} [{time.monotonic() - started:.0f} s]",
                          flush=True)
                    save()
                environment.setdefault("loadavg_after_rounds", []).append(list(os.getloadavg()))
            if not why_no_perf:
                results = save()
                groups = group_cells(results)
                picks = [arms[0]] + [a for a in arms if a.peer and any(
                    c.best.layout == a.label for c in peer_choices([g for g in groups if server_of(g.layout) != "uwsgi"
                                                                    and g.concurrency == levels[-1]]))]
                (out / "perf").mkdir(exist_ok=True)
                for arm in dict.fromkeys(picks):
                    for name in names:
                        print(f"profiling {arm.name} on {name}...", flush=True)
                        profiles.append(profile_arm(runner, arm, name, levels[-1], out / "perf", options))
        except KeyboardInterrupt:
            save()
            print(f"interrupted: the cells so far are in {out / RESULTS_NAME}", file=sys.stderr)
            return 130
    arguments["profiles"] = profiles
    arguments["failed_arms"] = failed
    arguments["perf"] = why_no_perf or f"perf record -e cpu-clock -F {PERF_HZ}"
    environment["loadavg_at_end"] = list(os.getloadavg())
    results = save()
    text = tables(results, arms, profiles, markdown=False)
    md = tables(results, arms, profiles, markdown=True)
    head = [f"{command}", f"{time.monotonic() - started:.0f} s; load average at start "
            f"{environment['loadavg_at_start'][0]:.2f}, at end {environment['loadavg_at_end'][0]:.2f} "
            f"({environment['nproc']} cores)"] + ([f"no profile: {why_no_perf}"] if why_no_perf else []) + \
        [f"left out: {n}: {why}" for n, why in failed.items()] + notes
    (out / "overhead.txt").write_text("\n".join(head + text) + "\n")
    (out / "overhead.md").write_text("\n".join([f"`{command}`", "", *(f"- {h}" for h in head[1:]), "", *md]) + "\n")
    print("\n".join(text))
    print(f"\nwrote {out / RESULTS_NAME}, {out / 'overhead.md'}, {out / 'overhead.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
