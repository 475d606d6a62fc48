"""`python -m deploy bundle`: the files a Debian/Ubuntu server takes as they are.

The generated files are parsed back with the tools that read them in production: crossplane
for the nginx site (inside an http {} block, as Debian's nginx.conf includes it), the uwsgi.ini
parser of deploy/render/, and `systemd-analyze verify` for the unit. No server is started
here (tests/integration/test_bundle_install.py and test_bundle_systemd.py do that).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import crossplane
import pytest

from deploy.machine import PROJECT_ROOT
from deploy.model import STRATEGIES, LayoutError
from deploy.model.strategies import Shared
from deploy.render import find_directives, parse_uwsgi_ini
from deploy.ship import build_bundle, generated_for, relocate, render_bundle, unit_directives, write_bundle
from deploy.ship import bundle as bundle_mod
from tests.bundles import make_cert, systemd_analyze_verify

SERVER = {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv"}


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


def bundle_dir(tmp_path: Path, spec: str = "2x4-mapped", **options) -> Path:
    out = tmp_path / "bundle"
    write_bundle(build_bundle(spec, **{**SERVER, **options}), out)
    return out


def site_config(out: Path, name: str = "shop") -> list[dict]:
    """The site parsed by crossplane inside an http {} block, as Debian's nginx.conf includes it."""
    wrapper = out.parent / "nginx.conf"
    shutil.copy(PROJECT_ROOT / "templates/uwsgi_params", out.parent / "uwsgi_params")
    wrapper.write_text(f"events {{}}\nhttp {{\n    include {out}/nginx/sites-available/{name}.conf;\n}}\n")
    payload = crossplane.parse(str(wrapper), combine=True)
    assert payload["status"] == "ok", payload["errors"]
    return payload["config"][0]["parsed"]


def ini_values(out: Path, name: str = "shop") -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for key, value in parse_uwsgi_ini((out / f"uwsgi/{name}.ini").read_text()):
        values.setdefault(key, []).append(value)
    return values


def all_texts(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}


# --- contents ------------------------------------------------------------------------------------

CASES = [
    ("2x4-mapped", "unix", False),
    ("2x4-mapped", "tcp", True),
    ("1x1-shared", "unix", True),
    ("3x2-overflow", "unix", False),
    ("3x2-overflow", "tcp", False),
    ("2x2-thunder", "unix", False),
]


