"""`bundle --target kubernetes` for real: the images built with podman from the generated
Containerfile (on Debian base images made here, tests/integration/podman.py), the Deployment
run with `podman kube play` on the host's network, requests through the nginx sidecar, the
exporter sidecar (--watch-sidecar) scraped. The pod's size comes from the layout (@cpus, @memory).

Everything runs in a podman of its own (configuration and storage in a session directory):
the pods, containers and images go with it on every exit path, and a session left by a killed
run is removed by the next one.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import find_free_ports
from tests.flaskapp import SHOP_PY
from tests.integration.podman import (
    BUILD_CACHE_MAX_AGE,
    BUILD_CACHES,
    CGROUP_ROOT,
    SESSIONS,
    BuildCache,
    Podman,
    PodmanUnavailable,
    build_cgroup_parent,
    prune_build_caches,
    remove_stale_sessions,
    write_config,
)
from uwsgi_layouts.deploy.cli import main
from uwsgi_layouts.deploy.ship.container import APP_UID, LIVE_PATH, READY_PATH, SOCKET_GID
from uwsgi_layouts.deploy.ship.container.spec import APP_PRESTOP_SECONDS, PRESTOP_SECONDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500), pytest.mark.xdist_group("podman")]

CPU_LIMIT = "750m"
LAYOUT = "2x4-mapped@cpus=0.75,memory=512"  # the pod's size, as the layout was measured at
READY_TIMEOUT = 120.0
READY_PERIOD_S = 5.0  # the readinessProbe's periodSeconds in the rendered deployment.yaml
IMPORT_FAILED = "ModuleNotFoundError: No module named 'no_such_module_for_the_test'"


@dataclass(frozen=True)
class Pod:
    podman: Podman
    out: Path
    port: int
    probe_port: int
    name: str
    watch_port: int | None = None

    @property
    def app_container(self) -> str:
        return f"{self.name}-pod-0-app"  # podman kube play names a Deployment's pods NAME-pod-INDEX

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def exec_app(self, *command: str, container: str = "app") -> str:
        return self.podman.run("exec", f"{self.name}-pod-0-{container}", *command).stdout

    def scrape(self) -> dict[str, list]:
        """The exporter's /metrics: family name -> its samples."""
        conn = http.client.HTTPConnection("127.0.0.1", self.watch_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        return {family.name: family.samples for family in text_string_to_metric_families(text)}


def write_app(root: Path, broken: bool = False) -> Path:
    app = root / ("broken" if broken else "shop")
    (app / "static").mkdir(parents=True)
    # A module that fails to import: the pod must never turn ready, and say why in its log.
    (app / "shop.py").write_text(("import no_such_module_for_the_test\n" if broken else "") + SHOP_PY)
    (app / "static/hello.txt").write_text("hello from the sidecar\n")
    (app / "requirements.txt").write_text("flask==3.1.3\n")
    return app


def make_bundle(root: Path, app: Path, name: str, port: int, probe_port: int, watch_port: int | None = None) -> Path:
    out = root / f"bundle-{name}"
    # The exporter on the host's loopback: the pod runs on the host's network here.
    watch = ["--watch-sidecar", "--watch-listen", f"127.0.0.1:{watch_port}"] if watch_port else []
    code = main(["bundle", LAYOUT, "--target", "kubernetes", "--name", name, "--app", "shop:app",
                 "--app-dir", str(app), "--static", f"/assets={app}/static", "--out", str(out),
                 "--image", f"localhost/ul-test-{name}:1", "--listen", f"127.0.0.1:{port}",
                 "--probe-port", str(probe_port), "--stop-grace", "10", "--python", "3.11",
                 # One pod: podman runs every replica, and on the host's network they would share the port.
                 "--replicas", "1", *watch])
    assert code == 0
    return out


def build_images(podman: Podman, out: Path, name: str, bases: dict[str, str]) -> None:
    """The images of the bundle, built at the same time: buildah (1.27 on, podman 4.3's) builds only
    the stages a --target uses, and the app's, the sidecar's and the exporter's share none, so the
    sidecar and the exporter are made while the app's build stage compiles uWSGI."""
    args = {"BASE_IMAGE": bases["python"], "NGINX_IMAGE": bases["nginx"], "WATCH_BASE_IMAGE": bases["python"]}
    targets = {"app": f"localhost/ul-test-{name}:1", "nginx": f"localhost/ul-test-{name}-nginx:1"}
    if (out / "image/watch").is_dir():
        targets["watch"] = f"localhost/ul-test-{name}-watch:1"
    with ThreadPoolExecutor(len(targets)) as pool:
        builds = [pool.submit(podman.build, out / "image", target, tag, args) for target, tag in targets.items()]
        for build in builds:
            build.result()  # a failed build raises here, with podman's stderr


def play(podman: Podman, out: Path) -> None:
    podman.run("kube", "play", "--network", "host", str(out / "kubernetes/deployment.yaml"), timeout=180)


def wait_ready(pod: Pod, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            status, _, _ = pod.get("/", timeout=5)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(1)
    logs = pod.podman.run("logs", pod.app_container, check=False)
    raise AssertionError(f"the pod did not serve within {timeout:g} s ({last}); app log:\n{logs.stderr[-3000:]}")


@pytest.fixture(scope="module")
def podman():
    try:
        with Podman() as session:
            yield session
    except PodmanUnavailable as exc:
        pytest.fail(f"podman is needed here: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def bases(podman) -> dict[str, str]:
    return {kind: podman.base_image(kind) for kind in ("python", "nginx")}


@pytest.fixture(scope="module")
def pod(podman, bases, tmp_path_factory) -> Pod:
    root = tmp_path_factory.mktemp("kube")
    port, probe_port, watch_port = find_free_ports(3)
    out = make_bundle(root, write_app(root), "shop", port, probe_port, watch_port)
    build_images(podman, out, "shop", bases)
    play(podman, out)
    running = Pod(podman, out, port, probe_port, "shop", watch_port)
    wait_ready(running)
    return running


def test_requests_through_the_sidecar_reach_every_worker(pod):
    def one(_):
        status, headers, _ = pod.get("/slow?ms=50")
        return status, headers.get("X-Worker-Pid")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(64)))
    assert {status for status, _ in answers} == {200}
    assert len({pid for _, pid in answers}) == 2, answers  # 2x4-mapped: two workers, each on its own socket
    status, _, body = pod.get("/assets/hello.txt")
    assert status == 200 and body == b"hello from the sidecar\n"
    listing = pod.exec_app("python3", "-c", "import os, stat, json; print(json.dumps({n: [oct(stat.S_IMODE("
                           "os.stat('/run/shop/' + n).st_mode)), os.stat('/run/shop/' + n).st_gid] "
                           "for n in os.listdir('/run/shop')}))")
    assert json.loads(listing) == {"uwsgi-0.sock": ["0o660", SOCKET_GID], "uwsgi-1.sock": ["0o660", SOCKET_GID]}


def test_probe_port_answers_ready_and_alive(pod):
    for path, body in ((READY_PATH, b""), (LIVE_PATH, b"nginx\n")):
        conn = http.client.HTTPConnection("127.0.0.1", pod.probe_port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, body), path
        finally:
            conn.close()
    # The probes' paths are nginx's on the probe port: on the HTTP port they are the app's (404).
    assert pod.get(LIVE_PATH)[0] == 404 and pod.get(READY_PATH)[0] == 404


def test_cgroup_quota_is_the_cpu_limit(pod):
    read = "cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) " \
           "$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
    quota, period = pod.exec_app("sh", "-c", read).split()
    assert int(quota) / int(period) == pytest.approx(0.75), (quota, period)


def test_workers_run_as_the_user_and_cannot_write_the_code(pod):
    report = pod.exec_app("python3", "-c", """
import json, os
uids = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        name = open(f'/proc/{pid}/comm').read().strip()  # pyuwsgi: python3 running the script bin/uwsgi
        status = open(f'/proc/{pid}/status').read()
    except OSError:
        continue
    if name == 'uwsgi':
        uids[pid] = [int(x) for x in status.split('Uid:')[1].split()[:4]]
try:
    open('/srv/app/shop.py', 'a').close()
    wrote = 'wrote'
except OSError as exc:
    wrote = exc.strerror
print(json.dumps({'uids': uids, 'write': wrote}))
""")
    found = json.loads(report)
    assert len(found["uids"]) == 3, found  # the master and two workers
    assert all(set(ids) == {APP_UID} for ids in found["uids"].values()), found
    assert found["write"] in ("Read-only file system", "Permission denied"), found


def test_the_exporter_sidecar_answers_a_scrape_with_the_workers_metrics(pod):
    """--watch-sidecar: `uwsgi-layouts watch` in the pod reads uWSGI's stats socket (per-worker figures),
    the kernel's queues of the workers' sockets and nginx's timed lines (datagrams on its socket),
    as uid 10003 in the sockets' group."""
    deadline = time.monotonic() + 90
    while True:  # the exporter starts in seconds (its imports at its 100m CPU limit)
        try:
            before = pod.scrape()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                logs = pod.podman.run("logs", f"{pod.name}-pod-0-watch", check=False)
                raise AssertionError(f"the exporter did not answer ({exc}); its log:\n{logs.stdout[-2000:]}"
                                     f"{logs.stderr[-2000:]}") from None
            time.sleep(1)
    # Once its socket exists nginx sends it every line (before, nginx drops them and says so).
    sent_before = sum(s.value for s in before.get("uwsgi_layouts_log_lines", [])
                      if s.name == "uwsgi_layouts_log_lines_total")

    def one(_):
        return pod.get("/slow?ms=30")[0]

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(48))) == {200}
    deadline = time.monotonic() + 30
    while True:  # the log lines arrive within the exporter's poll (0.5 s); the stats at 10 reads/s
        found = pod.scrape()
        requests = {s.labels["worker"]: s.value for s in found.get("uwsgi_layouts_worker_requests", [])
                    if s.name == "uwsgi_layouts_worker_requests_total"}
        counts = {s.labels["upstream"]: s.value for s in found.get("uwsgi_layouts_upstream_response_seconds", [])
                  if s.name == "uwsgi_layouts_upstream_response_seconds_count" and s.labels["status_class"] == "2xx"}
        if (sum(requests.values()) >= 48 and sum(counts.values()) >= 48) or time.monotonic() > deadline:
            break
        time.sleep(1)
    if not counts:  # say why: no line, or lines not in the timed format; nginx's error log
        nginx = pod.podman.run("logs", f"{pod.name}-pod-0-nginx", check=False)
        raise AssertionError(f"no latency from nginx's lines: lines {found.get('uwsgi_layouts_log_lines')} (before "
                             f"{sent_before}); nginx's log:\n{nginx.stderr[-1500:]}")
    assert [s.value for s in found["uwsgi_layouts_up"]] == [1.0], found.get("uwsgi_layouts_up")
    assert set(requests) == {"1", "2"} and all(v > 0 for v in requests.values()), requests
    assert set(counts) == {"unix:/run/shop/uwsgi-0.sock", "unix:/run/shop/uwsgi-1.sock"}, counts
    assert sum(counts.values()) >= 48, counts
    backlogs = {s.labels["socket"]: s.value for s in found["uwsgi_layouts_listen_backlog"]}
    assert set(backlogs) == {"/run/shop/uwsgi-0.sock", "/run/shop/uwsgi-1.sock"} and min(backlogs.values()) > 0
    assert pod.exec_app("id", "-u", container="watch").strip() == "10003"


