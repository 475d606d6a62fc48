"""Open loop: offer a fixed request rate, step it up until replies fall behind; report the knee.

wrk is closed-loop: each connection waits for its answer before asking again, so an
overloaded server just slows the clients down. httperf (as in the "finding nginx's async
limit" article) instead opens new connections at a fixed rate R whatever happens, one
request each, so a server that cannot keep up shows it: replies lag, time out or fail.

    python -m bench openloop --layout 2x4-mapped --rates 10,20,40 --step 15 [--path /?...]

Per step, httperf runs ``--rate R --num-conns R*step --num-calls 1`` and samples the reply
rate every 5 s. A step **passes** when replies >= 99% of requests, the lowest reply-rate
sample >= 95% of R (the first sample is left out when there are others: it holds the
ramp-up, see ``steady_min``), and there is no server-side error (4xx/5xx, client timeouts, refused or
reset connections); a client-side error (fd-unavail, addrunavail, ftab-full, other) makes
the step **invalid**: the client, not the server, was the limit. The knee is the last rate
that passed before the first one that did not (stepping stops there unless ``--all``).

httperf busy-polls: it keeps one core at ~100% whatever the rate. On a small machine that
core is taken from the server, so httperf runs under ``nice 19`` by default (the server
wins when both want the CPU) and every step records httperf's own CPU share.

Writes ``openloop.json`` (the steps, the knee, the environment; ``python -m bench report``
re-renders it), ``report.txt``, ``report.md`` and httperf's raw output under ``raw/``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

FORMAT_VERSION = 1
KIND = "openloop"
DEFAULT_PATH = "/?rounds=5&fib=25&io_ms=10"  # the article's request
DEFAULT_RATES = (5, 10, 15, 20, 25, 30, 40)
MIN_STEP_S = 15  # httperf samples the reply rate every 5 s: at least 2 full samples
REPLIES_OF_REQUESTS = 0.99
MIN_RATE_OF_TARGET = 0.95
INSTALL_HINT = "httperf is not installed: apt-get install httperf (or run scripts/install-system-deps.sh)"

# httperf 0.9.0's summary lines (its exit code is 0 whatever happened).
RE_TOTAL = re.compile(r"Total: connections (\d+) requests (\d+) replies (\d+) test-duration ([\d.]+) s")
RE_REPLY_RATE = re.compile(
    r"Reply rate \[replies/s\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) stddev ([\d.]+) \((\d+) samples\)")
RE_STATUS = re.compile(r"Reply status: 1xx=(\d+) 2xx=(\d+) 3xx=(\d+) 4xx=(\d+) 5xx=(\d+)")
RE_ERRORS = re.compile(r"Errors: total (\d+) client-timo (\d+) socket-timo (\d+) connrefused (\d+) connreset (\d+)")
RE_CLIENT_ERRORS = re.compile(r"Errors: fd-unavail (\d+) addrunavail (\d+) ftab-full (\d+) other (\d+)")
RE_CONN_TIME = re.compile(
    r"Connection time \[ms\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) median ([\d.]+) stddev ([\d.]+)")
RE_REQUEST_RATE = re.compile(r"Request rate: ([\d.]+) req/s")
RE_SAMPLE = re.compile(r"^reply-rate = ([\d.]+)", re.MULTILINE)  # one per 5-s sample, with --verbose
RE_CPU = re.compile(r"CPU time \[s\]: user ([\d.]+) system ([\d.]+) \(user ([\d.]+)% system ([\d.]+)% "
                    r"total ([\d.]+)%\)")

SERVER_ERRORS = ("client_timo", "socket_timo", "connrefused", "connreset")
CLIENT_ERRORS = ("fd_unavail", "addrunavail", "ftab_full", "other")


class OpenLoopError(ValueError):
    """Unusable httperf output or results file; the message says what is missing."""


# --------------------------------------------------------------------------- parsing and judging


def parse_httperf(text: str) -> dict:
    """httperf's summary as a dict; raise OpenLoopError naming the first line that is missing."""

    def need(regex: re.Pattern, what: str) -> re.Match:
        m = regex.search(text)
        if m is None:
            raise OpenLoopError(f"httperf output has no '{what}' line")
        return m

    total = need(RE_TOTAL, "Total: connections")
    rate = need(RE_REPLY_RATE, "Reply rate")
    status = need(RE_STATUS, "Reply status")
    errors = need(RE_ERRORS, "Errors: total")
    client = need(RE_CLIENT_ERRORS, "Errors: fd-unavail")
    out = {
        "connections": int(total[1]), "requests": int(total[2]), "replies": int(total[3]),
        "test_duration_s": float(total[4]),
        "reply_rate": {"min": float(rate[1]), "avg": float(rate[2]), "max": float(rate[3]),
                       "stddev": float(rate[4]), "samples": int(rate[5])},
        "status": {k: int(v) for k, v in zip(("1xx", "2xx", "3xx", "4xx", "5xx"), status.groups(), strict=True)},
        "errors": {"total": int(errors[1]), "client_timo": int(errors[2]), "socket_timo": int(errors[3]),
                   "connrefused": int(errors[4]), "connreset": int(errors[5]),
                   **{k: int(v) for k, v in zip(CLIENT_ERRORS, client.groups(), strict=True)}},
    }
    if m := RE_CONN_TIME.search(text):
        out["connection_ms"] = dict(zip(("min", "avg", "max", "median", "stddev"), map(float, m.groups()),
                                        strict=True))
    if m := RE_REQUEST_RATE.search(text):
        out["request_rate"] = float(m[1])
    if m := RE_CPU.search(text):
        out["client_cpu_pct"] = float(m[5])
    samples = [float(x) for x in RE_SAMPLE.findall(text)]
    if samples:
        out["reply_rate"]["each"] = samples
    return out


