"""How fast each uWSGI build runs the app's Python against the python3 executable: fib(25)
(scripts/fib-speed.py) in the project venv's python, in our uWSGI (``--pyrun``) and in every build
of scripts/build-uwsgi.sh under build/uwsgi/ (static, pyuwsgi, o3...), two ways:

- wall time: ``--rounds`` alternating rounds (every interpreter once per round, the order rotated
  each round so that none always runs first), each run fib-speed.py's best of 7; the load average
  before and after. On a busy machine these move with the load: read the best over the rounds.
- instructions (valgrind's callgrind, unless --no-callgrind): the instructions of the script
  with 2 runs of fib(25) minus those with 0 runs, halved: fib(25)'s own instructions, the same
  whatever else the machine does (a count, not a time; it misses what makes an instruction slow,
  such as a mispredicted indirect call through the PLT, so it understates the gap a time shows).
  perf stat's hardware counter would be the direct measure, but VMs often lack it (perf stat -e
  instructions says <not supported> here).

    .venv/bin/python scripts/fib-compare.py [--rounds 7] [--no-callgrind] [--branch-sim] [--builds build/uwsgi]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fib-speed.py"
BEST = re.compile(r"fib\(25\) best of \d+: ([\d.]+) ms")
COLLECTED = re.compile(r"Collected : (\d+)")
# callgrind --branch-sim=yes: "Branches: N (C cond + I ind)" and "Mispredicts: N (C cond + I ind)"
INDIRECT = re.compile(r"(Branches|Mispredicts):\s+[\d,]+\s+\(\s*[\d,]+ cond \+\s*([\d,]+) ind\)")


def interpreters(builds: Path) -> dict[str, list[str]]:
    """name -> the command that runs a Python script in it."""
    venv_bin = ROOT / ".venv" / "bin"
    found = {"python3": [str(venv_bin / "python")], "uwsgi (ours)": [str(venv_bin / "uwsgi"), "--pyrun"]}
    for record in sorted(builds.glob("*/BUILD.json")) if builds.is_dir() else []:
        binary = record.parent / "bin" / "uwsgi"
        if os.access(binary, os.X_OK):
            found[f"uwsgi build {record.parent.name}"] = [str(binary), "--pyrun"]
    return found


def run(command: list[str], runs: int, prefix: list[str] = ()) -> str:
    env = {**os.environ, "FIB_SPEED_RUNS": str(runs)}
    done = subprocess.run([*prefix, *command, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    return done.stdout + done.stderr


def wall_ms(command: list[str]) -> float:
    out = run(command, 7)
    match = BEST.search(out)
    if not match:
        raise SystemExit(f"error: {' '.join(command)} printed no fib(25) time:\n{out[-2000:]}")
    return float(match[1])


def instructions(command: list[str], branch_sim: bool) -> dict[str, float]:
    """fib(25)'s own counts (millions): 2 runs minus 0 runs, halved: instructions, and with
    ``branch_sim`` its indirect branches and their mispredictions (callgrind's simulated predictor)."""
    counts = []
    for runs in (0, 2):
        valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + \
            (["--branch-sim=yes"] if branch_sim else [])
        out = run(command, runs, valgrind)
        match = COLLECTED.search(out)
        if not match:
            raise SystemExit(f"error: callgrind counted nothing for {' '.join(command)}:\n{out[-2000:]}")
        found = {"instructions": int(match[1])}
        found.update({f"indirect {m[1].lower()}": int(m[2].replace(",", "")) for m in INDIRECT.finditer(out)})
        counts.append(found)
    return {k: (counts[1][k] - counts[0][k]) / 2 / 1e6 for k in counts[1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--branch-sim", action="store_true", help="also count indirect branches and mispredictions")
    p.add_argument("--builds", default=str(ROOT / "build" / "uwsgi"))
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if not 1 <= args.rounds <= 100:
        print(f"error: rounds: 1..100, got {args.rounds}", file=sys.stderr)
        return 2
    if not args.no_callgrind and not shutil.which("valgrind"):
        print("error: callgrind: valgrind is not installed (apt-get install valgrind), or give --no-callgrind",
              file=sys.stderr)
        return 2
    found = interpreters(Path(args.builds))
    names = list(found)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(wall_ms(found[name]))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.1f}" for n in names), flush=True)
    load_after_wall = os.getloadavg()
    counted = {} if args.no_callgrind else {n: instructions(found[n], args.branch_sim) for n in names}
    base_ms = min(times["python3"])
    print(f"\nload average (1 min) {load_before[0]:.2f} before, {load_after_wall[0]:.2f} after the wall-time rounds, "
          f"{os.getloadavg()[0]:.2f} at the end ({os.cpu_count()} cores)")
    kinds = list(counted["python3"]) if counted else []
    print("| interpreter | fib(25) ms, best / median of the rounds | best / python3's best | " +
          "".join(f"fib(25) {k} (callgrind), M, and / python3's | " for k in kinds))
    print("|---|---|---|" + "---|" * len(kinds))
    for n in names:
        cells = "".join(f"{counted[n][k]:.2f} ({counted[n][k] / counted['python3'][k]:.3f}x) | " for k in kinds)
        print(f"| {n} | {min(times[n]):.1f} / {statistics.median(times[n]):.1f} | {min(times[n]) / base_ms:.2f}x | "
              f"{cells}")
    if args.json:
        Path(args.json).write_text(json.dumps({"commands": found, "ms": times, "instructions_m": counted,
                                               "loadavg": [load_before, load_after_wall, os.getloadavg()]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
