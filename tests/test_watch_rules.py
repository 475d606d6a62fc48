"""watch's alert rules and dashboard, checked by Prometheus's own promtool (Debian's package):
`promtool check rules` on the generated file, and `promtool test rules` proving that each alert
fires on a series that shows its trouble (the pile-up share is the one a real 2x4-shared showed
here, 0.86; 2x4-mapped showed 0) and stays silent on a healthy one, or on a short spike. Every
expression of the dashboard is checked by promtool too, and names only metrics watch exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from uwsgi_layouts.bench.watch import METRICS, PREFIX, alerts, dashboard_json, expressions, rules_yaml

PROMTOOL = "/usr/bin/promtool"
P99_S = 0.25
RULES = "uwsgi-layouts-watch.rules.yml"
SOCKET = "/run/shop/blue/uwsgi-0.sock"
pytestmark = pytest.mark.timeout(120)


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_check_rules_passes(tmp_path):
    (tmp_path / RULES).write_text(rules_yaml(P99_S))
    proc = promtool("check", "rules", str(tmp_path / RULES))
    assert proc.returncode == 0 and "SUCCESS: 6 rules found" in proc.stdout, proc.stdout + proc.stderr


def rendered(name: str, value: str = "", socket: str = "") -> dict:
    """The annotations Prometheus renders for alert ``name`` (the templates' value, socket filled)."""
    alert = next(a for a in alerts(P99_S) if a.name == name)

    def fill(text: str) -> str:
        text = re.sub(r"\{\{ \$value( \| humanize\w+)? \}\}", value, text)
        return text.replace("{{ $labels.socket }}", socket)

    return {"summary": fill(alert.summary), "description": fill(alert.description)}


def series(name: str, values: str, **labels: str) -> dict:
    shown = ", ".join(f'{k}="{v}"' for k, v in sorted({"job": "watch", **labels}.items()))
    return {"series": f"{PREFIX}{name}{{{shown}}}", "values": values}


def latency_buckets(instance: str, filled_le: str) -> list[dict]:
    """Ten answers per 15 s, all in the bucket ``filled_le`` (and every bucket above it)."""
    out = []
    for le in ("0.1", "0.4", "0.5", "+Inf"):
        grows = le == "+Inf" or float(le) >= float(filled_le)
        out.append(series("upstream_response_seconds_bucket", "0+10x80" if grows else "0x80", instance=instance,
                          le=le, status_class="2xx", upstream=f"unix:{SOCKET}"))
    return out


# Each alert: the series (15 s apart, 20 minutes), and at 20 minutes the one alert expected, with
# the value its annotations show. Every case has a healthy series beside the troubled one.
CASES = {
    "UwsgiPileUp": ([series("pileup_share", "0.86x80", instance="shared"),
                     series("pileup_share", "0x80", instance="mapped"),
                     series("pileup_share", "0.5x20 0x60", instance="spike")],  # 5 minutes, then none
                    {"instance": "shared"}, "86%", ""),
    "AcceptQueueFull": ([series("listen_queue_max", "100x80", instance="a", socket=SOCKET),
                         series("listen_backlog", "100x80", instance="a", socket=SOCKET),
                         series("listen_queue_max", "3x80", instance="b", socket=SOCKET),
                         series("listen_backlog", "100x80", instance="b", socket=SOCKET)],
                        {"instance": "a", "socket": SOCKET}, "100", SOCKET),
    "AcceptQueueGrowing": ([series("listen_queue_max", "1+1x80", instance="a", socket=SOCKET),
                            series("listen_queue_max", "5x80", instance="b", socket=SOCKET),
                            series("listen_queue_max", "0x80", instance="c", socket=SOCKET)],
                           {"instance": "a", "socket": SOCKET}, "", SOCKET),
    "EveryWorkerBusy": ([series("all_busy_share", "0.5x80", instance="full"),
                         series("all_busy_share", "0.05x80", instance="fine")],
                        {"instance": "full"}, "50%", ""),
    "ServerErrors": ([series("responses_total", "0+100x80", instance="bad", status_class="2xx"),
                      series("responses_total", "0+5x80", instance="bad", status_class="5xx"),
                      series("responses_total", "0+100x80", instance="good", status_class="2xx"),
                      series("responses_total", "0x80", instance="good", status_class="5xx")],
                     {"instance": "bad"}, "4.762%", ""),
    "LatencyP99High": (latency_buckets("slow", "0.5") + latency_buckets("fast", "0.1"),
                       {"instance": "slow"}, "499ms", ""),
}


def test_promtool_test_rules_each_alert_fires_on_trouble_and_not_on_health(tmp_path):
    (tmp_path / RULES).write_text(rules_yaml(P99_S))
    tests = []
    for name, (input_series, labels, value, socket) in CASES.items():
        expected = {**labels, "job": "watch", "severity": next(a.severity for a in alerts(P99_S) if a.name == name)}
        if name in ("ServerErrors", "LatencyP99High"):  # sum by (instance): only the instance is left
            expected.pop("job")
        tests.append({"interval": "15s", "input_series": input_series, "alert_rule_test": [
            {"eval_time": "20m", "alertname": name,
             "exp_alerts": [{"exp_labels": expected, "exp_annotations": rendered(name, value, socket)}]},
            # 30 s into the trouble nothing has been sustained long enough (the shortest `for` is 1m)
            {"eval_time": "30s", "alertname": name, "exp_alerts": []},
        ]})
    (tmp_path / "alerts.test.yml").write_text(json.dumps({"rule_files": [RULES], "evaluation_interval": "15s",
                                                          "tests": tests}, indent=1))
    proc = promtool("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert set(CASES) == {a.name for a in alerts(P99_S)}, "every alert has its case"


def test_promtool_test_rules_would_catch_an_alert_that_never_fires(tmp_path):
    """The check above can fail: with the pile-up threshold above every value, the test fails."""
    never = rules_yaml(P99_S).replace(f"{PREFIX}pileup_share >= 0.1", f"{PREFIX}pileup_share >= 2")
    (tmp_path / RULES).write_text(never)
    input_series, labels, value, _ = CASES["UwsgiPileUp"]
    test = {"interval": "15s", "input_series": input_series, "alert_rule_test": [
        {"eval_time": "20m", "alertname": "UwsgiPileUp",
         "exp_alerts": [{"exp_labels": {**labels, "job": "watch", "severity": "warning"},
                         "exp_annotations": rendered("UwsgiPileUp", value)}]}]}
    (tmp_path / "t.yml").write_text(json.dumps({"rule_files": [RULES], "evaluation_interval": "15s", "tests": [test]}))
    proc = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


def test_every_dashboard_and_rule_expression_is_valid_promql_over_watchs_metrics(tmp_path):
    exprs = expressions(P99_S)
    recording = {"groups": [{"name": "exprs", "rules": [{"record": f"check:expr_{i}", "expr": e}
                                                          for i, e in enumerate(exprs)]}]}
    (tmp_path / "exprs.yml").write_text(json.dumps(recording))
    proc = promtool("check", "rules", str(tmp_path / "exprs.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    known = {PREFIX + n + suffix for n, (kind, _) in METRICS.items()
             for suffix in {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}[kind]}
    used = {m for e in exprs for m in re.findall(rf"\b{PREFIX}\w+", e)}
    assert used and used <= known, used - known
    board = json.loads(dashboard_json(P99_S))
    assert board["uid"] and len(board["panels"]) >= 10
    assert {t["datasource"]["uid"] for p in board["panels"] for t in p["targets"]} == {"${datasource}"}


def test_watch_rules_command_writes_both_files_and_never_overwrites(tmp_path):
    out = tmp_path / "rules"
    cmd = [sys.executable, "-m", "uwsgi_layouts", "watch-rules", "--p99-ms", "300", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "histogram_quantile(0.99" in (out / RULES).read_text() and "> 0.3\"" in (out / RULES).read_text()
    json.loads((out / "uwsgi-layouts-watch.dashboard.json").read_text())
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and again.stderr.startswith("error: out:") and again.stderr.count("\n") == 1
    bad = subprocess.run([*cmd[:-4], "--p99-ms", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("uwsgi-layouts watch-rules: error: argument --p99-ms: must be a number in 1..600000")