def steady_min(parsed: dict) -> float:
    """The lowest reply-rate sample, leaving out the first when there are others: the first
    5-s window holds the ramp-up (no reply comes back before one response time has passed),
    which at low rates alone costs more than 5% of the window. Without per-sample figures
    (httperf run without --verbose), httperf's own min."""
    each = parsed["reply_rate"].get("each") or []
    if len(each) >= 2:
        return min(each[1:])
    return parsed["reply_rate"]["min"]


def judge(rate: float, parsed: dict) -> tuple[str, list[str]]:
    """("pass" | "fail" | "invalid", reasons) for one step at ``rate`` (see the module doc)."""
    e = parsed["errors"]
    client = {k: e[k] for k in CLIENT_ERRORS if e[k]}
    if client:
        return "invalid", ["client-side errors " + ", ".join(f"{k}={v}" for k, v in client.items())
                           + ": the load generator, not the server, was the limit"]
    reasons = []
    if parsed["reply_rate"]["samples"] == 0:
        return "invalid", ["no reply-rate sample (httperf samples every 5 s): use a longer --step"]
    if parsed["replies"] < REPLIES_OF_REQUESTS * parsed["requests"]:
        reasons.append(f"replies {parsed['replies']} < {REPLIES_OF_REQUESTS:.0%} of {parsed['requests']} requests")
    low = steady_min(parsed)
    if low < MIN_RATE_OF_TARGET * rate:
        reasons.append(f"min reply rate {low:g}/s < {MIN_RATE_OF_TARGET:.0%} of {rate:g}/s")
    server = {k: e[k] for k in SERVER_ERRORS if e[k]}
    bad_status = {k: parsed["status"][k] for k in ("4xx", "5xx") if parsed["status"][k]}
    if server or bad_status:
        reasons.append("server-side errors " + ", ".join(f"{k}={v}" for k, v in {**bad_status, **server}.items()))
    return ("fail" if reasons else "pass"), reasons


def find_knee(steps: list[dict]) -> dict:
    """The last passing rate before the first step that did not pass."""
    last_pass, first_bad = None, None
    for step in sorted(steps, key=lambda s: s["rate"]):
        if step["verdict"] == "pass":
            last_pass = step
            continue
        first_bad = step
        break
    if first_bad is None:
        status = "not reached" if last_pass else "no steps"
    elif first_bad["verdict"] == "invalid":
        status = "client-limited"
    else:
        status = "found" if last_pass else "below the first rate"
    return {"rate": last_pass["rate"] if last_pass else None,
            "next_rate": first_bad["rate"] if first_bad else None,
            "next_verdict": first_bad["verdict"] if first_bad else None,
            "next_reasons": first_bad["reasons"] if first_bad else [],
            "status": status}


# --------------------------------------------------------------------------- running