@pytest.mark.parametrize("spec,transport,tls", CASES)
def test_bundle_upstream_is_exactly_the_sockets_and_only_loopback_or_0660(tmp_path, tls_pair, spec, transport, tls):
    tls_opts = {"tls_cert": str(tls_pair[0]), "tls_key": str(tls_pair[1])} if tls else {}
    out = bundle_dir(tmp_path, spec, transport=transport, user="shop", static=["/assets=/srv/shop/static"],
                     env=["SHOP_GREETING=50% off"], **tls_opts)
    parsed = site_config(out)
    http = parsed[1]["block"]  # events {}, http { <the site> }
    assert {d["directive"] for d in http} == {"upstream", "server"}, "only upstream and server blocks"
    assert not find_directives(http, "http") and not find_directives(http, "events")
    [upstream] = find_directives(http, "upstream")
    assert upstream["args"] == ["uwsgi_shop"]
    servers = [d["args"] for d in upstream["block"] if d["directive"] == "server"]
    ini = ini_values(out)
    sockets = ini["socket"]
    addresses = [args[0].removeprefix("unix:") for args in servers]
    assert set(addresses) == set(sockets) and len(set(addresses)) == len(sockets)
    assert all("max_fails=0" in args for args in servers)
    assert "zone" in [d["directive"] for d in upstream["block"]], "Debian runs several nginx workers"
    assert {d["args"][0] for d in find_directives(http, "uwsgi_pass")} == {"uwsgi_shop"}

    for address in sockets + ini["stats"]:
        if address.startswith("/"):
            assert address.startswith("/run/shop/"), address
        else:
            assert ipaddress.ip_address(address.rpartition(":")[0]).is_loopback, address
    if transport == "unix":
        assert ini["chmod-socket"] == ["660"] and ini["chown-socket"] == ["shop:www-data"]
        assert all(a.startswith("unix:/run/shop/") for a in (args[0] for args in servers))
    else:
        assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert ini["pidfile"] == ["/run/shop/uwsgi.pid"] and ini["master-fifo"] == ["/run/shop/master.fifo"]
    assert ini["logto"] == ["/var/log/shop/uwsgi.log"]
    assert ini["virtualenv"] == ["/srv/shop/venv"] and ini["chdir"] == ["/srv/shop"]
    assert ini["uid"] == ["shop"] and ini["gid"] == ["shop"]
    assert ini["env"] == ["SHOP_GREETING=50%% off"]
    assert "die-on-term" not in ini, "uWSGI 2.0 turns systemd's SIGQUIT into a reload under die-on-term"

    listens = [d["args"] for d in find_directives(http, "listen")]
    if tls:
        assert ["443", "ssl", "http2"] in listens and ["[::]:443", "ssl", "http2"] in listens
        assert ["80"] in listens
        returns = [d["args"] for d in find_directives(http, "return")]
        assert returns == [["301", "https://$host$request_uri"]]
        protocols = [d["args"] for d in find_directives(http, "ssl_protocols")]
        assert protocols == [["TLSv1.2", "TLSv1.3"]]
        ciphers = find_directives(http, "ssl_ciphers")[0]["args"][0].split(":")
        assert ciphers and all(c.startswith("ECDHE-") and ("GCM" in c or "CHACHA20" in c) for c in ciphers)
    else:
        assert listens == [["80"], ["[::]:80"]]
        assert not find_directives(http, "ssl_certificate")
    params = {d["args"][0]: d["args"][1] for d in find_directives(http, "uwsgi_param")}
    assert params["HTTP_HOST"] == "$host" and params["HTTP_X_FORWARDED_PROTO"] == "$scheme"
    assert params["HTTP_X_FORWARDED_FOR"] == "$proxy_add_x_forwarded_for"
    alone = crossplane.parse(str(out / "nginx/sites-available/shop.conf"), single=True, check_ctx=False)
    [root_location] = [d for d in find_directives(alone["config"][0]["parsed"], "location") if d["args"] == ["/"]]
    assert ["uwsgi_params"] in [d["args"] for d in root_location["block"] if d["directive"] == "include"]
    assert find_directives(http, "client_max_body_size")[0]["args"] == ["10m"]
    statics = {d["args"][-1]: d for d in find_directives(http, "location") if d["args"][0] == "^~"}
    assert list(statics) == ["/assets/"]


def test_bundle_names_no_path_of_this_lab(tmp_path, tls_pair):
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    lab = [str(PROJECT_ROOT), sys.prefix, sys.executable, "/tmp/", "build/", str(tmp_path)]
    for rel, text in all_texts(out).items():
        for path in lab:
            assert path not in text, f"{rel} names {path}"


