"""`bundle --target kubernetes` sized by measurements: the app container's resources from the
layout's @cpus/@memory or tune's results (--from-tune), the autoscaler from a capacity plan
(--plan), headers naming them, and the exporter sidecar (--watch-sidecar). Bad input: one line, exit 2,
nothing written. The manifests validate against Kubernetes' schemas (kubernetes-validate).
Building and running them: tests/integration/test_bundle_kubernetes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.test_container_bundle import KUBERNETES_VERSION, make_app, manifests, run_bundle
from uwsgi_layouts.bench.report.limits import MEMORY_REQUEST_MARGIN, pod_record
from uwsgi_layouts.deploy.ship.container.files import WATCH_DISTRIBUTIONS

MIB = 2**20


def bundle_args(app: Path, out: Path, layout: str = "2x4-mapped", *extra: str) -> list[str]:
    return [layout, "--target", "kubernetes", "--app", "shop:app", "--app-dir", str(app), "--out", str(out), *extra]


def write_tune(root: Path, layout: str = "2x4-mapped", cpus: float = 1.0, memory: int | None = 512,
               pss_mb: float | None = 80.0, complete: bool = True, pod: bool = True) -> Path:
    """A tune results directory as `tune --cpus 1 --memory 512` leaves it (the fields read)."""
    directory = root / "tune-run"
    directory.mkdir()
    arguments = {"cpus": cpus, "memory": memory, "complete": complete,
                 "tune": {"recommended": {"dir": "recommended", "layout": layout}}}
    if pod:
        arguments["tune"]["pod"] = pod_record(arguments, layout, pss_mb)
    (directory / "results.json").write_text(json.dumps({"kind": "tune", "arguments": arguments}))
    return directory


def write_plan(root: Path, layout: str = "2x4-mapped@cpus=1", cpus: float | None = 1.0, replicas: int = 3,
               cpu_target: float | None = 0.55, busy_target: float | None = 0.62) -> Path:
    """plan.json as `uwsgi-layouts plan --layout 2x4-mapped@cpus=1 --rate 100 --p99-ms 250` writes it."""
    path = root / "plan.json"
    plan = {"layout": layout, "cpus": cpus, "target_rate": 100.0, "target_p99_ms": 250.0, "headroom": 0.8,
            "spare": 1, "per_replica_rate": 45.0, "design_rate": 36.0, "replicas": replicas, "cpu_target": cpu_target,
            "busy_target": busy_target, "pss_mb": 80.0, "memory_request_mb": 100.0}
    path.write_text(json.dumps({"format_version": 1, "kind": "plan", "plan": plan}))
    return path


def written(tmp_path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "out"
    proc = run_bundle(*bundle_args(make_app(tmp_path), out, *args))
    assert proc.returncode == 0, proc.stderr
    found = manifests(out)
    for doc in found.values():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    return out, found


def app_resources(found: dict) -> dict:
    return found["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]


def header(path: Path) -> str:
    return "\n".join(path.read_text().splitlines()[:5])


def test_resources_from_the_layouts_limits(tmp_path):
    out, found = written(tmp_path, "2x4-mapped@cpus=1.5,memory=300,replicas=3")
    assert app_resources(found) == {"requests": {"cpu": "1500m", "memory": "300Mi"},
                                    "limits": {"cpu": "1500m", "memory": "300Mi"}}
    hpa = found["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 4)
    for rel in ("kubernetes/deployment.yaml", "kubernetes/hpa.yaml", "image/uwsgi.ini", "README.md"):
        head = header(out / rel)
        assert "layout 2x4-mapped@cpus=1.5,memory=300,replicas=3" in head, (rel, head)
        assert "CPU from the layout's @cpus=1.5, memory from the layout's @memory=300." in head, (rel, head)
        assert "Replicas (3-4, CPU target 70%): the layout's @replicas (no plan)." in head, (rel, head)
    assert "processes = 2" in (out / "image/uwsgi.ini").read_text()  # the shape, not the variant, is rendered


def test_an_option_that_agrees_with_the_layout_is_taken(tmp_path):
    _, found = written(tmp_path, "2x4-mapped@cpus=1,memory=512", "--cpus", "1000m", "--memory", "512Mi")
    assert app_resources(found)["limits"] == {"cpu": "1", "memory": "512Mi"}


def test_resources_from_tune(tmp_path):
    tune = write_tune(tmp_path)
    out, found = written(tmp_path, "2x4-mapped", "--from-tune", str(tune))
    # PSS 80 MB + 25% = 100 MB = 95.4 MiB: the request is 96Mi, the limit the 512 MiB tune ran under.
    assert app_resources(found) == {"requests": {"cpu": "1", "memory": "96Mi"},
                                    "limits": {"cpu": "1", "memory": "512Mi"}}
    head = header(out / "kubernetes/deployment.yaml")
    assert f"tune results {tune} (2x4-mapped for 1 CPU, memory limit 512 MiB, memory request 100 MB (PSS after " \
           "load 80 MB + 25%))" in head, head
    assert "memory request 96Mi, limit 512Mi" in head, head


def test_tune_without_a_memory_limit_gives_its_request_as_the_limit(tmp_path):
    _, found = written(tmp_path, "2x4-mapped", "--from-tune", str(write_tune(tmp_path, memory=None, pss_mb=160.0)))
    # 160 MB + 25% = 200 MB = 190.7 MiB
    assert app_resources(found)["requests"]["memory"] == app_resources(found)["limits"]["memory"] == "191Mi"


def test_the_autoscaler_from_a_plan(tmp_path):
    plan = write_plan(tmp_path)
    out, found = written(tmp_path, "2x4-mapped@cpus=1,memory=512", "--plan", str(plan))
    hpa = found["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 6)
    # The app container's CPU, not the pod's average: nginx's idle CPU would dilute it.
    assert hpa["metrics"] == [{"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": "app", "target": {"type": "Utilization", "averageUtilization": 55}}}]
    assert found["Deployment"]["spec"]["replicas"] == 3
    text = (out / "kubernetes/hpa.yaml").read_text()
    assert f"plan {plan} (3 replicas of 2x4-mapped@cpus=1 for 100 req/s within p99 250 ms" in text
    assert "busy-thread ratio at its design rate was 0.62" in text
    _, again = written(tmp_path / "again", "2x4-mapped@cpus=1,memory=512", "--plan", str(plan), "--max-replicas", "10")
    assert again["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 10


def test_the_exporter_sidecar(tmp_path):
    out, found = written(tmp_path, "2x4-mapped@cpus=1,memory=512", "--watch-sidecar")
    assert sorted(found) == ["Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget", "Service"]
    pod = found["Deployment"]["spec"]["template"]
    app, nginx, watch = pod["spec"]["containers"]
    assert watch["name"] == "watch" and watch["image"] == "localhost/shop-watch:latest"
    assert watch["args"] == ["--stats", "/run/uwsgi-stats/stats.sock", "--access-log-socket",
                             "/run/uwsgi-layouts-log/access.sock", "--listen", "0.0.0.0:9717", "--allow-public-listen"]
    ctx = watch["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["readOnlyRootFilesystem"]) == (10003, 10000, True)
    assert {"name": "shop-uwsgi-stats", "mountPath": "/run/uwsgi-stats", "readOnly": True} in watch["volumeMounts"]
    assert {"name": "shop-access-log", "mountPath": "/run/uwsgi-layouts-log"} in nginx["volumeMounts"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9717"
    policy = found["NetworkPolicy"]["spec"]
    assert policy["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}]},
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
         "ports": [{"protocol": "TCP", "port": 9717}]}]
    site = (out / "image/nginx/site.conf").read_text()
    assert "access_log syslog:server=unix:/run/uwsgi-layouts-log/access.sock,nohostname uwsgi_layouts_shop_timed;" \
        in site
    containerfile = (out / "image/Containerfile").read_text()
    assert "FROM ${WATCH_BASE_IMAGE} AS watch" in containerfile and "chmod 0750 /run/uwsgi-stats" in containerfile
    assert (out / "image/watch/uwsgi_layouts/bench/watchcli.py").is_file()
    assert not list((out / "image/watch").rglob("__pycache__"))
    pins = [line for line in (out / "image/watch/requirements.txt").read_text().splitlines()
            if not line.startswith("#")]
    assert [p.partition("==")[0] for p in pins] == list(WATCH_DISTRIBUTIONS) and all("==" in p for p in pins)


def test_a_pod_local_exporter_has_no_scrape_annotations(tmp_path):
    _, found = written(tmp_path, "2x4-mapped@cpus=1,memory=512", "--watch-sidecar", "--watch-listen", "127.0.0.1:9800",
                       "--metrics-namespace", "prom")
    pod = found["Deployment"]["spec"]["template"]
    assert "annotations" not in pod["metadata"]
    assert pod["spec"]["containers"][2]["args"][-2:] == ["--listen", "127.0.0.1:9800"]
    assert found["NetworkPolicy"]["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "prom"}


def test_without_the_exporter_the_stats_directory_stays_the_apps(tmp_path):
    out, found = written(tmp_path, "2x4-mapped@cpus=1,memory=512")
    assert "NetworkPolicy" not in found and not (out / "image/watch").exists()
    assert "chmod 0700 /run/uwsgi-stats" in (out / "image/Containerfile").read_text()
    assert "syslog:" not in (out / "image/nginx/site.conf").read_text()


def test_watch_distributions_are_what_watch_imports():
    """The exporter image installs WATCH_DISTRIBUTIONS: exactly what `uwsgi-layouts watch` imports."""
    probe = ("import sys, importlib.metadata as md; before = set(sys.modules); import uwsgi_layouts.bench.watchcli; "
             "dists = md.packages_distributions(); "
             "names = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names); "
             "print(sorted({d for n in names for d in dists.get(n, [])} - {'uwsgi-layouts', 'uwsgi_layouts'}))")
    found = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                      timeout=60).stdout.replace("'", '"'))
    assert sorted(d.lower() for d in found) == sorted(d.lower() for d in WATCH_DISTRIBUTIONS)


def test_pod_record_is_the_pod_lines_figures():
    record = pod_record({"cpus": 1.0, "memory": 512}, "2x2-mapped", 23.04)
    assert record == {"layout": "2x2-mapped", "cpus": 1.0, "memory_mb": 512, "pss_mb": 23.0,
                      "memory_request_mb": round(23.04 * (1 + MEMORY_REQUEST_MARGIN), 1),
                      "memory_margin": MEMORY_REQUEST_MARGIN}
    assert pod_record({"cpus": None, "memory": None}, "2x2-mapped", 23.0) is None


BAD = [
    ("cpus-disagree", "2x4-mapped@cpus=1,memory=512", ["--cpus", "2"], "cpus",
     "--cpus 2 says 2 CPU but the layout's @cpus=1 says 1 CPU"),
    ("memory-disagree", "2x4-mapped@cpus=1,memory=512", ["--memory", "1Gi"], "memory",
     "--memory 1Gi says 1Gi but the layout's @memory=512 says 512Mi"),
    ("no-memory", "2x4-mapped@cpus=1", [], "memory", "a pod needs a CPU and a memory limit"),
    ("no-size", "2x4-mapped", [], "cpus", "needs the pod's size"),
    ("other-variant", "2x4-mapped@cpus=1,harakiri=5", [], "layout", "not @harakiri"),
    ("tune-other-layout", "1x4-mapped", ["--from-tune", "TUNE"], "from_tune", "recommended 2x4-mapped, not 1x4-mapped"),
    ("tune-cpus-disagree", "2x4-mapped@cpus=2,memory=512", ["--from-tune", "TUNE"], "cpus",
     "the layout's @cpus=2 says 2 CPU but tune in"),
    ("tune-missing", "2x4-mapped", ["--from-tune", "MISSING"], "from_tune", "does not exist"),
    ("tune-unfinished", "2x4-mapped", ["--from-tune", "UNFINISHED"], "from_tune", "did not finish"),
    ("tune-old", "2x4-mapped", ["--from-tune", "OLD"], "from_tune", "no pod record"),
    ("plan-other-cpus", "2x4-mapped@cpus=2,memory=512", ["--plan", "PLAN"], "cpus", "says 2 CPU but plan"),
    ("plan-other-layout", "1x4-mapped@cpus=1,memory=512", ["--plan", "PLAN"], "plan", "plans 2x4-mapped@cpus=1"),
    ("plan-and-target", "2x4-mapped@cpus=1,memory=512", ["--plan", "PLAN", "--cpu-target", "80"], "cpu_target",
     "--cpu-target 80 says 80% but plan"),
    ("plan-and-replicas", "2x4-mapped@cpus=1,memory=512", ["--plan", "PLAN", "--replicas", "2"], "replicas",
     "--replicas 2 says 2 but"),
    ("plan-without-size", "2x4-mapped@cpus=1,memory=512", ["--plan", "SIZELESS"], "plan", "had no @cpus"),
    ("plan-not-json", "2x4-mapped@cpus=1,memory=512", ["--plan", "NOTJSON"], "plan", "is not JSON"),
    ("max-below-plan", "2x4-mapped@cpus=1,memory=512", ["--plan", "PLAN", "--max-replicas", "2"], "max_replicas",
     "must be at least the replicas (3)"),
    ("watch-container", "2x4-mapped", ["--target", "container", "--watch-sidecar"], "watch_sidecar",
     "is for --target kubernetes"),
    ("watch-listen-alone", "2x4-mapped@cpus=1,memory=512", ["--watch-listen", "127.0.0.1:9800"], "watch_listen",
     "goes with --watch-sidecar"),
    ("watch-listen-bad", "2x4-mapped@cpus=1,memory=512", ["--watch-sidecar", "--watch-listen", "[::]:9717"],
     "watch_listen", "expected IPV4:PORT"),
    ("watch-listen-nginx", "2x4-mapped@cpus=1,memory=512", ["--watch-sidecar", "--watch-listen", "0.0.0.0:8080"],
     "watch_listen", "is nginx's"),
    ("namespace-bad", "2x4-mapped@cpus=1,memory=512", ["--watch-sidecar", "--metrics-namespace", "Mon_itoring"],
     "metrics_namespace", "expected a Kubernetes namespace name"),
    ("debian-plan", "2x4-mapped", ["--target", "debian", "--plan", "PLAN"], "plan", "is for --target container"),
]


@pytest.mark.parametrize("name, layout, extra, field, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, name, layout, extra, field, words):
    app = make_app(tmp_path)
    files = {"TUNE": write_tune(tmp_path), "MISSING": tmp_path / "nowhere", "PLAN": write_plan(tmp_path)}
    (tmp_path / "u").mkdir()
    files["UNFINISHED"] = write_tune(tmp_path / "u", complete=False)
    (tmp_path / "o").mkdir()
    files["OLD"] = write_tune(tmp_path / "o", pod=False)
    (tmp_path / "s").mkdir()
    files["SIZELESS"] = write_plan(tmp_path / "s", layout="2x4-mapped", cpus=None, cpu_target=None)
    files["NOTJSON"] = tmp_path / "plan.txt"
    files["NOTJSON"].write_text("PLAN: 3 replicas\n")
    parent = tmp_path / "parent"
    parent.mkdir()
    args = bundle_args(app, parent / "out", layout, *[str(files.get(x, x)) for x in extra])
    if "--target" in extra:  # the case's own target replaces kubernetes
        i = args.index("--target")
        del args[i:i + 2]
    proc = run_bundle(*args)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {field}: ") and words in lines[0], lines[0]
    assert list(parent.iterdir()) == []


def test_compose_keeps_the_limits(tmp_path):
    out, _ = written(tmp_path, "2x4-mapped", "--from-tune", str(write_tune(tmp_path)))
    compose = yaml.safe_load((out / "compose.yaml").read_text())
    assert compose["services"]["app"]["cpus"] == 1.0 and compose["services"]["app"]["mem_limit"] == 512 * MIB
    assert compose["services"]["app"]["mem_reservation"] == 96 * MIB


def test_the_documented_busy_ratio_autoscaler_validates():
    """docs/watch.md's HorizontalPodAutoscaler (CPU and the busy ratio through prometheus-adapter)."""
    text = (Path(__file__).resolve().parent.parent / "docs/watch.md").read_text()
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in text.split("```yaml\n")[1:]]
    (hpa,) = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "HorizontalPodAutoscaler"]
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["ContainerResource", "Pods"]