def test_an_app_that_does_not_import_never_turns_ready(podman, bases, tmp_path_factory, pod):
    root = tmp_path_factory.mktemp("broken")
    port, probe_port = find_free_ports(2)
    out = make_bundle(root, write_app(root, broken=True), "broken", port, probe_port)
    build_images(podman, out, "broken", bases)  # the same requirements: the compiled layers are reused
    assert f"periodSeconds: {READY_PERIOD_S:g}" in (out / "kubernetes/deployment.yaml").read_text()
    play(podman, out)
    broken = Pod(podman, out, port, probe_port, "broken")
    try:
        # The probe is asked every second until the app's log shows that its import failed (its
        # workers had their go: a worker left running without the app answers the probe at once),
        # then for one readiness period more (the manifest's periodSeconds). A fixed 20 s used to
        # end without knowing whether the app had even started on a busy machine.
        failed_at = None
        deadline = time.monotonic() + READY_TIMEOUT
        while failed_at is None or time.monotonic() < failed_at + READY_PERIOD_S:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", probe_port, timeout=3)
                conn.request("GET", READY_PATH)
                assert conn.getresponse().status != 200, "the broken app's pod turned ready"
                conn.close()
            except OSError:
                pass
            if failed_at is None:
                logs = podman.run("logs", broken.app_container, check=False)
                if IMPORT_FAILED in logs.stdout + logs.stderr:
                    failed_at = time.monotonic()
                else:
                    said = (logs.stdout + logs.stderr)[-2000:]
                    assert time.monotonic() < deadline, f"no {IMPORT_FAILED!r} in its log: {said}"
            time.sleep(1)  # polling the probe as a kubelet would, more often
    finally:
        podman.run("kube", "down", str(out / "kubernetes/deployment.yaml"), check=False, timeout=120)