def test_unit_passes_systemd_analyze_verify(tmp_path):
    """systemd's own parser: no warning (it ignores a bad line with rc 0, so stderr must be empty)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/install-system-deps.sh installs systemd"
    # The unit names its uWSGI, which verify requires to exist: our own, for this check only.
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", uwsgi=str(Path(sys.prefix) / "bin" / "uwsgi"))
    unit = out / "systemd/shop.service"
    proc = systemd_analyze_verify(analyze, unit)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    # ...and the check can fail: a misspelt value is reported.
    broken = tmp_path / "shop.service"
    broken.write_text(unit.read_text().replace("KillSignal=SIGQUIT", "KillSignal=SIGQUITE"))
    proc = systemd_analyze_verify(analyze, broken)
    assert "SIGQUITE" in proc.stderr


def test_unit_settings(tmp_path):
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", writable=["/srv/shop/media"])
    text = (out / "systemd/shop.service").read_text()
    unit = {(section, key): value for section, key, value in unit_directives(text)}
    expected = {
        "Type": "notify", "NotifyAccess": "all", "KillSignal": "SIGQUIT", "Restart": "on-failure",
        "RuntimeDirectory": "shop", "LogsDirectory": "shop", "User": "shop", "Group": "shop",
        "SupplementaryGroups": "www-data", "ExecStart": "/srv/shop/venv/bin/uwsgi --ini /etc/uwsgi-layouts/shop.ini",
        "ExecReload": "/bin/sh -c 'echo c > /run/shop/master.fifo'", "ProtectSystem": "strict",
        "ReadWritePaths": "/srv/shop/media", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
    }
    assert {k: unit.get(("Service", k)) for k in expected} == expected
    assert unit[("Install", "WantedBy")] == "multi-user.target"
    # An app under /home stays readable, one under /tmp keeps its /tmp.
    home = bundle_dir(tmp_path / "home", "1x1-shared", app_dir="/home/deploy/shop", virtualenv="/home/deploy/venv")
    text = (home / "systemd/shop.service").read_text()
    assert "ProtectHome=read-only" in text and "PrivateTmp=yes" in text
    tmp = bundle_dir(tmp_path / "tmp", "1x1-shared", app_dir="/tmp/shop", virtualenv="/tmp/shop/venv")
    assert "\nPrivateTmp=" not in (tmp / "systemd/shop.service").read_text()


def test_every_file_carries_the_header_with_the_bundle_name(tmp_path, tls_pair):
    out = bundle_dir(tmp_path, "2x4-mapped", name="shop-eu", tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    record = json.loads((out / "bundle.json").read_text())
    assert record["name"] == "shop-eu" and record["format_version"] == 1
    for f in record["files"]:
        assert generated_for((out / f["path"]).read_text()) == "shop-eu", f["path"]
    assert "do not edit" in (out / "INSTALL.md").read_text().splitlines()[1]
    assert generated_for("# Generated from layout 2x4-mapped by `python -m deploy render`: do not edit.") is None
    # The PEM files stay usable with the header in front (OpenSSL skips text before BEGIN).
    import ssl
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(out / "tls/shop-eu.crt", out / "tls/shop-eu.key")
    assert (out / "tls/shop-eu.key").stat().st_mode & 0o777 == 0o600
    assert out.stat().st_mode & 0o777 == 0o700


def test_install_md_has_the_commands_of_this_bundle(tmp_path, tls_pair):
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", server_names=["shop.example.com"],
                     tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    text = (out / "INSTALL.md").read_text()
    for line in ["install -m 0640 -o root -g shop uwsgi/shop.ini /etc/uwsgi-layouts/shop.ini",
                 "install -m 0600 -o root -g root tls/shop.key /etc/ssl/private/shop.key",
                 "ln -s /etc/nginx/sites-available/shop.conf /etc/nginx/sites-enabled/shop.conf",
                 "nginx -t", "systemctl enable --now shop.service", "systemctl reload shop",
                 "systemctl disable --now shop.service", "rm /etc/uwsgi-layouts/shop.ini",
                 "adduser --system --group --no-create-home --home /srv/shop shop",
                 "/srv/shop/venv/bin/pip install 'uwsgi>=2.0.22,<2.1'", "curl -sSI https://shop.example.com/"]:
        assert line in text, line


def test_rendering_into_a_private_directory_works(tmp_path):
    """The issue's first report: as root, --out in a fresh 0700 directory. A bundle does not
    check what the run user could reach on the rendering machine."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    out = private / "bundle"
    write_bundle(build_bundle("2x4-mapped", **SERVER), out)
    assert (out / "uwsgi/shop.ini").is_file()
    assert [p.name for p in private.iterdir()] == ["bundle"], "no staging directory left behind"


