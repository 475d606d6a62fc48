"""What ``watch`` costs and whether it grows: its memory and CPU while it is scraped under load.

One stack (default 2x4-mapped, the article's mix, 2P connections, nginx logging the timed lines)
runs with wrk driving it the whole time; ``uwsgi-layouts watch`` reads its stats server, its
sockets and its access log, in its own process, and is scraped every ``--scrape`` seconds (15 in
production; shorter here packs more scrapes into the run) for ``--minutes``. Every scrape's
``process_resident_memory_bytes`` and ``process_cpu_seconds_total`` (the exporter's own, from
prometheus_client's process collector) are kept; printed: resident memory after the first
minute and at the end, its least-squares growth per hour over the rest, and the exporter's CPU
per second of wall time. Saves every reading as JSON in ``--out``.

    .venv/bin/python scripts/watch-cost.py [--minutes 10] [--scrape 1] [--hz 2] [--out DIR]

Not a throughput comparison (scripts/doctor-cost.py pairs cells for that): the figures here are
the exporter's own, which other processes on the machine disturb less than they disturb a
service's throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from uwsgi_layouts.bench.load.wrk import WrkProcess  # noqa: E402
from uwsgi_layouts.bench.options import prepare_out, require_tools  # noqa: E402
from uwsgi_layouts.bench.stack import Lab, find_free_ports  # noqa: E402
from uwsgi_layouts.bench.watchcli import DEFAULT_HZ  # noqa: E402
from uwsgi_layouts.deploy.run import child_setup  # noqa: E402

ARTICLE = "/?rounds=5&fib=25&io_ms=10"
WARM_UP_S = 60.0


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        out[name] = float(m[1]) if m else float("nan")
    out["bytes"] = len(text)
    return out


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / var * 3600 if var else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument("--hz", type=float, default=DEFAULT_HZ,
                   help=f"watch's reads per second (default {DEFAULT_HZ:g}, watch's own)")
    p.add_argument("--spec", default="2x4-mapped")
    p.add_argument("--out")
    args = p.parse_args(argv)
    require_tools("wrk")
    out = prepare_out(args.out, "-watch-cost")
    port = find_free_ports(1)[0]
    load_before = os.getloadavg()
    readings = []
    with Lab() as lab, lab.stack(args.spec, access_log=True) as stack:
        log = Path(stack.layout.run_dir) / "logs" / "access.log"
        duration = args.minutes * 60 + 30
        load = WrkProcess(stack.layout.url.rstrip("/") + ARTICLE, 4, duration, timeout_s=10)
        watch = subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "watch", "--stats", stack.layout.stats_address,
                                  "--access-log", str(log), "--listen", f"127.0.0.1:{port}", "--hz", str(args.hz)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child_setup())
        try:
            first = watch.stdout.readline()
            assert first.startswith("watch: serving"), first + watch.stderr.read()
            started = time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                reading = scrape(f"http://127.0.0.1:{port}/metrics")
                reading["t"] = time.monotonic() - started
                readings.append(reading)
                time.sleep(max(0.0, args.scrape - (time.monotonic() - started - reading["t"])))
        finally:
            watch.terminate()
            watch.communicate(timeout=15)
            load.stop()
    load_after = os.getloadavg()
    later = [(r["t"], r["process_resident_memory_bytes"] / 1e6) for r in readings if r["t"] >= WARM_UP_S]
    cpu = readings[-1]["process_cpu_seconds_total"] - readings[0]["process_cpu_seconds_total"]
    wall = readings[-1]["t"] - readings[0]["t"]
    summary = {
        "scrapes": len(readings), "minutes": args.minutes, "scrape_s": args.scrape, "hz": args.hz, "spec": args.spec,
        "rss_mb_after_warm_up": later[0][1] if later else None, "rss_mb_end": later[-1][1] if later else None,
        "rss_growth_mb_per_h": round(slope_per_hour(later), 3),
        "cpu_per_wall_s": round(cpu / wall, 4) if wall else None,
        "exposition_bytes": readings[-1]["bytes"], "load_before": load_before, "load_after": load_after,
    }
    (out / "watch-cost.json").write_text(json.dumps({"summary": summary, "readings": readings}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / 'watch-cost.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
