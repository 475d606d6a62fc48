"""`bundle --target container|kubernetes`: what is written, the manifests against Kubernetes'
schemas (offline, kubernetes-validate), and bad input (one line, exit 2, nothing written).
Building and running the images: tests/integration/test_bundle_kubernetes.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.flaskapp import SHOP_PY
from tests.test_cli import cli_in_process
from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.deploy.ship.container import APP_UID, NGINX_UID, SOCKET_GID
from uwsgi_layouts.deploy.ship.container.sizing import parse_cpus, parse_memory
from uwsgi_layouts.deploy.ship.container.spec import image_reference

# The Kubernetes version the manifests are written for and checked against (docs/containers.md).
KUBERNETES_VERSION = "1.33.0"
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def run_bundle(*args: str) -> subprocess.CompletedProcess:
    """`uwsgi-layouts bundle ARGS` in this process (a new interpreter per call was most of these tests'
    time, 0.75 s each; tests/test_bundle.py runs a bundle refusal as a process of its own)."""
    return cli_in_process("bundle", *args)


def make_app(root: Path, requirements: str | None = "requirements.txt") -> Path:
    app = root / "shop"
    (app / "static").mkdir(parents=True)
    (app / "shop.py").write_text(SHOP_PY)
    (app / "static/hello.txt").write_text("hello\n")
    (app / "venv").mkdir()  # a virtualenv of this machine: never copied into the image
    (app / "venv/pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    if requirements:
        (app / requirements).write_text("flask==3.1.3\n")
    return app


def kube_args(app: Path, out: Path, *extra: str) -> list[str]:
    return ["2x4-mapped", "--target", "kubernetes", "--app", "shop:app", "--app-dir", str(app), "--static",
            f"/assets={app}/static", "--out", str(out), "--cpus", "750m", "--memory", "512Mi", *extra]


@pytest.fixture
def kube_bundle(tmp_path) -> Path:
    out = tmp_path / "out"
    proc = run_bundle(*kube_args(make_app(tmp_path), out, "--env", "SHOP_GREETING=hi", "--replicas", "3"))
    assert proc.returncode == 0, proc.stderr
    return out


def manifests(out: Path) -> dict[str, dict]:
    return {doc["kind"]: doc for f in sorted((out / "kubernetes").glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text())}


def test_files_and_headers(kube_bundle):
    generated = ["README.md", "compose.yaml", "image/Containerfile", "image/nginx/nginx.conf", "image/nginx/site.conf",
                 "image/uwsgi.ini", "kubernetes/deployment.yaml", "kubernetes/hpa.yaml", "kubernetes/pdb.yaml",
                 "kubernetes/service.yaml"]
    for rel in generated:
        text = (kube_bundle / rel).read_text()
        head = "\n".join(text.splitlines()[:5])
        assert "do not edit" in head and "layout 2x4-mapped" in head, (rel, head)
        if rel != "image/nginx/site.conf":  # the Debian bundle's site, with its own header
            assert "--cpus 750m" in head, (rel, head)
            assert ("Resources (app container: 750m CPU, memory request 512Mi, limit 512Mi): --cpus 750m and "
                    "--memory 512Mi (no measurement)." in head), (rel, head)
            assert "Replicas (3-4, CPU target 70%): options (no plan)." in head, (rel, head)
    copied = sorted(str(p.relative_to(kube_bundle / "image/app")) for p in (kube_bundle / "image/app").rglob("*"))
    assert copied == ["requirements.txt", "shop.py", "static", "static/hello.txt"]


def test_manifests_validate_against_kubernetes_schemas(kube_bundle):
    found = manifests(kube_bundle)
    assert sorted(found) == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]
    for doc in found.values():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    # The check can fail: a misspelt field is refused.
    broken = found["Deployment"]
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_deployment_limits_probes_and_security(kube_bundle):
    found = manifests(kube_bundle)
    pod = found["Deployment"]["spec"]["template"]["spec"]
    app, nginx = pod["containers"]
    assert app["resources"]["limits"] == app["resources"]["requests"] == {"cpu": "750m", "memory": "512Mi"}
    for container, uid in ((app, APP_UID), (nginx, NGINX_UID)):
        ctx = container["securityContext"]
        assert ctx["runAsUser"] == uid and ctx["runAsGroup"] == SOCKET_GID and ctx["runAsNonRoot"] is True
        assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "shop-sockets", "mountPath": "/run/shop"} in container["volumeMounts"]
    # nginx stops accepting (its preStop ends) before uWSGI closes its sockets (its preStop ends later).
    assert nginx["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert app["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "7"]
    # The grace: uWSGI's preStop 7 s + harakiri 30 s (no --stop-grace) + 5 s.
    assert pod["terminationGracePeriodSeconds"] == 42
    assert nginx["readinessProbe"]["httpGet"] == {"path": "/_uwsgi-layouts/ready", "port": 8081}
    assert nginx["livenessProbe"]["httpGet"] == {"path": "/_uwsgi-layouts/live", "port": 8081}
    assert app["env"] == [{"name": "SHOP_GREETING", "value": "hi"}]
    assert "SHOP_GREETING" not in (kube_bundle / "image/uwsgi.ini").read_text()  # never baked into the image
    assert found["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == 3
    assert found["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 4
    compose = yaml.safe_load((kube_bundle / "compose.yaml").read_text())
    assert compose["services"]["app"]["cpus"] == 0.75 and compose["services"]["nginx"]["stop_signal"] == "SIGQUIT"


def test_uwsgi_ini_and_containerfile(kube_bundle):
    ini = (kube_bundle / "image/uwsgi.ini").read_text()
    for line in ("processes = 2", "threads = 4", "socket = /run/shop/uwsgi-0.sock", "socket = /run/shop/uwsgi-1.sock",
                 "map-socket = 0:1", "map-socket = 1:2", "chmod-socket = 660",
                 "hook-master-start = unix_signal:15 gracefully_kill_them_all", "shutdown-sockets = true"):
        assert f"\n{line}\n" in ini, line
    assert "die-on-term" not in ini.replace("under die-on-term", "")
    containerfile = (kube_bundle / "image/Containerfile").read_text()
    assert "ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm" in containerfile  # the app's venv: 3.11
    assert "libpcre2-dev" in containerfile and "--route-if-not" in containerfile
    # pyuwsgi (uWSGI run by the venv's python3) with SSL, and a full reload re-executes that python
    assert "setup.pyuwsgi.py" in containerfile and "libssl-dev" in containerfile and "--ssl-socket" in containerfile
    assert "\nbinary-path = /opt/venv/bin/python\n" in ini, ini
    assert "COPY app/requirements.txt" in containerfile and "STOPSIGNAL SIGQUIT" in containerfile
    site = (kube_bundle / "image/nginx/site.conf").read_text()
    assert "least_conn;" in site and "alias /srv/static/assets/;" in site


def test_lock_is_preferred(tmp_path):
    app = make_app(tmp_path)
    (app / "requirements.lock").write_text("flask==3.1.3\n")
    out = tmp_path / "out"
    proc = run_bundle("2x4-mapped", "--target", "container", "--app", "shop:app", "--app-dir", str(app), "--out",
                      str(out))
    assert proc.returncode == 0, proc.stderr
    assert "COPY app/requirements.lock" in (out / "image/Containerfile").read_text()
    assert not (out / "kubernetes").exists()


@pytest.mark.parametrize("name, extra, field, words", [
    ("unknown-target", ["--target", "helm"], "", "invalid choice: 'helm'"),
    ("no-requirements", None, "app_dir", "has no requirements.lock or requirements.txt"),
    ("tcp-sockets", ["--transport", "tcp"], "transport", "unix sockets"),
    ("bad-image", ["--image", "Shop:latest"], "image", "not a valid image reference"),
    ("image-without-tag", ["--image", "registry.example.com/shop"], "image", "a tag"),
    ("memory-below-workers", ["--memory", "48Mi"], "memory", "cannot hold 2 workers"),
    ("bad-cpus", ["--cpus", "lots"], "cpus", "expected a CPU limit"),
    ("server-option", ["--server-name", "shop.example.com"], "server_name", "not --target kubernetes"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, name, extra, field, words):
    app = make_app(tmp_path, requirements=None if extra is None else "requirements.txt")
    parent = tmp_path / "parent"
    parent.mkdir()
    args = kube_args(app, parent / "out")
    if name == "memory-below-workers":
        args = [a for a in args if a != "512Mi"]
        args.remove("--memory")
    proc = run_bundle(*args, *(extra or []))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (lines[0].startswith(f"error: {field}: ") if field else True) and words in lines[0], lines[0]
    assert list(parent.iterdir()) == []


def test_quantities_and_references():
    assert parse_cpus("750m") == 750 and parse_cpus("2") == 2000 and parse_cpus("1.5") == 1500
    assert parse_memory("512Mi") == 512 * 2**20 and parse_memory("1G") == 10**9
    for good in ("localhost/shop:1", "registry.example.com:5000/team/shop:1.4", "shop:v1.0-rc1"):
        assert image_reference("image", good, need_tag=True) == good
    for bad in ("shop", "Shop:1", "shop:1@sha256:" + "0" * 64, "-shop:1", "shop:", "a" * 300 + ":1"):
        with pytest.raises(LayoutError):
            image_reference("image", bad, need_tag=True)
    assert image_reference("base_image", "docker.io/library/python:3.11-slim", need_tag=False)