def test_tcp_sockets_never_clash_with_nginx_ports(tmp_path):
    with pytest.raises(LayoutError) as err:
        build_bundle("2x4-mapped", **SERVER, transport="tcp", base_port=8079, listen=["127.0.0.1:8080"])
    assert err.value.field == "base_port"


def test_a_strategy_of_another_server_is_refused(monkeypatch):
    """Peer servers (gunicorn, granian) are strategies too; a bundle ships uWSGI only."""
    other = Shared(name="fakegunicorn", summary="(a stand-in: a strategy of another server)")
    object.__setattr__(other, "server", "gunicorn")
    monkeypatch.setitem(STRATEGIES, "fakegunicorn", other)
    with pytest.raises(LayoutError) as err:
        build_bundle("2x4-fakegunicorn", **SERVER)
    assert err.value.field == "layout" and "runs gunicorn, not uWSGI" in str(err.value)
    assert "fakegunicorn" not in str(err.value).split("uWSGI strategies:")[1]


def test_relocate_moves_only_the_bundle_system_paths():
    text = ("server unix:/run/shop/uwsgi-0.sock;\nssl_certificate /etc/ssl/certs/shop.crt;\n"
            "ExecStart=/srv/shop/venv/bin/uwsgi --ini /etc/uwsgi-layouts/shop.ini\n"
            "chdir = /srv/run/shop\n[ ! -p /run/shop/master.fifo ] || echo l > /run/shop/master.fifo\n"
            "/run/shopping/x /var/log/shop/*.log /var/log/nginx/shop.access.log\n")
    moved = relocate(text, "shop", Path("/tmp/root"))
    assert moved == ("server unix:/tmp/root/run/shop/uwsgi-0.sock;\nssl_certificate /tmp/root/etc/ssl/certs/shop.crt;\n"
                     "ExecStart=/srv/shop/venv/bin/uwsgi --ini /tmp/root/etc/uwsgi-layouts/shop.ini\n"
                     "chdir = /srv/run/shop\n[ ! -p /tmp/root/run/shop/master.fifo ] || echo l > "
                     "/tmp/root/run/shop/master.fifo\n/run/shopping/x /tmp/root/var/log/shop/*.log "
                     "/tmp/root/var/log/nginx/shop.access.log\n")
    assert relocate(text, "shop", Path("/")) == text


def test_render_is_pure_and_repeatable():
    one = render_bundle(build_bundle("2x4-mapped", **SERVER))
    two = render_bundle(build_bundle("2x4-mapped", **SERVER))
    assert one == two


# --- bad input: exit 2, one line, nothing written ----------------------------------------------------


