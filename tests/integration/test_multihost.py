"""One nginx over several app hosts, with mutual TLS, in network namespaces on this machine.

Every test gets its own namespaces (``deploy.run.Net`` via ``bench.stack.Lab(hosts=2)``: a
front and two app hosts on one bridge, addresses from an unused /24 of 198.18.0.0/15, no route
out) and its own certificates; real nginx, uWSGI and wrk. The whole module skips with one line
where namespaces cannot be made (not root, no iproute2); anything else that goes wrong fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.support import SLOW, concurrently, read_until, settled, uwsgi_packet
from tests.test_cli import cli_in_process
from uwsgi_layouts.bench.hostfaults import kill_host, kill_worker_on_host, unreachable_host
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.machine import enter
from uwsgi_layouts.deploy.run import child_setup, http_get, netns

REASON = netns.unavailable()
# One xdist worker makes every namespace and bridge of this module, one test at a time: they are the
# machine's (``ip netns``), not the test's, and the stale-namespace sweep is tested here too.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.xdist_group("netns")]
REPO_ROOT = Path(__file__).resolve().parents[2]


def integration(test):
    return pytest.mark.integration(pytest.mark.timeout(180)(test))


@pytest.fixture
def lab(run_dirs, free_ports):
    with Lab(new_dir=run_dirs, free_ports=free_ports, hosts=2) as lab:
        yield lab
        names = [n.netns for n in lab.net.nodes] if lab._net else []
    assert not set(names) & set(netns.existing()), "namespaces left behind"


def met(record, *targets: str) -> None:
    print("\n" + record.explain())
    chosen = [c for c in record.checks if not targets or c.target.startswith(targets)]
    assert chosen, [c.target for c in record.checks]
    assert all(c.ok for c in chosen), record.explain()


def listening(pid: int) -> set[str]:
    """TCP addresses listening in the network namespace of ``pid`` (its /proc/PID/net/tcp: psutil
    reads this namespace's /proc/net). In a host's namespace only its uWSGI runs."""
    out = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":  # LISTEN
            hex_ip, hex_port = local.split(":")
            ip = socket.inet_ntoa(bytes.fromhex(hex_ip)[::-1])
            out.add(f"{ip}:{int(hex_port, 16)}")
    return out


@integration
def test_requests_spread_over_every_worker_of_every_host(lab):
    with lab.stack("2x2-mapped") as stack:
        layout = stack.layout
        front = layout.listen_host
        assert front == lab.net.front.address and layout.uwsgi_tls == "suwsgi"
        for member in stack.members:  # each host binds its own address; its stats server is a unix socket
            ports = {s.address for s in layout.host_sockets(member.host)}
            assert listening(member.proc.pid) == ports
            assert member.layout.stats_address == f"{layout.host_dir(member.host)}/control/stats.sock"
        def counts() -> dict[str, dict[int, int]]:
            return {h: {w["id"]: w["requests"] for w in s["workers"]} for h, s in stack.host_stats().items()}

        def total(by_host: dict[str, dict[int, int]]) -> int:
            return sum(n for workers in by_host.values() for n in workers.values())

        before = settled(counts)
        path = SLOW.format(ms=200)
        answers = concurrently(lambda: http_get(front, layout.listen_port, path, timeout=30), [()] * 32)
        assert [status for status, _, _ in answers] == [200] * 32
        after = read_until(counts, lambda now: total(now) - total(before) >= 32)
        assert total(after) - total(before) == 32
    served = {h: {w: after[h][w] - before[h][w] for w in after[h]} for h in after}
    print(served)
    assert set(served) == set(layout.hosts)
    for host, workers in served.items():
        assert all(n >= 1 for n in workers.values()), f"a worker on {host} served nothing: {served}"
        assert 0.25 <= sum(workers.values()) / 32 <= 0.75, f"{host} got {sum(workers.values())} of 32: {served}"


@integration
def test_a_client_without_the_certificate_is_refused_by_uwsgi(lab):
    with lab.stack("1x2-mapped") as stack:
        host = stack.layout.hosts[0]
        port = stack.layout.base_port
        files = stack.layout.uwsgi_tls_files
        packet = uwsgi_packet({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz", "REQUEST_URI": "/healthz",
                               "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "x",
                               "SERVER_PORT": "80", "REMOTE_ADDR": "198.18.0.1", "HTTP_HOST": "x"})

        def ask(with_cert: bool) -> bytes:
            ctx = ssl.create_default_context(cafile=files["ca"])
            ctx.check_hostname = True
            if with_cert:
                ctx.load_cert_chain(files["client_cert"], files["client_key"])
            with socket.create_connection((host, port), timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname=stack.layout.uwsgi_tls_name) as conn:
                conn.sendall(packet)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                return data

        def count() -> int:
            return sum(w["requests"] for w in stack.stats(host)["workers"])

        before = settled(count)
        assert ask(with_cert=True).startswith(b"HTTP/1.1 200"), "the control: with nginx's certificate"
        served = read_until(count, lambda n: n > before)  # counted when closed, after the answer
        assert served == before + 1
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as refused:
            ask(with_cert=False)
        print(f"without a certificate: {refused.value!r}")
        # plain uwsgi (no TLS at all) gets no answer either
        with socket.create_connection((host, port), timeout=10) as raw:
            raw.sendall(packet)
            raw.settimeout(10)
            try:
                reply = raw.recv(65536)
            except (ConnectionResetError, socket.timeout):
                reply = b""
        assert not reply.startswith(b"HTTP/"), reply[:100]
        # A request that reached the app would be counted a moment after it closed: wait 1 s for one.
        assert read_until(count, lambda n: n != served, timeout=1.0) == served, "a request reached the app"


# The outage tests run the default policy (max_fails = T + 1, connect_timeout 1 s, retries = P;
# tests/test_multihost.py checks what is rendered by default) with a shorter fail_timeout, a real
# option (@fail_timeout=N, measured in docs/faults.md), still longer than the outage: no probe of the
# failed host falls inside it, so nginx does there what it does with the default 10 s. Only the
# wait for the host once back shrinks (nginx probes a failed socket fail_timeout after its last
# failure), and with 10 s most of each load was held only for that wait.


@integration
def test_a_host_killed_under_load_costs_no_get_and_gets_traffic_once_back(lab):
    # 12 s: 1 s of flow, 2.5 s down, its uWSGI started again, then up to two probe cycles of 3 s (a
    # probe that finds it still starting fails and waits one more) and a margin for the load
    record = kill_host(lab, "2x4-mapped@fail_timeout=3", duration=12.0, connections=8, down_s=2.5)
    assert record.figures["fail_timeout"] == 3, record.layout
    met(record, "failed GETs at most those in flight", "the other hosts keep serving", "198.")


@integration
def test_an_unreachable_host_is_left_out(lab):
    # 14 s: once nginx has marked the host's sockets failed (max_fails), it tries them again only
    # fail_timeout (4 s) after the last failure, and connects that time out (1 s) and TLS handshakes
    # fail up to a few seconds after the host is back: the 10 s after it must outlast all that,
    # whatever the load (with fail_timeout 10 s, CI saw no request in the 11 s a 15-s run left)
    record = unreachable_host(lab, "2x2-mapped@fail_timeout=4", duration=14.0, connections=8, down_s=3.0)
    assert record.figures["fail_timeout"] == 4, record.layout
    met(record, "failed GETs at most those in flight", "the other hosts keep serving", "198.")
    # connect timeouts are paid per socket (max_fails, then one probe per fail_timeout), not per request
    assert record.figures["slow"] <= 0.05 * record.figures["requests"], record.explain()


@integration
def test_a_respawning_worker_on_a_live_host_is_not_shut_out(lab):
    # 6 s: a few seconds after the respawn to compare the worker with its peers, under load too (a shut-out
    # lasts fail_timeout, 10 s)
    record = kill_worker_on_host(lab, "2x4-mapped", duration=6.0, connections=8)
    met(record)
    assert record.figures["peer_median"] > 0, record.explain()  # the window after the respawn was loaded


NET_SCRIPT = """
import json, sys, time
from uwsgi_layouts.deploy.run import netns
with netns.Net(hosts=1) as net:
    print(json.dumps({"names": [n.netns for n in net.nodes], "bridge": net.bridge, "id": net.run_id}), flush=True)
    time.sleep(60)
"""


def _start_net_holder() -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", NET_SCRIPT], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, "the namespace holder printed nothing"
    return proc, json.loads(line)


def _gone(info: dict) -> bool:
    return not set(info["names"]) & set(netns.existing()) and not Path(f"/sys/class/net/{info['bridge']}").exists() \
        and not (netns.STATE_DIR / f"{info['id']}.json").exists()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_namespaces_are_removed_on_sigterm_and_after_a_crash():
    proc, info = _start_net_holder()
    try:
        assert set(info["names"]) <= set(netns.existing())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert _gone(info), info
    finally:
        proc.kill()
    proc, info = _start_net_holder()  # SIGKILL: nothing can clean up; the next run does, by the state file
    try:
        proc.kill()
        proc.wait(timeout=20)
        assert set(info["names"]) <= set(netns.existing())
        deadline = time.monotonic() + 10
        while info["id"] not in netns.clean_stale() and time.monotonic() < deadline:
            time.sleep(0.1)  # the dead pid must be reaped before it counts as dead
        assert _gone(info), info
    finally:
        proc.kill()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_stale_cleanup_touches_only_this_projects_unclaimed_names():
    import secrets

    run = secrets.token_hex(3)
    ours, foreign = f"{netns.NS_PREFIX}{run}-h1", f"ulnsx-{run}-h1"
    for name in (ours, foreign):
        netns.ip("netns", "add", name)
    try:
        assert run in netns.clean_stale()
        left = netns.ip("netns", "list").stdout
        assert ours not in left and foreign in left
    finally:
        for name in (ours, foreign):
            netns.ip("netns", "del", name, check=False)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_bench_compare_hosts(tmp_path):
    out = tmp_path / "run"
    # In this process: a new interpreter importing the bench side (scipy.stats, matplotlib) was about
    # 2.3 CPU-s of the test; its namespaces, stacks and wrk are real processes all the same, and
    # test_compare.py runs compare as a real process
    proc = cli_in_process("compare", "--hosts", "2", "--processes", "1", "--threads", "2",
                          "--layouts", "1x2-mapped@uwsgi_tls=off,1x2-mapped", "--concurrency", "2", "--duration", "1",
                          "--warmup", "1", "--repeats", "1", "--scenario", "overhead", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert {c["layout"] for c in cells} == {"1x2-mapped@uwsgi_tls=off", "1x2-mapped"}
    for cell in cells:
        assert cell["errors"]["total"] == 0 and cell["requests"] > 0
        assert cell["extra"]["hosts"] == 2 and set(cell["worker_requests"]) == {"1", "2"}
        assert abs(cell["extra"]["host1_share"] + cell["extra"]["host2_share"] - 1) < 1e-9
    report = (out / "report.txt").read_text()
    assert "== Across 2 app hosts ==" in report and "suwsgi vs off" in report and "not scale" in report


# --- bundles across hosts: installed into trial roots, served from the namespaces -----------------


def _run_cli(*args: str, namespace: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=180, preexec_fn=(lambda: enter(namespace)) if namespace else None)


def _in_netns(name: str):
    return child_setup(name)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bundles_across_hosts_install_and_serve(flask_app, run_dirs, free_ports):
    """`deploy bundle --hosts` makes a front bundle and one per host; each installs (`deploy
    install --root`) into its own trial root, uWSGI starts from each host's installed ini inside
    that host's namespace and nginx from the front's inside the front's: the Flask shop answers
    through the front, from both hosts, over TLS."""
    import pwd

    from tests.bundles import make_trial_root

    with netns.Net(hosts=2) as net:
        certs = run_dirs() / "certs"
        # certs and bundle in this process (they start nothing; a new interpreter each was about 0.5 CPU-s);
        # install, which runs nginx -t inside a namespace, as the real process
        made = cli_in_process("certs", str(certs), "--hosts", ",".join(net.host_addresses))
        assert made.returncode == 0, made.stderr
        port = free_ports(1)[0]
        out = run_dirs() / "bundle"
        # No --uwsgi: the default, pyuwsgi in the app's virtualenv (tests/flaskapp.py installs it there)
        proc = cli_in_process("bundle", "2x2-mapped", "--out", str(out), *flask_app.cli_args(),
                        "--hosts", ",".join(net.host_addresses),
                        "--uwsgi-tls-dir", str(certs), "--listen", f"{net.front.address}:{port}", "--any-host")
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.name for p in (out / "hosts").iterdir()) == sorted(net.host_addresses)
        roots = {"front": make_trial_root(run_dirs())}
        (roots["front"] / "etc/nginx/sites-enabled/default").unlink()
        www = pwd.getpwnam("www-data")
        for host in net.host_addresses:
            roots[host] = root = run_dirs()
            for d, mode in ((root / "run/shop", 0o711), (root / "var/log/shop", 0o750)):  # as systemd makes them
                d.mkdir(parents=True)
                os.chown(d, www.pw_uid, www.pw_gid)
                d.chmod(mode)
        for where, bundle in [("front", out / "front"), *((h, out / "hosts" / h) for h in net.host_addresses)]:
            # on its own machine: the front's nginx -t binds the front's address
            done = _run_cli("install", str(bundle), "--root", str(roots[where]), namespace=net.node(
                net.front.address if where == "front" else where).netns)
            assert done.returncode == 0, done.stdout + done.stderr
        key = roots[net.host_addresses[0]] / "etc/uwsgi-layouts/shop-tls/host.key"
        assert (key.stat().st_mode & 0o777, key.stat().st_gid) == (0o640, www.pw_gid)
        assert (roots["front"] / "etc/nginx/uwsgi-tls/shop/front.key").stat().st_mode & 0o777 == 0o600

        procs = []
        try:
            for host in net.host_addresses:
                log = open(roots[host] / "uwsgi.out", "w")
                procs.append(subprocess.Popen([str(flask_app.venv / "bin" / "uwsgi"), "--ini",
                                               str(roots[host] / "etc/uwsgi-layouts/shop.ini")], stdout=log,
                                              stderr=subprocess.STDOUT, preexec_fn=_in_netns(net.node(host).netns)))
                log.close()
            log = open(roots["front"] / "nginx.out", "w")
            procs.append(subprocess.Popen(["nginx", "-c", str(roots["front"] / "etc/nginx/nginx.conf"), "-e", "stderr",
                                           "-g", "daemon off;"], stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=_in_netns(net.front.netns)))
            log.close()
            deadline = time.monotonic() + 60
            served = {}
            while time.monotonic() < deadline and len(served) < 4:
                assert all(p.poll() is None for p in procs), [(roots[h] / "uwsgi.out").read_text()[-1500:]
                                                              for h in net.host_addresses]
                try:
                    status, headers, body = http_get(net.front.address, port, "/", timeout=10)
                    if status == 200:
                        assert body == b"Hello from shop"
                        served[headers["x-worker-pid"]] = True
                except OSError:
                    pass
                time.sleep(0.05)  # polling until both hosts' workers answer
            assert len(served) == 4, f"workers seen: {served}"
        finally:
            for p in procs:
                p.send_signal(signal.SIGQUIT)  # both stop on SIGQUIT (the bundle's ini has no die-on-term)
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
