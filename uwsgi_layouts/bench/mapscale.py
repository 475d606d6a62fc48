"""How nginx's id -> path map scales: build time, nginx start time and memory per id count.

For each id count (default 10,000 and 1,000,000), interleaved over repeats (10k, 1M, 10k, 1M, ...):

1. the index of a data set of that many small files (``bench.dataset.build_index``: pure, no
   file written) and its ``index.json``;
2. the map: ``nginx-files.map`` + ``nginx-files.json`` with the hash sizes (``write_map``, as
   ``make dataset`` does): *map build* is that step's wall time (numpy, which replays nginx's
   search, is imported once before any timing; its import time is recorded apart);
3. only the hot file is written under ``files/``: the map is what is measured, not a million
   files on disk;
4. the layout is rendered (cross-checks and ``nginx -t``; *nginx -t* is a second ``nginx -t``
   timed alone), then nginx alone is started (no uWSGI: /nfiles/ never reaches it) and
   ``GET /nfiles/<hot id>`` is polled every 2 ms: *start* is from spawning the nginx master to
   the first 200. *memory* is the PSS (proportional set size: shared pages split between the
   processes sharing them) summed over nginx's master and worker, with their RSS, right after
   that first 200. Then nginx is stopped and the directory removed.

``uwsgi-layouts map-scale [--counts 10000,1000000] [--repeats 3] [--workers 1] [--out DIR]``
writes ``mapscale.json`` (format version 1, the environment, the arguments, every run) and
``report.md`` into ``results/<timestamp>-mapscale/`` (or --out) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from uwsgi_layouts.arguments import EXIT_BAD_INPUT, PROG, CommaList, Ints, OneLineParser
from uwsgi_layouts.bench import dataset as ds
from uwsgi_layouts.bench.analysis import Stat
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.options import BadArgument, prepare_out
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, table
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.model import ROUTE_PREFIX
from uwsgi_layouts.deploy.render import nginx_test, write_layout
from uwsgi_layouts.deploy.run import die_with_parent, http_get, nginx_binary, tail, terminate_group

FORMAT_VERSION = 1
RESULTS_NAME = "mapscale.json"
DEFAULT_COUNTS = (10_000, 1_000_000)
POLL_S = 0.002
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Run:
    ids: int
    repeat: int
    index_s: float  # build_index + writing index.json
    map_s: float  # write_map: the map file, its sizes (nginx's search replayed) and its facts
    map_mb: float
    max_size: int
    bucket_size: int
    table_size: int
    hash_mb: float  # the table as nginx allocates it (computed)
    nginx_t_s: float
    nginx_t_clean: bool  # no warning in nginx -t's output
    start_s: float  # nginx master spawned -> first 200 on /nfiles/<hot id>
    pss_mb: float  # nginx master + workers
    rss_mb: float
    processes: int


def _tree(pid: int) -> list[psutil.Process]:
    master = psutil.Process(pid)
    return [master, *master.children(recursive=True)]


def _memory(pid: int) -> tuple[float, float, int]:
    procs = _tree(pid)
    infos = [p.memory_full_info() for p in procs]
    return sum(i.pss for i in infos) / 1e6, sum(i.rss for i in infos) / 1e6, len(procs)


def _start_nginx(layout, hot_path: str) -> tuple[subprocess.Popen, float]:
    """Spawn nginx alone and poll until ``hot_path`` answers 200; (process, seconds)."""
    run_dir = Path(layout.run_dir)
    cmd = [nginx_binary(), "-p", f"{run_dir}/", "-c", str(run_dir / "nginx.conf"), "-e",
           str(run_dir / "logs" / "error.log"), "-g", "daemon off;"]
    with open(run_dir / "logs" / "nginx.out", "ab") as log:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir,
                                preexec_fn=die_with_parent)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {proc.returncode}: {tail(run_dir / 'logs' / 'error.log')}")
            try:
                if http_get(layout.listen_host, layout.listen_port, hot_path, timeout=5)[0] == 200:
                    return proc, time.monotonic() - started
            except OSError:
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"nginx did not answer {hot_path} within {START_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)  # polling interval
    except BaseException:
        terminate_group(proc, STOP_TIMEOUT_S)
        raise


def measure(lab: Lab, ids: int, repeat: int, workers: int) -> Run:
    root = lab.new_dir() / "ds"
    root.mkdir()
    root.chmod(0o755)
    try:
        started = time.monotonic()
        index = ds.build_index(root, small_count=ids, small_size=5 * 1024, large_count=0, large_size=1, seed=0)
        (root / ds.INDEX_NAME).write_text(json.dumps(index.to_json()) + "\n", encoding="utf-8")
        index_s = time.monotonic() - started
        hot = index.path(index.hot_id)
        hot.parent.mkdir(parents=True)
        hot.write_bytes(ds.file_bytes(index.seed, index.hot_id, index.small_size))
        for d in hot.relative_to(root).parents:  # nginx's workers run as an unprivileged user under root
            (root / d).chmod(0o755)
        hot.chmod(0o644)
        started = time.monotonic()
        facts = ds.write_map(root, index)
        map_s = time.monotonic() - started
        layout = lab.layout("1x1-mapped", data_dir=str(root), sendfile="on", nginx_workers=str(workers))
        write_layout(layout, layout.run_dir)
        started = time.monotonic()
        ok, output = nginx_test(Path(layout.run_dir))
        nginx_t_s = time.monotonic() - started
        if not ok:
            raise RuntimeError(f"nginx -t failed: {output}")
        proc, start_s = _start_nginx(layout, f"{ROUTE_PREFIX}{index.hot_id}")
        try:
            pss, rss, count = _memory(proc.pid)
        finally:
            terminate_group(proc, STOP_TIMEOUT_S)
        s = facts.sizing
        return Run(ids=ids, repeat=repeat, index_s=index_s, map_s=map_s, map_mb=facts.map_bytes / 1e6,
                   max_size=s.max_size, bucket_size=s.bucket_size, table_size=s.table_size, hash_mb=s.hash_bytes / 1e6,
                   nginx_t_s=nginx_t_s, nginx_t_clean="[warn]" not in output and "[emerg]" not in output,
                   start_s=start_s, pss_mb=pss, rss_mb=rss, processes=count)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


# --------------------------------------------------------------------------- report

COLUMNS = (("map build", "map_s", "s"), ("nginx -t", "nginx_t_s", "s"), ("start to first 200", "start_s", "s"),
           ("nginx PSS", "pss_mb", "MB"), ("nginx RSS", "rss_mb", "MB"))


def report_lines(data: dict, markdown: bool = False) -> list[str]:
    runs = [Run(**r) for r in data["runs"]]
    rows = []
    for ids in sorted({r.ids for r in runs}):
        mine = [r for r in runs if r.ids == ids]
        first = mine[0]
        rows.append([f"{ids:,}", f"{first.map_mb:.1f}", f"{first.bucket_size} / {first.max_size} / {first.table_size}",
                     f"{first.hash_mb:.1f}"]
                    + [fmt_stat(Stat.of([getattr(r, key) for r in mine]), unit=unit, digits=None)
                       for _, key, unit in COLUMNS]
                    + ["yes" if all(r.nginx_t_clean for r in mine) else "NO", str(len(mine))])
    headers = ["ids", "map MB", "bucket / max_size / table", "hash MB", *(c[0] for c in COLUMNS), "nginx -t clean",
               "runs"]
    align = ">>>>" + ">" * len(COLUMNS) + "<>"
    env = data["environment"]
    intro = (f"nginx {env.get('nginx')}, {env.get('nproc')} cores ({env.get('cpu_model')}), load at start "
             f"{', '.join(f'{x:.1f}' for x in env.get('loadavg_at_start', []))}; {data['arguments']['workers']} nginx "
             "worker(s). Median (low–high) over interleaved repeats; '~' marks a spread above the noise threshold. "
             "Only the map, index.json and the one file asked for exist on disk.")
    if markdown:
        return ["# nginx id map: build, start and memory by id count", "", intro, ""] + md_table(headers, rows, align)
    return [intro, ""] + table(headers, rows, align)


# --------------------------------------------------------------------------- CLI


# The ranges of map-scale's options (each checked while parsing and shown in the help).
COUNTS = CommaList(ds.LIMITS["small_count"], "id count")
REPEATS = Ints(1, 50)
WORKERS = Ints(1, 64)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"{PROG} map-scale", description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=COUNTS, default=DEFAULT_COUNTS,
                   help=f"comma-separated id counts, each {COUNTS.item} (default {','.join(map(str, DEFAULT_COUNTS))})")
    p.add_argument("--repeats", type=REPEATS, default=3, help=f"interleaved repeats ({REPEATS}; default 3)")
    p.add_argument("--workers", type=WORKERS, default=1,
                   help=f"nginx worker processes ({WORKERS}; default 1, the layouts' default)")
    p.add_argument("--out", help="output directory (default results/<timestamp>-mapscale)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    counts, repeats, workers = list(args.counts), args.repeats, args.workers
    try:
        out = prepare_out(args.out, "-mapscale")
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    command = "uwsgi-layouts map-scale " + shlex.join(argv if argv is not None else sys.argv[1:])
    data = {"format_version": FORMAT_VERSION, "kind": "mapscale", "environment": capture(),
            "arguments": {"counts": counts, "repeats": repeats, "workers": workers, "command": command}, "runs": []}
    started = time.monotonic()
    import numpy  # noqa: F401  (write_map's replay of nginx's search: imported once, outside the timings)

    data["environment"]["numpy_import_s"] = time.monotonic() - started
    with Lab() as lab:
        for repeat in range(1, repeats + 1):
            for ids in counts:
                run = measure(lab, ids, repeat, workers)
                data["runs"].append(asdict(run))
                (out / RESULTS_NAME).write_text(json.dumps(data, indent=1) + "\n")
                print(f"[{repeat}/{repeats}] {ids} ids: map {run.map_s:.2f} s, nginx -t {run.nginx_t_s:.2f} s, start "
                      f"{run.start_s:.3f} s, PSS {run.pss_mb:.1f} MB", flush=True)
    (out / "report.md").write_text("\n".join(report_lines(data, markdown=True)) + "\n")
    print("\n".join(["", *report_lines(data)]))
    print(f"\nwrote {out / RESULTS_NAME} and report.md in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