def run_bundle(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", "bundle", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=60)


def bad_inputs(scratch: Path, tls_pair: tuple[Path, Path]) -> dict[str, tuple[list[str], str, str]]:
    cert, key = (str(p) for p in tls_pair)
    other_cert, other_key = make_cert(scratch, "other.example.com")
    enc_cert, enc_key = make_cert(scratch, "enc.example.com", encrypt=True)
    both = scratch / "both.pem"
    both.write_text(Path(key).read_text() + Path(cert).read_text())
    app = ["--app", "shop:app", "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv"]
    return {
        "name-with-slash": ([*app, "--name", "shop/eu"], "name", "lowercase letters"),
        "name-uppercase": ([*app, "--name", "Shop"], "name", "lowercase letters"),
        "cert-without-key": ([*app, "--tls-cert", cert], "tls_cert", "needs --tls-key"),
        "key-without-cert": ([*app, "--tls-key", key], "tls_key", "needs --tls-cert"),
        "unreadable-cert": ([*app, "--tls-cert", str(scratch / "missing.pem"), "--tls-key", key], "tls_cert",
                            "cannot read"),
        "cert-is-a-directory": ([*app, "--tls-cert", str(scratch), "--tls-key", key], "tls_cert", "cannot read"),
        "key-of-another-cert": ([*app, "--tls-cert", cert, "--tls-key", str(other_key)], "tls_key",
                                "does not belong to the certificate"),
        "encrypted-key": ([*app, "--tls-cert", str(enc_cert), "--tls-key", str(enc_key)], "tls_key", "encrypted"),
        "cert-holding-a-key": ([*app, "--tls-cert", str(both), "--tls-key", key], "tls_cert", "also holds a private"),
        "unknown-strategy": ([*app], "strategy", "unknown strategy 'roundrobin'"),
        "relative-app-dir": (["--app", "shop:app", "--app-dir", "srv/shop", "--virtualenv", "/srv/shop/venv"],
                             "app_dir", "absolute path"),
        "app-dir-in-etc": (["--app", "shop:app", "--app-dir", "/etc/shop", "--virtualenv", "/srv/shop/venv"],
                           "app_dir", "under /etc"),
        "no-virtualenv": (["--app", "shop:app", "--app-dir", "/srv/shop"], "virtualenv", "a bundle needs"),
        "space-in-path": (["--app", "shop:app", "--app-dir", "/srv/my shop", "--virtualenv", "/srv/v"], "app_dir",
                          "unquoted"),
        "bad-listen": ([*app, "--listen", "localhost:80"], "listen", "IPV4:PORT"),
        "tls-listen-without-tls": ([*app, "--tls-listen", "8443"], "tls_listen", "needs --tls-cert"),
        "bad-body-size": ([*app, "--client-max-body-size", "10 MB"], "client_max_body_size", "10m"),
        "bad-server-name": ([*app, "--server-name", "shop;evil"], "server_name", "host name"),
        "root-user": ([*app, "--user", "root"], "user", "root is refused"),
        "bad-static": ([*app, "--static", "/=/srv/shop/static"], "static", "prefix '/'"),
        "bad-env": ([*app, "--env", "UWSGI_MODULE=x"], "env", "UWSGI_MODULE is refused"),
    }


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, tls_pair, record_property):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cases = bad_inputs(scratch, tls_pair)
    record_property("cases", list(cases))
    for name, (options, field, words) in cases.items():
        parent = tmp_path / name
        parent.mkdir()
        spec = "2x4-roundrobin" if name == "unknown-strategy" else "2x4-mapped"
        proc = run_bundle(spec, "--out", str(parent / "out"), *options)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert lines[0].startswith(f"error: {field}: "), (name, lines[0])
        assert words in lines[0], (name, lines[0])
        assert list(parent.iterdir()) == [], (name, "wrote something")


def test_out_must_be_new_or_empty(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.conf").write_text("mine\n")
    proc = run_bundle("2x4-mapped", "--out", str(out), "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv")
    assert proc.returncode == 2 and proc.stderr.startswith("error: out: ") and "not an empty directory" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["old.conf"] and (out / "old.conf").read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_bundle("2x4-mapped", "--out", str(empty), "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv")
    assert proc.returncode == 0, proc.stderr
    assert (empty / "bundle.json").is_file()
    assert "next, on the server: python -m deploy install" in proc.stdout


def test_bundle_cli_defaults(tmp_path):
    out = tmp_path / "b"
    proc = run_bundle("2x4-mapped", "--out", str(out), "--app", "shop.wsgi:application", "--app-dir", "/srv/shop",
                      "--virtualenv", "/srv/shop/venv")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "bundle.json").read_text())
    assert record["name"] == "shop" and record["server"]["user"] == "www-data"
    assert record["server"]["uwsgi"] == "/srv/shop/venv/bin/uwsgi"
    site = (out / "nginx/sites-available/shop.conf").read_text()
    assert "server_name _;" in site and "client_max_body_size 10m;" in site
    assert "sites-enabled/default" in (out / "INSTALL.md").read_text(), "warns about Debian's default site"


def test_bundle_help_lists_it():
    proc = subprocess.run([sys.executable, "-m", "deploy", "--help"], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert "bundle" in proc.stdout and "install" in proc.stdout
    assert os.path.basename(bundle_mod.__file__) == "bundle.py"