def httperf_command(port: int, path: str, rate: float, step_s: float, timeout_s: float, nice: int = 19,
                    wlog: Path | None = None) -> list[str]:
    conns = max(1, round(rate * step_s))
    cmd = ["nice", "-n", str(nice)] if nice else []
    cmd += [shutil.which("httperf") or "httperf", "--verbose", "--hog", "--server", "127.0.0.1", "--port", str(port),
            "--rate", f"{rate:g}", "--num-conns", str(conns), "--num-calls", "1", "--timeout", f"{timeout_s:g}"]
    cmd += [f"--wlog=y,{wlog}"] if wlog else ["--uri", path]
    return cmd


def run_step(cmd: list[str], limit_s: float) -> str:
    """Run httperf once; its complete output (stdout + stderr) with the command line on top."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise OpenLoopError(f"httperf did not finish within {limit_s:.0f} s") from None
    return f"$ {' '.join(cmd)}\n{out}{err}"


def measure(args, layout_spec: str, rates: list[float], out: Path, progress=print, steps=None) -> dict:
    """Start the layout's stack once, warm it up, run every step; return the results dict.

    ``steps``: a list the measured steps are appended to as they finish (kept on interruption)."""
    from bench.cli import prepare_dataset
    from bench.environment import capture
    from bench.measure import LiveRunner, find_free_ports, tree_cpu_seconds
    from bench.wrk import WrkProcess, run_wrks
    from deploy.layout import parse_variant
    from deploy.render import write_layout
    from deploy.stack import Stack

    options = {"transport": args.transport or "tcp"}
    wlog = None
    index = None
    if args.files:
        index = prepare_dataset(Path(args.data_dir))
        options.update({"data_dir": str(index.root), "sendfile": "on"})
    sockets = len(parse_variant(layout_spec, run_dir="/tmp/x").sockets)
    work_dir = Path(tempfile.mkdtemp(prefix="ul-bench-", dir="/tmp"))
    work_dir.chmod(0o711)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    steps = [] if steps is None else steps
    try:
        runner = LiveRunner(work_dir, raw, find_free_ports(sockets + 1), {}, 0, 0, args.timeout,
                            layout_options=options)
        layout = runner.layout(layout_spec)
        if index is not None:
            from bench.files import write_wlog

            wlog = write_wlog(index, args.files, work_dir / "wlog", seed=0)
        write_layout(layout, layout.run_dir)
        with Stack(layout) as stack:
            warm_url = f"http://{layout.listen}{args.path}" if not index else layout.url + "healthz"
            run_wrks(WrkProcess(warm_url, 1, args.warmup, timeout_s=args.timeout))
            for rate in rates:
                cmd = httperf_command(layout.listen_port, args.path, rate, args.step, args.timeout,
                                      nice=args.client_nice, wlog=wlog)
                cpu0 = tree_cpu_seconds(stack.pids["uwsgi"]) + tree_cpu_seconds(stack.pids["nginx"])
                text = run_step(cmd, args.step * 2 + args.timeout + 30)
                cpu1 = tree_cpu_seconds(stack.pids["uwsgi"]) + tree_cpu_seconds(stack.pids["nginx"])
                stack.check_alive()
                name = f"step-{rate:g}.txt"
                (raw / name).write_text(text)
                parsed = parse_httperf(text)
                verdict, reasons = judge(rate, parsed)
                seconds = parsed["test_duration_s"]
                step = {"rate": rate, "num_conns": max(1, round(rate * args.step)), **parsed,
                        "server_cpu_cores": (cpu1 - cpu0) / seconds if seconds else 0.0,
                        "verdict": verdict, "reasons": reasons, "raw_output": f"raw/{name}"}
                steps.append(step)
                progress(step_line(step))
                if verdict != "pass" and not args.all:
                    break
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return results_dict(args, steps, capture())


def results_dict(args, steps: list[dict], environment: dict) -> dict:
    return {
        "format_version": FORMAT_VERSION, "kind": KIND,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment | {"httperf": httperf_version()},
        "arguments": {"layout": args.layout, "rates": list(args.rates), "step_s": args.step, "path": args.path,
                      "files": args.files or "", "data_dir": args.data_dir if args.files else "",
                      "timeout_s": args.timeout, "client_nice": args.client_nice, "warmup_s": args.warmup,
                      "all": bool(args.all), "transport": args.transport or "tcp",
                      "command": "python -m bench " + shlex.join(sys.argv[1:] if sys.argv[1:2] == ["openloop"]
                                                                 else ["openloop"])},
        "steps": steps,
        "knee": find_knee(steps),
    }


def httperf_version() -> str:
    try:
        out = subprocess.run(["httperf", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"httperf-([\w.]+)", out.stdout + out.stderr)
    return m[1] if m else ""


# --------------------------------------------------------------------------- results file


def save(data: dict, path: Path) -> Path:
    from bench.exporters import write_text_atomic

    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def load(path: Path | str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OpenLoopError(f"{path}: cannot read open-loop JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise OpenLoopError(f"{path}: not an open-loop results file")
    if data.get("format_version") != FORMAT_VERSION:
        raise OpenLoopError(f"{path}: format_version {data.get('format_version')!r} is not supported "
                            f"(this tool reads {FORMAT_VERSION})")
    if not isinstance(data.get("steps"), list):
        raise OpenLoopError(f"{path}: steps must be a list")
    for step in data["steps"]:
        for key in ("rate", "requests", "replies", "reply_rate", "status", "errors", "verdict"):
            if key not in step:
                raise OpenLoopError(f"{path}: a step lacks {key!r}")
    data["knee"] = find_knee(data["steps"])  # derived: recomputed, never trusted from the file
    return data


def is_openloop_file(path) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return re.search(r'"kind"\s*:\s*"openloop"', head) is not None


# --------------------------------------------------------------------------- report lines


def _errors_text(step: dict) -> str:
    e, s = step["errors"], step["status"]
    parts = [f"{k}={s[k]}" for k in ("4xx", "5xx") if s.get(k)]
    parts += [f"{k.replace('_', '-')}={e[k]}" for k in (*SERVER_ERRORS, *CLIENT_ERRORS) if e.get(k)]
    return ", ".join(parts) or "0"


def step_line(step: dict) -> str:
    r = step["reply_rate"]
    return (f"rate {step['rate']:g}/s: {step['replies']}/{step['requests']} replies, reply rate min {r['min']:g} "
            f"avg {r['avg']:g} max {r['max']:g} ({r['samples']} samples), errors {_errors_text(step)}: "
            f"{step['verdict']}" + (f" ({'; '.join(step['reasons'])})" if step["reasons"] else ""))


def _knee_text(data: dict) -> str:
    k = data["knee"]
    if k["status"] == "found":
        text = (f"knee: {k['rate']:g} req/s, the last offered rate whose replies kept up; at {k['next_rate']:g} "
                f"req/s they fell behind ({'; '.join(k['next_reasons'])})")
    elif k["status"] == "not reached":
        text = f"knee: not reached; every rate up to {k['rate']:g} req/s passed: try higher --rates"
    elif k["status"] == "below the first rate":
        text = (f"knee: below {k['next_rate']:g} req/s, the first rate tried, which already fell behind "
                f"({'; '.join(k['next_reasons'])}): try lower --rates")
    elif k["status"] == "client-limited":
        text = (f"knee: not found; at {k['next_rate']:g} req/s the client was the limit "
                f"({'; '.join(k['next_reasons'])})" + (f"; {k['rate']:g} req/s passed" if k["rate"] else ""))
    else:
        text = "knee: no steps were measured"
    return text + "."


RULE = (f"A step passes when replies >= {REPLIES_OF_REQUESTS:.0%} of requests, the lowest 5-s reply-rate sample "
        f">= {MIN_RATE_OF_TARGET:.0%} of the offered rate (the first sample, which holds the ramp-up, is left out "
        "when there are others), and no server-side error (4xx/5xx, client timeouts, "
        "refused or reset connections); client-side errors (fd-unavail, addrunavail, ftab-full, other) make it "
        "invalid. httperf opens one connection per request at the offered rate, whatever the server does.")


def _rows(data: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["rate/s", "requests", "replies", "reply rate samples", "steady min\n/rate", "conn ms\nmedian/max",
               "errors", "server cores", "httperf CPU", "result"]
    rows = []
    for s in data["steps"]:
        r, c = s["reply_rate"], s.get("connection_ms") or {}
        rows.append([
            f"{s['rate']:g}", str(s["requests"]), str(s["replies"]),
            " ".join(f"{x:g}" for x in r["each"]) if r.get("each") else f"min {r['min']:g} max {r['max']:g}",
            f"{steady_min(s) / s['rate']:.2f}" if s["rate"] else "", f"{c.get('median', 0):g}/{c.get('max', 0):g}"
            if c else "", _errors_text(s), f"{s.get('server_cpu_cores', 0):.2f}",
            f"{s['client_cpu_pct']:.0f}%" if "client_cpu_pct" in s else "", s["verdict"],
        ])
    return headers, rows


def _header(data: dict) -> str:
    a, env = data["arguments"], data.get("environment", {})
    target = f"files ({a['files']}, random ids from the data set)" if a.get("files") else f"GET {a.get('path')}"
    return (f"open loop (httperf {env.get('httperf', '')}, fixed request rate): {a.get('layout')}, {target}, "
            f"steps of {a.get('step_s', 0):g} s" + (f", {env['nproc']} cores" if env.get("nproc") else "")
            + (f", httperf under nice {a['client_nice']}" if a.get("client_nice") else ""))


def terminal_lines(data: dict) -> list[str]:
    from bench.report import _table, _wrap

    out = _wrap(_header(data))
    if data.get("environment", {}).get("_comment"):
        out += _wrap(f"note: {data['environment']['_comment']}")
    out += [""] + _wrap(_knee_text(data)) + [""]
    headers, rows = _rows(data)
    out += _table(headers, rows, "<>>>>><>><")
    for s in data["steps"]:
        if s["reasons"]:
            out += _wrap(f"{s['rate']:g}/s: " + "; ".join(s["reasons"]), indent="  ")
    out += [""] + _wrap(RULE)
    return out


def markdown_lines(data: dict) -> list[str]:
    from bench.report import _md_table

    out = ["# Open-loop benchmark (httperf)", "", _header(data) + ".", ""]
    if data.get("environment", {}).get("_comment"):
        out += [f"> **Note:** {data['environment']['_comment']}", ""]
    out += [f"**{_knee_text(data)}**", "", RULE, ""]
    headers, rows = _rows(data)
    out += _md_table(headers, rows, "<>>>>><>><") + [""]
    reasons = [f"- {s['rate']:g}/s: {'; '.join(s['reasons'])}" for s in data["steps"] if s["reasons"]]
    if reasons:
        out += reasons + [""]
    command = data["arguments"].get("command")
    if command:
        out += ["## How to reproduce", "", "```sh", command, "```", ""]
    out += ["## Environment", ""] + _md_table(["key", "value"], [[k, v if isinstance(v, str) else json.dumps(v)]
                                                                for k, v in data.get("environment", {}).items()])
    return out + [""]


def export(data: dict, out: Path) -> list[Path]:
    from bench.exporters import write_text_atomic

    return [write_text_atomic(out / "report.md", "\n".join(markdown_lines(data)).rstrip("\n") + "\n"),
            write_text_atomic(out / "report.txt", "\n".join(terminal_lines(data)) + "\n")]


# --------------------------------------------------------------------------- CLI


def add_parser(sub) -> None:
    p = sub.add_parser("openloop", help="fixed request rates with httperf, stepped up until replies fall behind")
    p.add_argument("--layout", help="one PxT-STRATEGY (variants as in compare, e.g. 2x4-mapped@nginx_workers=2)")
    p.add_argument("--rates", help=f"comma-separated request rates per second, ascending "
                                   f"(default {','.join(map(str, DEFAULT_RATES))})")
    p.add_argument("--step", help=f"seconds per rate (default and minimum {MIN_STEP_S})")
    p.add_argument("--path", help=f"request path (default {DEFAULT_PATH}, the article's request)")
    p.add_argument("--files", help="instead of --path: random data-set files by route accel, app or static "
                                   "(httperf --wlog, shuffled)")
    p.add_argument("--data-dir", help="with --files: the data set (default build/dataset, created if missing)")
    p.add_argument("--timeout", help="httperf's per-request timeout in seconds (default 5)")
    p.add_argument("--warmup", help="seconds of one-connection warm-up before the first step (default 2)")
    p.add_argument("--client-nice", help="niceness of httperf, which busy-polls a core (default 19; 0 = not niced)")
    p.add_argument("--transport", help="uWSGI sockets: tcp or unix (default tcp)")
    p.add_argument("--all", action="store_true", help="run every rate, not only up to the first that fails")
    p.add_argument("--out", help="output directory (default results/<timestamp>-openloop)")


def resolve_args(args):
    """Validate and fill defaults; raise BadArgument naming the field."""
    from bench.cli import DEFAULT_DATA_DIR, BadArgument, _float, _int
    from deploy.layout import parse_variant

    spec = (args.layout or "2x4-mapped").strip()
    parse_variant(spec, run_dir="/tmp/validate")  # LayoutError names the field
    rates = DEFAULT_RATES if not args.rates else [
        _float("rates", x, 0.1, 100000) for x in str(args.rates).split(",") if x.strip()]
    if not rates:
        raise BadArgument("rates: give at least one rate")
    rates = [int(r) if float(r).is_integer() else float(r) for r in rates]
    if list(rates) != sorted(set(rates)):
        raise BadArgument(f"rates: must be ascending without repeats, got {','.join(map(str, rates))}")
    path = args.path or DEFAULT_PATH
    if not path.startswith("/") or any(c.isspace() for c in path) or len(path) > 2000:
        raise BadArgument(f"path: must start with / and contain no spaces, got {path!r}")
    if args.files and args.files not in ("accel", "app", "static"):
        raise BadArgument(f"files: must be accel, app or static, got {args.files!r}")
    if args.transport not in (None, "tcp", "unix"):
        raise BadArgument(f"transport: must be tcp or unix, got {args.transport!r}")
    return dataclasses.replace(
        _Args(), layout=spec, rates=list(rates), step=_float("step", args.step or MIN_STEP_S, MIN_STEP_S, 600),
        path=path, files=args.files or "", data_dir=str(Path(args.data_dir or DEFAULT_DATA_DIR).absolute()),
        timeout=_float("timeout", args.timeout or 5, 1, 60), warmup=_float("warmup", args.warmup or 2, 1, 60),
        client_nice=_int("client_nice", args.client_nice if args.client_nice is not None else 19, 0, 19),
        transport=args.transport, all=bool(args.all), out=args.out)


@dataclasses.dataclass(frozen=True)
class _Args:
    layout: str = ""
    rates: list = dataclasses.field(default_factory=list)
    step: float = MIN_STEP_S
    path: str = DEFAULT_PATH
    files: str = ""
    data_dir: str = ""
    timeout: float = 5
    warmup: float = 2
    client_nice: int = 19
    transport: str | None = None
    all: bool = False
    out: str | None = None


def cmd_openloop(args) -> int:
    from bench.cli import _prepare_out
    from bench.sweep import timestamp_dir
    from deploy.layout import PROJECT_ROOT

    a = resolve_args(args)
    if not shutil.which("httperf"):
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 1
    if not shutil.which("wrk"):
        print("error: wrk is not installed: run scripts/install-system-deps.sh", file=sys.stderr)
        return 1
    out = _prepare_out(a.out or str(PROJECT_ROOT / "results" / (timestamp_dir() + "-openloop")))
    est = len(a.rates) * (a.step + 2) + a.warmup + 5
    print(f"open loop: {a.layout}, rates {','.join(f'{r:g}' for r in a.rates)} req/s, {a.step:g} s each; at most "
          f"about {est / 60:.1f} min; results in {out}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    steps: list[dict] = []
    try:
        data = measure(a, a.layout, a.rates, out, progress=lambda line: print(line, flush=True), steps=steps)
    except KeyboardInterrupt:
        from bench.environment import capture

        save(results_dict(a, steps, capture()), out / "openloop.json")
        print(f"\ninterrupted: the steps measured so far are in {out / 'openloop.json'}", file=sys.stderr)
        return 130
    except OpenLoopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    save(data, out / "openloop.json")
    written = export(data, out)
    print("\n".join(terminal_lines(data)))
    print(f"\nwrote {out / 'openloop.json'} and {', '.join(p.name for p in written)} in {out}")
    return 0


def cmd_report(args) -> int:
    from bench.cli import BadArgument

    try:
        data = load(args.results)
    except OpenLoopError as exc:
        raise BadArgument(str(exc)) from None
    out = Path(args.out) if args.out else Path(args.results).parent
    out.mkdir(parents=True, exist_ok=True)
    written = export(data, out)
    print("\n".join(terminal_lines(data)))
    print(f"\nwrote {', '.join(p.name for p in written)} in {out}")
    return 0