def test_requests_in_flight_during_kube_down_are_answered(pod, record_property):
    """Last in this module: it stops the pod. Eight clients each have a request of 1.5 s (each on a
    new connection) and one request of 3 s is in flight when the pod stops as Kubernetes stops it:
    every request in flight is answered 200, and afterwards connections are refused.
    As in Kubernetes, no new connection arrives once nginx has its stop signal (the preStop pause
    exists so that the endpoints are gone by then): a connection still in the kernel's accept
    queue when nginx closes its listening socket is reset by the kernel, which no server can
    prevent, so a client opening connections through the stop would test the kernel, not us.
    Debian 12's podman 4.3 `kube down` kills the containers at once (SIGKILL, podman issue
    #22397, fixed in 5.1 by PR #22398), dropping every request in flight; `podman pod stop` first
    sends each container its stop signal and waits, as Kubernetes does after the preStop pauses."""
    counts: Counter = Counter()
    lock = threading.Lock()
    stopping = threading.Event()

    def client():
        while not stopping.is_set():  # the endpoints are gone: the request in flight is the last
            try:
                key = pod.get("/slow?ms=1500")[0]  # still in flight when nginx gets its signal
            except OSError as exc:  # refused, reset, or closed without an answer
                key = type(exc).__name__
            with lock:
                counts[key] += 1

    long_answer: dict = {}

    def long_request():
        try:
            long_answer["status"] = pod.get("/slow?ms=3000")[0]
        except OSError as exc:
            long_answer["status"] = exc

    threads = [threading.Thread(target=client) for _ in range(8)] + [threading.Thread(target=long_request)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the long request is in a worker, the clients are sending
    stopping.set()
    started = time.monotonic()
    # Kubernetes' order, from the preStop pauses (podman runs none): nginx gets its stop signal
    # first, uWSGI its own APP_PRESTOP_SECONDS - PRESTOP_SECONDS later.
    # (`podman stop` sends the image's STOPSIGNAL, SIGQUIT, and keeps podman from restarting it.)
    nginx_stop = threading.Thread(target=pod.podman.run, args=("stop", "--time", "30", f"{pod.name}-pod-0-nginx"))
    nginx_stop.start()
    time.sleep(APP_PRESTOP_SECONDS - PRESTOP_SECONDS)
    pod.podman.run("pod", "stop", f"{pod.name}-pod-0", timeout=120)
    nginx_stop.join(60)
    took = time.monotonic() - started
    for thread in threads:
        thread.join(40)
    try:
        after = pod.get("/slow?ms=1")[0]
    except OSError as exc:
        after = type(exc).__name__
    exits = {name: pod.podman.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
             for name in (pod.app_container, f"{pod.name}-pod-0-nginx")}
    pod.podman.run("kube", "down", str(pod.out / "kubernetes/deployment.yaml"), timeout=120)
    record_property("answers", dict(counts))
    print(f"answers while the pod stopped: {dict(counts)}; stopping took {took:.1f} s; exit statuses {exits}")
    assert long_answer.get("status") == 200, long_answer
    assert counts[200] > 0 and set(counts) == {200}, counts
    assert after == "ConnectionRefusedError", after
    # uWSGI and nginx stopped on their signals once the requests were done (exit status 0), not on
    # podman's SIGKILL after its 10 s stop timeout (137). Read from the containers rather than from
    # the time the stop took: podman's own commands took the stop to 11.4 s (2 cores busy with other
    # work) and 12.2 s (not busy) with both exiting 0. The time only bounds a stop far too slow.
    assert exits == {pod.app_container: "0", f"{pod.name}-pod-0-nginx": "0"}, (exits, took)
    assert took < 25, took


def test_a_session_left_by_a_killed_run_is_removed(capfd):
    """A test process killed with SIGKILL leaves its podman session: the next one removes it."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = SESSIONS / f"{gone.pid}-dead00"
    stale.mkdir(parents=True)
    write_config(stale)
    (stale / "graph").mkdir()
    remove_stale_sessions()
    assert not stale.exists()
    assert f"removing the session of test process {gone.pid}" in capfd.readouterr().err


KILLED_BUILD = """\
import sys
from pathlib import Path
from tests.integration.podman import Podman
with Podman() as podman:
    print(podman.dir, flush=True)
    podman.build(Path(sys.argv[1]), "step", "localhost/ul-test-killed:1", {"BASE_IMAGE": podman.base_image("python")})
"""


def test_a_killed_builds_step_is_ended_and_its_cgroups_removed_by_the_next_session(tmp_path):
    """A test process killed while its build runs a step: podman build ends on PR_SET_PDEATHSIG,
    the step's processes under runc do not. The next session kills them and removes the cgroups
    (under ``--cgroup-parent``, named for the dead session) in every hierarchy."""
    (tmp_path / "Containerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE} AS step\nRUN sleep 120\n")
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(tmp_path)], cwd=repo, stdout=subprocess.PIPE,
                             text=True)
    session = Path(child.stdout.readline().strip())
    step = CGROUP_ROOT / "pids" / build_cgroup_parent(session).lstrip("/")
    deadline = time.monotonic() + 120
    while not [p for p in step.rglob("cgroup.procs") if p.read_text().split()] and time.monotonic() < deadline:
        time.sleep(0.5)
    running = {int(pid) for procs in step.rglob("cgroup.procs") for pid in procs.read_text().split()}
    child.kill()
    child.wait()
    assert running, f"the step never ran in {step}"
    with Podman():  # the next session
        pass
    assert not [h for h in CGROUP_ROOT.iterdir() if (h / build_cgroup_parent(session).lstrip("/")).exists()]
    assert not [pid for pid in running if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_a_build_cache_unused_for_long_is_removed_unless_a_session_holds_it(capfd, tmp_path):
    """The next session removes a build cache unused for BUILD_CACHE_MAX_AGE, but not one that
    another session holds (its lock shared), however old."""
    caches = {name: BUILD_CACHES / f"test-{name}-{os.getpid()}" for name in ("unused", "held")}
    locks = {}
    try:
        for name, directory in caches.items():
            (directory / "graph").mkdir(parents=True)
            lock_path = directory.with_name(f"{directory.name}.lock")
            lock_path.touch()
            old = lock_path.stat().st_mtime - BUILD_CACHE_MAX_AGE - 3600
            os.utime(lock_path, (old, old))
            locks[name] = lock_path
        with open(locks["held"]) as held:
            fcntl.flock(held, fcntl.LOCK_SH)  # as a session using it does
            prune_build_caches(keep=BuildCache((), tmp_path))
        assert not caches["unused"].exists()
        assert caches["held"].is_dir()
        assert f"removing the build cache {caches['unused']} (unused for 7 days)" in capfd.readouterr().err
    finally:
        for directory in caches.values():
            shutil.rmtree(directory, ignore_errors=True)
            directory.with_name(f"{directory.name}.lock").unlink(missing_ok=True)
