"""The layout in its pod against the same layout run outside a container, at the same CPU limit:
throughput and p99 of the Flask test shop (tests/flaskapp.py), paired rounds (issue 35's target:
within 5%).

One side is the pod `bundle --target kubernetes` writes for LAYOUT@cpus=C,memory=M, its images
built with podman (Debian base images made here, tests/integration/podman.py) and run with
`podman kube play --network host`: uWSGI in the app container under the pod's CFS quota, nginx in
its sidecar (1 worker, its own 250m limit, as shipped). The other is
`uwsgi-layouts run LAYOUT@cpus=C,memory=M` with the same app from a virtualenv of this machine:
uWSGI in a cgroup of the same quota, nginx (1 worker) outside it. Both serve on loopback; wrk
(one thread, --latency) drives each in turn for DURATION seconds per cell, the two arms of a pair
in ABBA order (pod run, run pod, ...) so a drifting machine hits both alike.

Prints each pair, the per-pair ratios pod / run of throughput and p99, their geometric means with
the paired t interval every comparison of this tool uses (bench.paired), and the verdict against
the 5% target: within it only when the whole interval lies in 0.95-1.05, outside it only when the
whole interval lies beyond, else undecided (more pairs, a quieter machine). Writes every round,
the commands and the load average before and after to OUT/pod-vs-run.json.

    .venv/bin/python scripts/pod-vs-run.py [--layout 2x4-mapped] [--cpus 1] [--memory 512]
        [--pairs 12] [--duration 30] [--concurrency 8] [--path /api/items] [--out DIR]

Needs root (the cgroup of `run @cpus`, podman), podman, runc, catatonit, mmdebstrap, wrk, and the
network for pip (the image's Flask, the shop's virtualenv). Run it alone on a quiet machine: the
target is a ratio of a few percent. Everything it starts (the pod, the images, its podman
session, `run`) is removed when it ends, Ctrl-C included; a session left by a SIGKILL is removed
by the next run of this script or of the podman tests.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.flaskapp import FLASK_REQUIREMENT, build_flask_app  # noqa: E402
from tests.integration.podman import Podman  # noqa: E402
from uwsgi_layouts.bench.kinds.base import sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.paired import judge_ratios  # noqa: E402
from uwsgi_layouts.bench.stack import find_free_ports  # noqa: E402

TARGET = 0.05  # pod / run within 5%
READY_TIMEOUT_S = 180.0
WRK_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
WRK_P99 = re.compile(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", re.MULTILINE)
WRK_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
WRK_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def wrk(url: str, connections: int, duration: float) -> dict:
    """One cell: requests/s, p99 in ms, and the answers that were not 2xx/3xx or failed."""
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency", url],
                          capture_output=True, text=True, timeout=duration + 60)
    if done.returncode != 0 or not WRK_RPS.search(done.stdout):
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr[-500:]}{done.stdout[-500:]}")
    p99 = WRK_P99.search(done.stdout)
    socket_errors = WRK_SOCKET_ERRORS.search(done.stdout)
    return {"rps": float(WRK_RPS.search(done.stdout)[1]),
            "p99_ms": float(p99[1]) * UNIT_MS[p99[2]] if p99 else None,
            "non_2xx": int(WRK_NON_2XX.search(done.stdout)[1]) if WRK_NON_2XX.search(done.stdout) else 0,
            "socket_errors": sum(map(int, socket_errors.groups())) if socket_errors else 0}


def wait_serving(port: int, path: str, timeout: float, why, gone=lambda: False) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not gone():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"nothing served on 127.0.0.1:{port}{path} within {timeout:g} s: {why()}")


def start_pod(podman: Podman, work: Path, app_dir: Path, spec: str, port: int, probe_port: int) -> Path:
    out = work / "bundle"
    subprocess.run([sys.executable, "-m", "uwsgi_layouts", "bundle", spec, "--target", "kubernetes", "--name", "shop",
                    "--app", "shop:app", "--app-dir", str(app_dir), "--out", str(out), "--image",
                    "localhost/ul-pod-vs-run:1", "--listen", f"127.0.0.1:{port}", "--probe-port", str(probe_port),
                    "--python", "3.11", "--replicas", "1"], check=True, cwd=ROOT, timeout=120)
    bases = {kind: podman.base_image(kind) for kind in ("python", "nginx")}
    args = {"BASE_IMAGE": bases["python"], "NGINX_IMAGE": bases["nginx"]}
    started = time.monotonic()
    podman.build(out / "image", "app", "localhost/ul-pod-vs-run:1", args)
    podman.build(out / "image", "nginx", "localhost/ul-pod-vs-run-nginx:1", args)
    print(f"images built in {time.monotonic() - started:.0f} s", flush=True)
    podman.run("kube", "play", "--network", "host", str(out / "kubernetes/deployment.yaml"), timeout=180)
    return out


def start_run(work: Path, app, spec: str, port: int) -> subprocess.Popen:
    """`uwsgi-layouts run`, in a process group of its own (stopped with SIGINT, as Ctrl-C)."""
    log = open(work / "run.log", "w")  # noqa: SIM115 (the process writes it until it stops)
    return subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "run", spec, "--app", "shop:app", "--app-dir",
                             str(app.app_dir), "--virtualenv", str(app.venv), "--listen", f"127.0.0.1:{port}",
                             # not the default, named after the spec: its comma would split uWSGI's socket paths
                             "--run-dir", str(work / "run")],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_run(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def verdict(low: float, high: float) -> str:
    if 1 - TARGET <= low and high <= 1 + TARGET:
        return f"within {TARGET:.0%}: the whole interval lies in {1 - TARGET:.2f}-{1 + TARGET:.2f}"
    if high < 1 - TARGET or low > 1 + TARGET:
        return f"outside {TARGET:.0%}: the whole interval lies beyond {1 - TARGET:.2f}-{1 + TARGET:.2f}"
    return "undecided: the interval straddles the band; more pairs or a quieter machine"


def summary(rounds: list[dict]) -> list[str]:
    lines = []
    for figure, key in (("throughput", "rps"), ("p99", "p99_ms")):
        ratios = [r["pod"][key] / r["run"][key] for r in rounds if r["pod"][key] and r["run"][key]]
        if not ratios:
            lines.append(f"{figure}: no complete pair")
            continue
        c = judge_ratios(ratios, higher_is_better=key == "rps", figure=key)
        lines += [f"{figure} pod / run per pair: " + " ".join(f"{x:.3f}" for x in ratios),
                  f"{figure}: geometric mean {c.ratio:.3f} ({c.low:.3f}-{c.high:.3f}; {c.how()}) over {len(ratios)} "
                  f"pairs: {verdict(c.low, c.high) if math.isfinite(c.high) else 'too few pairs for an interval'}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default="2x4-mapped")
    p.add_argument("--cpus", default="1", help="the CPU limit of both sides (CPUs, e.g. 1 or 0.75)")
    p.add_argument("--memory", default="512", help="the memory limit of both sides (MiB)")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per cell")
    p.add_argument("--concurrency", type=int, default=0, help="wrk connections (default 2 x P x T)")
    p.add_argument("--path", default="/api/items", help="the shop's request (default /api/items: the app's CPU)")
    p.add_argument("--out", help="a directory for pod-vs-run.json (default: a new one under /tmp)")
    args = p.parse_args(argv)
    processes, threads = (int(x) for x in args.layout.split("-")[0].split("x"))
    connections = args.concurrency or 2 * processes * threads
    spec = f"{args.layout}@cpus={args.cpus},memory={args.memory}"
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ul-pod-vs-run-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ul-pod-vs-run-work-"))
    work.chmod(0o755)  # run's uWSGI (www-data) reads the shop's directory
    load_before = load_average()
    print(f"pod vs run: {spec}, {args.pairs} pairs of {args.duration:g}-s cells, {connections} connections, GET "
          f"{args.path}; load average {load_before}", flush=True)
    pod_port, probe_port, run_port = find_free_ports(3)
    record: dict = {"spec": spec, "pairs": args.pairs, "duration_s": args.duration, "connections": connections,
                    "path": args.path, "load_before": load_before, "rounds": [],
                    "command": "python scripts/pod-vs-run.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    run_proc = None
    try:
        app = build_flask_app(work)
        (app.app_dir / "requirements.txt").write_text(FLASK_REQUIREMENT + "\n")  # what the image installs
        with sigterm_interrupts(), Podman() as podman:
            bundle = start_pod(podman, work, app.app_dir, spec, pod_port, probe_port)
            run_proc = start_run(work, app, spec, run_port)
            wait_serving(pod_port, args.path, READY_TIMEOUT_S,
                         lambda: podman.run("logs", "shop-pod-0-app", check=False).stderr[-2000:])
            wait_serving(run_port, args.path, READY_TIMEOUT_S, lambda: (work / "run.log").read_text()[-2000:],
                         gone=lambda: run_proc.poll() is not None)
            urls = {"pod": f"http://127.0.0.1:{pod_port}{args.path}", "run": f"http://127.0.0.1:{run_port}{args.path}"}
            for url in urls.values():  # warm-up: imports, caches, the first requests' costs
                wrk(url, connections, min(5.0, args.duration))
            for pair in range(1, args.pairs + 1):
                cells = {}
                for side in (("pod", "run") if pair % 2 else ("run", "pod")):
                    cells[side] = wrk(urls[side], connections, args.duration)
                if run_proc.poll() is not None:
                    raise RuntimeError(f"uwsgi-layouts run exited: {(work / 'run.log').read_text()[-2000:]}")
                record["rounds"].append({"pair": pair, **cells})
                print(f"pair {pair}: pod {cells['pod']['rps']:.1f} req/s p99 {cells['pod']['p99_ms']} ms, run "
                      f"{cells['run']['rps']:.1f} req/s p99 {cells['run']['p99_ms']} ms"
                      + (" (errors: " + json.dumps({s: (c["non_2xx"], c["socket_errors"]) for s, c in cells.items()})
                         + ")" if any(c["non_2xx"] or c["socket_errors"] for c in cells.values()) else ""),
                      flush=True)
            podman.run("kube", "down", str(bundle / "kubernetes/deployment.yaml"), check=False, timeout=120)
    except KeyboardInterrupt:
        print("interrupted: the rounds so far are saved", file=sys.stderr)
    finally:
        if run_proc is not None:
            stop_run(run_proc)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    record["load_after"] = load_average()
    (out / "pod-vs-run.json").write_text(json.dumps(record, indent=2) + "\n")
    for line in summary(record["rounds"]):
        print(line)
    print(f"load average {load_before} at the start, {record['load_after']} at the end; wrote "
          f"{out / 'pod-vs-run.json'}")
    return 0 if record["rounds"] else 1


if __name__ == "__main__":
    sys.exit(main())
