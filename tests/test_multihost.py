"""Several app hosts behind one front, with mutual TLS: certificates, layout fields, rendering and
the cross-checks (files on disk, nginx -t; no process is started here: tests/integration/
test_multihost.py runs the stacks in network namespaces)."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import check_tls_dir, checked
from uwsgi_layouts.deploy.machine import netns as machine_netns
from uwsgi_layouts.deploy.model import (
    DEFAULT_TLS_NAME,
    LayoutError,
    RenderError,
    host_cert,
    host_key,
    layout_from_record,
    parse_layout,
)
from uwsgi_layouts.deploy.render import (
    crosscheck,
    nginx_summary,
    parse_nginx,
    pass_locations,
    render_texts,
    write_layout,
)
from uwsgi_layouts.deploy.render import write as render_write
from uwsgi_layouts.deploy.run import netns
from uwsgi_layouts.deploy.ship import (
    build_bundle,
    certs,
    generated_for,
    install,
    make_certs,
    unit_directives,
    write_host_bundles,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
HOSTS = ("10.0.0.2", "10.0.0.3")


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs") / "uwsgi_tls", HOSTS + ("127.0.0.1",)).directory


def hosts_layout(tmp_run_dir, tls_dir, spec="2x4-mapped", **options):
    return checked(parse_layout(spec, run_dir=str(tmp_run_dir), hosts=",".join(HOSTS), uwsgi_tls_dir=str(tls_dir),
                                **options))


# --- certificates -----------------------------------------------------------------------------


def test_certs_carry_the_names_nginx_and_uwsgi_rely_on(tls_dir):
    from cryptography import x509

    for name in (certs.CA_KEY, certs.CLIENT_KEY, *(host_key(h) for h in HOSTS)):
        assert stat.S_IMODE(os.stat(tls_dir / name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(tls_dir).st_mode) == 0o700
    for host in HOSTS:
        cert = x509.load_pem_x509_certificate((tls_dir / host_cert(host)).read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [DEFAULT_TLS_NAME]
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.IPv4Address(host)]
    assert check_tls_dir(str(tls_dir), HOSTS, DEFAULT_TLS_NAME) == []
    # openssl agrees that everything chains to the CA
    proc = subprocess.run(["openssl", "verify", "-CAfile", str(tls_dir / "ca.crt"), str(tls_dir / "front.crt"),
                           *(str(tls_dir / host_cert(h)) for h in HOSTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_certs_never_overwrite_without_force_and_keep_the_ca(tmp_path):
    out = tmp_path / "uwsgi_tls"
    make_certs(out, "10.0.0.2")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(LayoutError, match=r"dir: .*host-10\.0\.0\.2\.crt exists: pass --force"):
        make_certs(out, "10.0.0.2")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    added = make_certs(out, "10.0.0.3")  # a host added later: CA and nginx's certificate kept
    assert set(added.kept) == {"ca.crt", "ca.key", "front.crt", "front.key"}
    assert (out / "front.crt").read_bytes() == before["front.crt"]
    assert json.loads((out / "certs.json").read_text())["hosts"] == ["10.0.0.2", "10.0.0.3"]
    forced = make_certs(out, "10.0.0.2", force=True)
    assert (out / "ca.crt").read_bytes() == before["ca.crt"] and "ca.crt" in forced.kept
    assert (out / host_cert("10.0.0.2")).read_bytes() != before[host_cert("10.0.0.2")]
    assert check_tls_dir(str(out), ("10.0.0.2", "10.0.0.3"), DEFAULT_TLS_NAME) == []
    assert not list(tmp_path.glob(".certs-staging-*"))


@pytest.mark.parametrize("hosts,error", [
    ("", "hosts: give at least one host"),
    ("10.0.0.2,10.0.0.2", "hosts: 10.0.0.2 is given twice"),
    ("0.0.0.0", "hosts: 0.0.0.0 is not one host's address"),
    ("example.com", "hosts: expected IPv4 addresses"),
])
def test_certs_bad_hosts_write_nothing(tmp_path, hosts, error):
    with pytest.raises(LayoutError, match=error):
        make_certs(tmp_path / "uwsgi_tls", hosts)
    assert not (tmp_path / "uwsgi_tls").exists()


def test_check_tls_dir_names_what_does_not_fit(tmp_path, tls_dir):
    assert "does not carry the name 'other.internal'" in " ".join(check_tls_dir(str(tls_dir), HOSTS,
                                                                                "other.internal"))
    other = make_certs(tmp_path / "other", "10.0.0.2").directory  # another CA's certificate
    copy = tmp_path / "mixed"
    copy.mkdir()
    for p in tls_dir.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
        (copy / p.name).chmod(stat.S_IMODE(p.stat().st_mode))
    for name in (host_cert("10.0.0.2"), host_key("10.0.0.2")):
        (copy / name).write_bytes((other / name).read_bytes())
    (copy / certs.CLIENT_KEY).chmod(0o644)
    problems = " ".join(check_tls_dir(str(copy), HOSTS, DEFAULT_TLS_NAME))
    assert "host-10.0.0.2.crt is not signed by ca.crt" in problems
    assert "front.key is mode 644: a private key must be 0600" in problems
    (copy / host_cert("10.0.0.3")).write_bytes((tls_dir / host_cert("10.0.0.2")).read_bytes())
    assert "host-10.0.0.3.crt does not carry its address 10.0.0.3" in " ".join(
        check_tls_dir(str(copy), HOSTS, DEFAULT_TLS_NAME))


def test_certs_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "uwsgi_layouts", "certs", *a], cwd=REPO_ROOT,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    ok = run(str(tmp_path / "uwsgi_tls"), "--hosts", "10.0.0.2,10.0.0.3")
    assert ok.returncode == 0 and "use: --hosts 10.0.0.2,10.0.0.3 --uwsgi-tls-dir" in ok.stdout, ok.stderr
    again = run(str(tmp_path / "uwsgi_tls"), "--hosts", "10.0.0.2")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "pass --force" in again.stderr


# --- the layout -------------------------------------------------------------------------------


def test_hosts_layout_lists_every_socket_of_every_host(tmp_run_dir, tls_dir):
    layout = hosts_layout(tmp_run_dir, tls_dir, base_port=6000)
    assert layout.uwsgi_tls == "suwsgi" and layout.hosts == HOSTS
    assert [s.address for s in layout.sockets] == ["10.0.0.2:6000", "10.0.0.2:6001", "10.0.0.3:6000", "10.0.0.3:6001"]
    # a host that is down must not cost every request; a respawning worker (at most T failures) stays in
    assert [p for _, p in layout.upstream_servers] == [("max_fails=5", "fail_timeout=10s")] * 4
    assert layout.retries == 2  # one host's sockets: a request can skip all of a failed host
    view = layout.host_layout("10.0.0.3")
    assert [s.address for s in view.sockets] == ["10.0.0.3:6000", "10.0.0.3:6001"]
    assert view.run_dir == str(tmp_run_dir / "hosts" / "10.0.0.3")
    assert view.uwsgi_tls_files["cert"] == str(tls_dir / host_cert("10.0.0.3"))
    again = layout_from_record(json.loads(json.dumps(layout.to_dict())))
    assert again == layout
    one = parse_layout("2x4-mapped", run_dir=str(tmp_run_dir))
    assert (one.uwsgi_tls, one.max_fails, one.retries, one.hosts) == ("off", 0, 1, ())
    assert [p for _, p in one.upstream_servers] == [("max_fails=0",)] * 2


@pytest.mark.parametrize("options,error", [
    ({"uwsgi_tls": "off"}, "uwsgi_tls: plain uwsgi to 10.0.0.2 would let anyone who reaches it make uWSGI load"),
    ({"uwsgi_tls_dir": ""},
     "uwsgi_tls_dir: --uwsgi-tls suwsgi needs the certificates: make them with uwsgi-layouts certs"),
    ({"transport": "unix"}, "transport: hosts need --transport tcp"),
    ({"spec": "2x4-overflow"}, "hosts: not supported for overflow: use one of shared, thunder, mapped"),
    ({"spec": "2x4-gunicorn"}, "hosts: not supported for gunicorn"),
    ({"uwsgi_tls": "tls13"}, "uwsgi_tls: must be one of off, suwsgi, https"),
    ({"uwsgi_tls_name": "not a name"}, "uwsgi_tls_name: expected a DNS name"),
    ({"hosts": "10.0.0.2,10.0.0.9"}, r"uwsgi_tls_dir: .*host-10\.0\.0\.9\.crt is missing: make it with uwsgi-layouts"),
    ({"max_fails": "-1"}, r"max_fails: must be an integer in 0\.\.1000"),
])
def test_hosts_layout_refuses_bad_input(tmp_run_dir, tls_dir, options, error):
    options = {"spec": "2x4-mapped", "hosts": ",".join(HOSTS), "uwsgi_tls_dir": str(tls_dir), **options}
    with pytest.raises(LayoutError, match=error):
        checked(parse_layout(options.pop("spec"), run_dir=str(tmp_run_dir), **options))


def test_plain_uwsgi_off_loopback_only_inside_an_isolated_test_network(tmp_run_dir, tls_dir, monkeypatch):
    """Plain uwsgi to a non-loopback address is refused, except in a network deploy.run.Net made in
    this very process (the benchmark's namespaces, no route out): the registry is pure logic."""
    with pytest.raises(LayoutError, match="uwsgi_tls: plain uwsgi to 10.0.0.2"):
        hosts_layout(tmp_run_dir, tls_dir, uwsgi_tls="off")
    monkeypatch.setattr(machine_netns, "_isolated", [ipaddress.IPv4Network("10.0.0.0/24")])
    assert hosts_layout(tmp_run_dir, tls_dir, uwsgi_tls="off").uwsgi_tls == "off"
    assert hosts_layout(tmp_run_dir, tls_dir).uwsgi_tls == "suwsgi"  # the default is still what a real network needs


# --- rendering and the cross-checks -----------------------------------------------------------------


def test_render_writes_the_front_and_one_config_per_host(tmp_run_dir, tls_dir):
    layout = hosts_layout(tmp_run_dir, tls_dir)
    result = write_layout(layout, tmp_run_dir)
    assert "nginx -t" not in result.nginx_test or "successful" in result.nginx_test
    assert sorted(result.files) == sorted(["nginx.conf", "mime.types", "uwsgi_params", "layout.json",
                                           "hosts/10.0.0.2/uwsgi.ini", "hosts/10.0.0.3/uwsgi.ini"])
    assert not (tmp_run_dir / "uwsgi.ini").exists()
    ini = (tmp_run_dir / "hosts" / "10.0.0.3" / "uwsgi.ini").read_text()
    assert f"ssl-socket = 10.0.0.3:5000,{tls_dir}/host-10.0.0.3.crt,{tls_dir}/host-10.0.0.3.key," in ini
    assert f",!{tls_dir}/ca.crt\n" in ini
    assert "\nsocket = " not in ini and "map-socket = 1:2" in ini
    assert f"pidfile = {tmp_run_dir}/hosts/10.0.0.3/control/uwsgi.pid" in ini
    for sub in ("control", "logs"):
        assert (tmp_run_dir / "hosts" / "10.0.0.3" / sub).is_dir()
    conf = (tmp_run_dir / "nginx.conf").read_text()
    for line in ("uwsgi_pass suwsgi://uwsgi_app;", f"uwsgi_ssl_certificate {tls_dir}/front.crt;",
                 f"uwsgi_ssl_trusted_certificate {tls_dir}/ca.crt;", "uwsgi_ssl_verify on;",
                 f"uwsgi_ssl_name {DEFAULT_TLS_NAME};", "uwsgi_next_upstream error timeout;",
                 "uwsgi_next_upstream_tries 3;", "server 10.0.0.3:5001 max_fails=5 fail_timeout=10s;"):
        assert line in conf, line
    assert crosscheck(layout, tmp_run_dir) == []


def test_each_app_host_gets_its_own_entry_module_for_a_factory(tmp_run_dir, tls_dir):
    layout = hosts_layout(tmp_run_dir, tls_dir, app="app.wsgi:make('x')")
    result = write_layout(layout, tmp_run_dir)
    entries = [f"hosts/{h}/entry/uwsgi_layouts_entry.py" for h in HOSTS]
    assert set(entries) <= set(result.files) and not (tmp_run_dir / "entry").exists()
    for host, entry in zip(HOSTS, entries, strict=True):
        ini = (tmp_run_dir / "hosts" / host / "uwsgi.ini").read_text()
        assert f"wsgi-file = {tmp_run_dir}/{entry}\n" in ini  # the host's own copy, in its own run dir
        assert "application = _factory('x')" in (tmp_run_dir / entry).read_text()


def test_render_https_alternative(tmp_run_dir, tls_dir):
    layout = hosts_layout(tmp_run_dir, tls_dir, uwsgi_tls="https")
    write_layout(layout, tmp_run_dir)
    conf = (tmp_run_dir / "nginx.conf").read_text()
    assert "proxy_pass https://uwsgi_app;" in conf and "proxy_ssl_verify on;" in conf and "keepalive " in conf
    assert "https-socket = 10.0.0.2:5000," in (tmp_run_dir / "hosts" / "10.0.0.2" / "uwsgi.ini").read_text()


def cli_render(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", "render", "2x4-mapped", "--out", str(out), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_render_refuses_a_public_socket_without_tls(run_dirs, tls_dir):
    tmp_path = run_dirs()
    for args in (["--hosts", "10.0.0.2", "--uwsgi-tls", "off"], ["--hosts", "10.0.0.2,10.0.0.3"]):
        proc = cli_render(tmp_path / "out", *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: uwsgi_tls"), proc.stderr
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.staging-*"))
    ok = cli_render(tmp_path / "out", "--hosts", "10.0.0.2,10.0.0.3", "--uwsgi-tls-dir", str(tls_dir))
    assert ok.returncode == 0, ok.stderr
    assert "nginx -t: ok" in ok.stdout


def _tamper(layout, out: Path, name: str, old: str, new: str) -> list[str]:
    path = out / name
    text = path.read_text()
    assert old in text, f"{old!r} not in {name}"
    path.write_text(text.replace(old, new, 1))
    return crosscheck(layout, out)


@pytest.mark.parametrize("name,old,new,words", [
    # never mix locations with and without the client certificate on one upstream
    ("nginx.conf", "        location / {", "        location /health {\n            include uwsgi_params;\n"
                                            "            uwsgi_pass suwsgi://uwsgi_app;\n        }\n"
                                            "        location / {", "never mix them on one upstream"),
    ("nginx.conf", "uwsgi_ssl_verify on;", "uwsgi_ssl_verify off;", "uwsgi_ssl_verify is ['off']"),
    ("nginx.conf", "uwsgi_pass suwsgi://uwsgi_app;", "uwsgi_pass uwsgi_app;", "uwsgi_pass targets"),
    ("nginx.conf", f"uwsgi_ssl_name {DEFAULT_TLS_NAME};", "uwsgi_ssl_name other.internal;", "uwsgi_ssl_name is"),
    ("hosts/10.0.0.3/uwsgi.ini", ",!", ",", "takes clients without a certificate"),
    ("hosts/10.0.0.3/uwsgi.ini", "ssl-socket = 10.0.0.3:5001,", "socket = 10.0.0.3:5001\n; ",
     "10.0.0.3:5001 is not a loopback address and takes clients without a certificate"),
    ("hosts/10.0.0.3/uwsgi.ini", "ssl-socket = 10.0.0.3:5001,", "ssl-socket = 0.0.0.0:5001,",
     "0.0.0.0:5001 is not a loopback address: it binds every interface"),
    ("hosts/10.0.0.2/uwsgi.ini", "host-10.0.0.2.key", "host-10.0.0.3.key", "certificate, key or required client CA"),
])
def test_crosscheck_catches_tls_tampering(tmp_run_dir, tls_dir, name, old, new, words):
    layout = hosts_layout(tmp_run_dir, tls_dir)
    write_layout(layout, tmp_run_dir)
    problems = _tamper(layout, tmp_run_dir, name, old, new)
    assert any(words in p for p in problems), problems


def test_mixing_is_seen_through_inheritance(tmp_run_dir, tls_dir):
    """Directives set at server level are in force in every location below (as nginx inherits
    them): the mix check reads what each location ends up with."""
    layout = hosts_layout(tmp_run_dir, tls_dir)
    write_layout(layout, tmp_run_dir)
    parsed = pass_locations(_parse(tmp_run_dir))
    assert [p["location"] for p in parsed] == ["/"]
    assert parsed[0]["ssl"]["ssl_verify"] == ["on"]
    text = (tmp_run_dir / "nginx.conf").read_text()
    moved = text.replace(f"            uwsgi_ssl_name {DEFAULT_TLS_NAME};\n", "").replace(
        "        location / {", f"        uwsgi_ssl_name {DEFAULT_TLS_NAME};\n        location / {{")
    (tmp_run_dir / "nginx.conf").write_text(moved)
    assert crosscheck(layout, tmp_run_dir) == []  # the same settings, inherited
    assert nginx_summary(tmp_run_dir / "nginx.conf")["pass_locations"][0]["ssl"]["ssl_name"] == [DEFAULT_TLS_NAME]


def _parse(conf_dir: Path):

    return parse_nginx(conf_dir / "nginx.conf")


def test_render_refuses_tls_with_a_uwsgi_built_without_ssl(tmp_run_dir, tls_dir, tmp_path, monkeypatch):
    """A uWSGI compiled without libssl-dev has no ssl-socket: one line saying how to rebuild, nothing
    written. (The binary here is a stand-in script: pure logic.)"""
    fake = tmp_path / "uwsgi"
    fake.write_text("#!/bin/sh\necho '    --socket    bind to the specified UNIX/TCP socket'\n"
                    "echo '    --route-if-not    add a route when not condition'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(render_write, "find_uwsgi", lambda: str(fake))
    layout = hosts_layout(tmp_run_dir / "out", tls_dir)
    with pytest.raises(RenderError, match=r"^tls: .*was built without SSL .* install libssl-dev .* make venv$"):
        write_layout(layout, tmp_run_dir / "out")
    assert not (tmp_run_dir / "out").exists()
    local = checked(parse_layout("2x4-mapped", run_dir=str(tmp_run_dir / "plain")))  # no TLS: no need for SSL
    write_layout(local, tmp_run_dir / "plain")


def test_local_tls_on_loopback(tmp_run_dir, tls_dir):
    """TLS without hosts: this machine's loopback sockets, over ssl-socket (what one machine can test)."""
    layout = checked(parse_layout("2x2-shared", run_dir=str(tmp_run_dir), uwsgi_tls="suwsgi",
                                  uwsgi_tls_dir=str(tls_dir)))
    texts = render_texts(layout)
    assert "ssl-socket = 127.0.0.1:5000," in texts["uwsgi.ini"]
    assert "uwsgi_pass suwsgi://uwsgi_app;" in texts["nginx.conf"]
    write_layout(layout, tmp_run_dir)


# --- network namespaces: the parts that are pure logic ------------------------------------------------


def test_free_subnet_avoids_every_address_and_route_in_use():
    import random

    in_use = [ipaddress.IPv4Network("198.18.0.0/16"), ipaddress.IPv4Network("198.19.0.0/17"),
              ipaddress.IPv4Network("0.0.0.0/0").subnets(new_prefix=1).__next__()]  # 0/1: not in the range
    for seed in range(20):
        net = netns.free_subnet(in_use, random.Random(seed))
        assert net.subnet_of(netns.RANGE) and net.prefixlen == 24
        assert not any(net.overlaps(u) for u in in_use[:2])
    with pytest.raises(netns.NetnsError, match=r"198\.18\.0\.0/15 is in use here \(198\.18\.0\.0/15\)"):
        netns.free_subnet([ipaddress.IPv4Network("198.18.0.0/15")], random.Random(1))


# --- bundles across hosts (deploy bundle --hosts) --------------------------------------------------

SERVER = {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv"}


def test_bundle_across_hosts_is_a_front_and_one_bundle_per_host(tmp_path, tls_dir):

    front = build_bundle("2x4-mapped", **SERVER, hosts=",".join(HOSTS), uwsgi_tls_dir=str(tls_dir))
    written = write_host_bundles(front, tmp_path / "out")
    out = tmp_path / "out"
    assert written["front"] == ["INSTALL.md", "bundle.json", "nginx/sites-available/shop.conf", "uwsgi-tls/ca.crt",
                                "uwsgi-tls/front.crt", "uwsgi-tls/front.key"]
    for host in HOSTS:
        assert written[f"hosts/{host}"] == ["INSTALL.md", "bundle.json", "logrotate/shop", "systemd/shop.service",
                                            "uwsgi-tls/ca.crt", "uwsgi-tls/host.crt", "uwsgi-tls/host.key",
                                            "uwsgi/shop.ini"]
        ini = (out / "hosts" / host / "uwsgi/shop.ini").read_text()
        assert f"ssl-socket = {host}:5000,/etc/uwsgi-layouts/shop-tls/host.crt,/etc/uwsgi-layouts/shop-tls/host.key," \
               in ini and ",!/etc/uwsgi-layouts/shop-tls/ca.crt\n" in ini
        record = json.loads((out / "hosts" / host / "bundle.json").read_text())
        assert (record["role"], record["host"]) == ("host", host)
        unit = unit_directives((out / "hosts" / host / "systemd/shop.service").read_text())
        assert ("Unit", "After", "network-online.target") in unit
        # the host's own certificate, with the generated header that install looks for
        pem = (out / "hosts" / host / "uwsgi-tls/host.crt").read_text()
        assert generated_for(pem) == "shop" and pem.split("-----BEGIN CERTIFICATE-----")[1] == \
            (tls_dir / host_cert(host)).read_text().split("-----BEGIN CERTIFICATE-----")[1]
    site = (out / "front/nginx/sites-available/shop.conf").read_text()
    for line in ("uwsgi_pass suwsgi://uwsgi_shop;", "uwsgi_ssl_certificate /etc/nginx/uwsgi-tls/shop/front.crt;",
                 "uwsgi_ssl_verify on;", "server 10.0.0.3:5001 max_fails=5 fail_timeout=10s;"):
        assert line in site, line
    for key in (out / "front/uwsgi-tls/front.key", out / "hosts/10.0.0.2/uwsgi-tls/host.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "hosts").stat().st_mode) == 0o700


@pytest.mark.parametrize("options,error", [
    ({"uwsgi_tls": "https"}, "uwsgi_tls: a bundle across hosts speaks suwsgi to them, not https"),
    ({"uwsgi_tls": "off"}, "uwsgi_tls: plain uwsgi to 10.0.0.2"),
    ({"uwsgi_tls_dir": None}, "uwsgi_tls_dir: --uwsgi-tls suwsgi needs the certificates"),
])
def test_bundle_across_hosts_refuses_what_is_not_mutual_tls(tmp_path, tls_dir, options, error):

    with pytest.raises(LayoutError, match=error):
        build_bundle("2x4-mapped", **SERVER, **{"hosts": ",".join(HOSTS), "uwsgi_tls_dir": str(tls_dir), **options})


def test_host_bundle_installs_without_nginx_and_the_front_without_uwsgi(tmp_path, tls_dir):

    write_host_bundles(build_bundle("2x4-mapped", **SERVER, hosts=",".join(HOSTS), uwsgi_tls_dir=str(tls_dir)),
                       tmp_path / "out")
    root = tmp_path / "root"
    root.mkdir()
    result = install(tmp_path / "out/hosts/10.0.0.2", root=root, dry_run=True, app_check=False)
    targets = {str(s.target.relative_to(root)) for s in result.steps if s.kind != "dir"}
    assert targets == {"etc/uwsgi-layouts/shop.ini", "etc/systemd/system/shop.service", "etc/logrotate.d/shop",
                       "etc/uwsgi-layouts/shop-tls/ca.crt", "etc/uwsgi-layouts/shop-tls/host.crt",
                       "etc/uwsgi-layouts/shop-tls/host.key"}
    with pytest.raises(LayoutError, match="etc/nginx/nginx.conf is missing"):  # the front needs nginx
        install(tmp_path / "out/front", root=root, dry_run=True, app_check=False)


def test_host_unit_passes_systemd_analyze_verify(tmp_path, tls_dir):
    import shutil as sh

    from tests.bundles import systemd_analyze_verify

    analyze = sh.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: run scripts/install-system-deps.sh", pytrace=False)
    write_host_bundles(build_bundle("2x4-mapped", **SERVER, hosts=",".join(HOSTS), uwsgi_tls_dir=str(tls_dir)),
                       tmp_path / "out")
    proc = systemd_analyze_verify(analyze, tmp_path / "out/hosts/10.0.0.2/systemd/shop.service")
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "shop.service" in line
                and "/srv/shop/venv/bin/uwsgi" not in line]  # the app is not deployed on this machine
    assert not problems, proc.stdout + proc.stderr
