"""`uwsgi-layouts bundle`: the files a Debian/Ubuntu server takes as they are.

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

from tests.bundles import make_cert, systemd_analyze_verify
from tests.test_cli import cli_in_process
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import STRATEGIES, LayoutError
from uwsgi_layouts.deploy.model.strategies import Shared
from uwsgi_layouts.deploy.render import find_directives, parse_uwsgi_ini
from uwsgi_layouts.deploy.ship import (
    build_bundle,
    generated_for,
    relocate,
    render_bundle,
    unit_directives,
    write_bundle,
)
from uwsgi_layouts.deploy.ship import bundle as bundle_mod
from uwsgi_layouts.deploy.ship.preinstall import check_uwsgi_python

SERVER = {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv",
          "server_names": ["shop.example.com"]}


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


def bundle_dir(tmp_path: Path, spec: str = "2x4-mapped", **options) -> Path:
    out = tmp_path / "bundle"
    write_bundle(build_bundle(spec, **{**SERVER, **options}), out)
    return out


def site_config(out: Path, name: str = "shop", slot: str = "blue") -> list[dict]:
    """The site parsed by crossplane inside an http {} block, as Debian's nginx.conf includes it."""
    wrapper = out.parent / "nginx.conf"
    shutil.copy(PACKAGE_DIR / "templates/uwsgi_params", out.parent / "uwsgi_params")
    wrapper.write_text(f"events {{}}\nhttp {{\n    include {out}/{slot}/nginx/sites-available/{name}.conf;\n}}\n")
    payload = crossplane.parse(str(wrapper), combine=True)
    assert payload["status"] == "ok", payload["errors"]
    return payload["config"][0]["parsed"]


def ini_values(out: Path, name: str = "shop", slot: str = "blue") -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for key, value in parse_uwsgi_ini((out / f"{slot}/uwsgi/{name}@{slot}.ini").read_text()):
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
    assert {d["directive"] for d in http} == {"upstream", "server", "log_format"}, "upstream, server, log_format"
    assert [d["args"][0] for d in http if d["directive"] == "log_format"] == ["uwsgi_layouts_shop_timed"]
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
            assert address.startswith("/run/shop/blue/"), address
        else:
            assert ipaddress.ip_address(address.rpartition(":")[0]).is_loopback, address
    if transport == "unix":
        assert ini["chmod-socket"] == ["660"] and ini["chown-socket"] == ["shop:www-data"]
        assert all(a.startswith("unix:/run/shop/blue/") for a in (args[0] for args in servers))
    else:
        assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert ini["pidfile"] == ["/run/shop/blue/uwsgi.pid"] and ini["master-fifo"] == ["/run/shop/blue/master.fifo"]
    assert ini["shutdown-sockets"] == ["true"], "a graceful stop refuses new connections at once"
    assert ini["logto"] == ["/var/log/shop/uwsgi.log"]
    assert ini["virtualenv"] == ["/srv/shop/venv"] and ini["chdir"] == ["/srv/shop"]
    assert ini["uid"] == ["shop"] and ini["gid"] == ["shop"]
    assert ini["env"] == ["SHOP_GREETING=50%% off"]
    assert "die-on-term" not in ini, "uWSGI 2.0 turns systemd's SIGQUIT into a reload under die-on-term"

    listens = [d["args"] for d in find_directives(http, "listen")]
    # The catch-all servers come first, one per port, named for this bundle only.
    servers_ = [d for d in http if d["directive"] == "server"]
    names = [next(x["args"] for x in srv["block"] if x["directive"] == "server_name") for srv in servers_]
    assert names[: 1 + tls] == [["unknown-host.shop.invalid"]] * (1 + tls)
    assert all(n == ["shop.example.com"] for n in names[1 + tls:])
    catch_http = [x["args"] for x in servers_[0]["block"] if x["directive"] in ("listen", "return")]
    assert catch_http == [["80"], ["[::]:80"], ["444"]]
    if tls:
        catch_tls = [x["args"] for x in servers_[1]["block"]
                     if x["directive"] in ("listen", "ssl_reject_handshake", "return")]
        assert catch_tls == [["443", "ssl", "http2"], ["[::]:443", "ssl", "http2"], ["on"], ["444"]]
        assert ["443", "ssl", "http2"] in listens and ["[::]:443", "ssl", "http2"] in listens
        assert ["80"] in listens
        returns = [d["args"] for d in find_directives(http, "return")]
        assert returns == [["444"], ["444"], ["301", "https://$host$request_uri"]]
        assert [d["args"] for d in find_directives(http, "ssl_certificate")] == [[str(tls_pair[0])]]
        protocols = [d["args"] for d in find_directives(http, "ssl_protocols")]
        assert protocols == [["TLSv1.2", "TLSv1.3"]]
        ciphers = find_directives(http, "ssl_ciphers")[0]["args"][0].split(":")
        assert ciphers and all(c.startswith("ECDHE-") and ("GCM" in c or "CHACHA20" in c) for c in ciphers)
    else:
        assert listens == [["80"], ["[::]:80"]] * 2
        assert not find_directives(http, "ssl_certificate")
    params = {d["args"][0]: d["args"][1] for d in find_directives(http, "uwsgi_param")}
    assert params["HTTP_HOST"] == "$host" and params["HTTP_X_FORWARDED_PROTO"] == "$scheme"
    assert params["HTTP_X_FORWARDED_FOR"] == "$proxy_add_x_forwarded_for"
    alone = crossplane.parse(str(out / "blue/nginx/sites-available/shop.conf"), single=True, check_ctx=False)
    [root_location] = [d for d in find_directives(alone["config"][0]["parsed"], "location") if d["args"] == ["/"]
                       and find_directives(d["block"], "uwsgi_pass")]
    assert ["uwsgi_params"] in [d["args"] for d in root_location["block"] if d["directive"] == "include"]
    assert find_directives(http, "client_max_body_size")[0]["args"] == ["10m"]
    statics = {d["args"][-1]: d for d in find_directives(http, "location") if d["args"][0] == "^~"}
    assert list(statics) == ["/assets/"]


def test_bundle_names_no_path_of_this_lab(tmp_path, tls_pair):
    """Only the certificate's paths, which are the server's by definition (used in place)."""
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    lab = [str(PACKAGE_DIR), sys.prefix, sys.executable, "/tmp/", "build/", str(tmp_path)]
    for rel, text in all_texts(out).items():
        text = text.replace(str(tls_pair[0]), "CERT").replace(str(tls_pair[1]), "KEY")
        for path in lab:
            assert path not in text, f"{rel} names {path}"


def test_the_default_uwsgi_is_pyuwsgi_in_the_virtualenv_and_reexecutes_its_python(tmp_path):
    """Without --uwsgi the server's uWSGI is pyuwsgi in the app's virtualenv: its uwsgi.ini sets
    binary-path to that virtualenv's python (a full reload of pyuwsgi would otherwise re-execute
    /proc/self/exe, python3 outside the virtualenv); a --uwsgi binary gets none."""
    default = bundle_dir(tmp_path / "default", "2x4-mapped", user="shop")
    ini = (default / "blue/uwsgi/shop@blue.ini").read_text()
    assert "\nbinary-path = /srv/shop/venv/bin/python\n" in ini, ini
    record = json.loads((default / "bundle.json").read_text())["server"]
    assert (record["uwsgi"], record["pyuwsgi"]) == ("/srv/shop/venv/bin/uwsgi", True)
    binary = bundle_dir(tmp_path / "binary", "2x4-mapped", user="shop", uwsgi="/opt/uwsgi/bin/uwsgi")
    assert "binary-path" not in (binary / "blue/uwsgi/shop@blue.ini").read_text()
    assert json.loads((binary / "bundle.json").read_text())["server"]["pyuwsgi"] is False


def test_install_refuses_a_uwsgi_of_another_kind_or_virtualenv(tmp_path):
    """On the server: pyuwsgi must be run by the bundle's virtualenv's python (it runs the app in the
    venv whose python starts it), and be the kind the bundle was made for."""
    venv, other = tmp_path / "venv", tmp_path / "other"
    for v in (venv, other):
        (v / "bin").mkdir(parents=True)
    launcher = venv / "bin" / "uwsgi"
    launcher.write_text(f"#!{other}/bin/python\n")
    with pytest.raises(LayoutError, match=r"^uwsgi: .* is pyuwsgi run by .*other/bin/python: the app would run in "
                                          r".*other, not in .*venv: install pyuwsgi into"):
        check_uwsgi_python(launcher, venv, pyuwsgi=True)
    launcher.write_text(f"#!{venv}/bin/python\n")
    check_uwsgi_python(launcher, venv, pyuwsgi=True)
    with pytest.raises(LayoutError, match=r"^uwsgi: .* is pyuwsgi \(a script\), but the bundle was made for a uWSGI "
                                          "binary"):
        check_uwsgi_python(launcher, venv, pyuwsgi=False)
    with pytest.raises(LayoutError, match=r"^uwsgi: .* is a uWSGI binary, but the bundle was made for pyuwsgi"):
        check_uwsgi_python(Path("/bin/ls"), venv, pyuwsgi=True)


def test_unit_passes_systemd_analyze_verify(tmp_path):
    """systemd's own parser: no warning (it ignores a bad line with rc 0, so stderr must be empty)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/install-system-deps.sh installs systemd"
    # The unit names its uWSGI, which verify requires to exist: our own, for this check only.
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", uwsgi=str(Path(sys.prefix) / "bin" / "uwsgi"))
    unit = out / "green/systemd/shop@green.service"
    proc = systemd_analyze_verify(analyze, unit)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    # ...and the check can fail: a misspelt value is reported.
    broken = tmp_path / "shop@green.service"
    broken.write_text(unit.read_text().replace("KillSignal=SIGQUIT", "KillSignal=SIGQUITE"))
    proc = systemd_analyze_verify(analyze, broken)
    assert "SIGQUITE" in proc.stderr


def test_unit_settings(tmp_path):
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", writable=["/srv/shop/media"], harakiri="20")
    text = (out / "blue/systemd/shop@blue.service").read_text()
    unit = {(section, key): value for section, key, value in unit_directives(text)}
    expected = {
        "Type": "notify", "NotifyAccess": "all", "KillSignal": "SIGQUIT", "KillMode": "mixed",
        "TimeoutStopSec": "35", "Restart": "on-failure", "RuntimeDirectory": "shop/blue", "LogsDirectory": "shop",
        "User": "shop", "Group": "shop", "SupplementaryGroups": "www-data",
        "ExecStart": "/srv/shop/venv/bin/uwsgi --ini /etc/uwsgi-layouts/shop@blue.ini",
        "ExecReload": "/bin/sh -c 'echo c > /run/shop/blue/master.fifo'", "ProtectSystem": "strict",
        "ReadWritePaths": "/srv/shop/media", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
    }
    assert {k: unit.get(("Service", k)) for k in expected} == expected
    assert unit[("Install", "WantedBy")] == "multi-user.target"
    # The graceful stop: q on the FIFO, the grace (harakiri by default) as the bound, then SIGTERM.
    stop = unit[("Service", "ExecStop")]
    assert 'timeout 5 sh -c "echo q > /run/shop/blue/master.fifo"' in stop and "timeout 20 sh -c" in stop
    assert "|| kill -TERM $$MAINPID" in stop
    green = unit_directives((out / "green/systemd/shop@green.service").read_text())
    assert ("Service", "RuntimeDirectory", "shop/green") in green
    grace = bundle_dir(tmp_path / "grace", "2x4-mapped", stop_grace="7")
    assert "TimeoutStopSec=22\n" in (grace / "blue/systemd/shop@blue.service").read_text()
    # An app under /home stays readable, one under /tmp keeps its /tmp.
    home = bundle_dir(tmp_path / "home", "1x1-shared", app_dir="/home/deploy/shop", virtualenv="/home/deploy/venv")
    text = (home / "blue/systemd/shop@blue.service").read_text()
    assert "ProtectHome=read-only" in text and "PrivateTmp=yes" in text
    tmp = bundle_dir(tmp_path / "tmp", "1x1-shared", app_dir="/tmp/shop", virtualenv="/tmp/shop/venv")
    assert "\nPrivateTmp=" not in (tmp / "blue/systemd/shop@blue.service").read_text()


def test_every_file_carries_the_header_with_the_bundle_name(tmp_path, tls_pair):
    out = bundle_dir(tmp_path, "2x4-mapped", name="shop-eu", tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    record = json.loads((out / "bundle.json").read_text())
    assert record["name"] == "shop-eu" and record["format_version"] == 1
    for f in record["files"]:
        assert generated_for((out / f["path"]).read_text()) == "shop-eu", f["path"]
    assert "do not edit" in (out / "INSTALL.md").read_text().splitlines()[1]
    assert generated_for("# Generated from layout 2x4-mapped by `uwsgi-layouts render`: do not edit.") is None
    assert out.stat().st_mode & 0o777 == 0o700


def test_certificates_are_named_in_place_never_copied(tmp_path, tls_pair):
    """A renewal tool rewrites its own files: the site names them, the bundle holds no PEM."""
    cert, key = tls_pair
    out = bundle_dir(tmp_path, "2x4-mapped", tls_cert=str(cert), tls_key=str(key), acme_webroot="/var/www/acme")
    texts = all_texts(out)
    assert not any("BEGIN" in text for text in texts.values()), "no certificate or key copied into the bundle"
    for slot in ("blue", "green"):
        site = texts[f"{slot}/nginx/sites-available/shop.conf"]
        assert f"ssl_certificate {cert};" in site and f"ssl_certificate_key {key};" in site
    record = json.loads(texts["bundle.json"])
    assert (record["tls_cert"], record["tls_key"], record["acme_webroot"]) == (str(cert), str(key), "/var/www/acme")
    # ACME http-01 on port 80 before the redirect (a server-level `return` would run first).
    http = site_config(out)[1]["block"]
    redirect = [d for d in http if d["directive"] == "server" and find_directives(d["block"], "return")
                and find_directives(d["block"], "return")[0]["args"][0] == "301"]
    assert len(redirect) == 1
    assert [d["directive"] for d in redirect[0]["block"]].count("return") == 0, "the redirect is in location /"
    locations = {" ".join(d["args"]): d for d in find_directives(redirect[0]["block"], "location")}
    assert list(locations) == ["^~ /.well-known/acme-challenge/", "/"]
    acme = {d["directive"]: d["args"] for d in locations["^~ /.well-known/acme-challenge/"]["block"]}
    assert acme["root"] == ["/var/www/acme"] and acme["try_files"] == ["$uri", "=404"]
    # Without TLS the webroot is served by the site itself, still before location /.
    plain = bundle_dir(tmp_path / "plain", "2x4-mapped", acme_webroot="/var/www/acme")
    http = site_config(plain)[1]["block"]
    app = [d for d in http if d["directive"] == "server" and find_directives(d["block"], "uwsgi_pass")][0]
    assert [" ".join(d["args"]) for d in app["block"] if d["directive"] == "location"][:2] == [
        "^~ /.well-known/acme-challenge/", "/"]


def test_a_site_for_any_host_has_no_catch_all(tmp_path):
    out = bundle_dir(tmp_path, "2x4-mapped", server_names=None)
    http = site_config(out)[1]["block"]
    assert [d["args"] for d in find_directives(http, "server_name")] == [["_"]]
    assert not find_directives(http, "ssl_reject_handshake") and not find_directives(http, "return")


def test_slots_differ_only_in_names_paths_and_ports(tmp_path):
    """blue and green: the same configuration on their own sockets, so both can run at once."""
    out = bundle_dir(tmp_path, "2x4-mapped", transport="tcp", base_port="5000")
    texts = all_texts(out)
    for kind in ("nginx/sites-available/shop.conf", "uwsgi/shop@{}.ini", "systemd/shop@{}.service"):
        blue, green = (texts[f"{slot}/{kind.format(slot)}"] for slot in ("blue", "green"))
        assert blue != green
        swapped = green.replace("green", "blue").replace("127.0.0.1:6000", "127.0.0.1:5000") \
            .replace("127.0.0.1:6001", "127.0.0.1:5001")
        assert swapped == blue, kind
    assert ini_values(out, slot="green")["socket"] == ["127.0.0.1:6000", "127.0.0.1:6001"]
    with pytest.raises(LayoutError, match="base_port: the second slot's sockets need ports up to 66001"):
        build_bundle("2x4-mapped", **SERVER, transport="tcp", base_port="65000")
    rotate = texts["logrotate/shop"]
    assert "/run/shop/blue/master.fifo" in rotate and "/run/shop/green/master.fifo" in rotate


def test_install_md_has_the_commands_of_this_bundle(tmp_path, tls_pair):
    out = bundle_dir(tmp_path, "2x4-mapped", user="shop", server_names=["shop.example.com"],
                     tls_cert=str(tls_pair[0]), tls_key=str(tls_pair[1]))
    text = (out / "INSTALL.md").read_text()
    for line in ["install -m 0640 -o root -g shop blue/uwsgi/shop@blue.ini /etc/uwsgi-layouts/shop@blue.ini",
                 "ln -s /etc/nginx/sites-available/shop.conf /etc/nginx/sites-enabled/shop.conf",
                 "install -m 0640 -o www-data -g adm /dev/null /var/log/nginx/shop.$log.log",
                 "nginx -t", "systemctl enable --now shop@blue.service", "systemctl reload shop@SLOT",
                 "systemctl stop shop@SLOT", "uwsgi-layouts uninstall shop --dry-run",
                 "systemctl disable --now shop@SLOT", "rm /etc/uwsgi-layouts/shop@SLOT.ini",
                 "adduser --system --group --no-create-home --home /srv/shop shop",
                 "/srv/shop/venv/bin/pip download --no-deps --no-binary :all: -d \"$src\" 'uwsgi>=2.0.28,<2.1'",
                 "cp -p /srv/shop/venv/bin/pyuwsgi /srv/shop/venv/bin/uwsgi", "curl -sSI https://shop.example.com/",
                 "/etc/letsencrypt/renewal-hooks/deploy/reload-nginx", "--reloadcmd \"systemctl reload nginx\""]:
        assert line in text, line
    assert "tls/" not in text and "/etc/ssl/private" not in text


def test_rendering_into_a_private_directory_works(tmp_path):
    """The issue's first report: as root, --out in a fresh 0700 directory. A bundle does not
    check what the run user could reach on the rendering machine."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    out = private / "bundle"
    write_bundle(build_bundle("2x4-mapped", **SERVER), out)
    assert (out / "blue/uwsgi/shop@blue.ini").is_file()
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
    assert moved == ("server unix:/tmp/root/run/shop/uwsgi-0.sock;\nssl_certificate /etc/ssl/certs/shop.crt;\n"
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
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts",
                           "bundle", *args], cwd=PACKAGE_DIR, capture_output=True,
                          text=True, timeout=60)


def bad_inputs(scratch: Path, tls_pair: tuple[Path, Path], open_dir: Path) -> dict[str, tuple[list[str], str, str]]:
    cert, key = (str(p) for p in tls_pair)
    other_cert, other_key = make_cert(scratch, "other.example.com")
    enc_cert, enc_key = make_cert(scratch, "enc.example.com", encrypt=True)
    both = scratch / "both.pem"
    both.write_text(Path(key).read_text() + Path(cert).read_text())
    # A key any local user can read: world-readable, in directories everyone may traverse.
    open_cert, open_key = make_cert(open_dir, "open.example.com")
    open_key.chmod(0o644)
    app = ["--app", "shop:app", "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv", "--server-name",
           "shop.example.com"]
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
        "relative-cert": ([*app, "--tls-cert", "shop.crt", "--tls-key", key], "tls_cert", "must be an absolute path"),
        "key-readable-by-all": ([*app, "--tls-cert", str(open_cert), "--tls-key", str(open_key)], "tls_key",
                                "readable by every local user"),
        "acme-webroot-in-etc": ([*app, "--acme-webroot", "/etc/acme"], "acme_webroot", "under /etc"),
        "bad-stop-grace": ([*app, "--stop-grace", "0"], "stop_grace", "whole seconds in 1..3600"),
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
        "static-in-var-lib": ([*app, "--static", "/s=/var/lib/shop"], "static", "--allow-system-static"),
        "static-in-root": ([*app, "--static", "/s=/root/site"], "static", "--allow-system-static"),
    }


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, tls_pair, record_property, run_dirs):
    """Each case in this process (a new interpreter per case cost about a second of CPU each: the
    first case below runs as a user runs it, a process of its own, to keep the entry point itself in)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    open_dir = run_dirs()  # /tmp/ul-*: traversable by every user (pytest's tmp_path is not)
    open_dir.chmod(0o755)
    cases = bad_inputs(scratch, tls_pair, open_dir)
    record_property("cases", list(cases))
    for i, (name, (options, field, words)) in enumerate(cases.items()):
        parent = tmp_path / name
        parent.mkdir()
        spec = "2x4-roundrobin" if name == "unknown-strategy" else "2x4-mapped"
        argv = (spec, "--out", str(parent / "out"), *options)
        proc = run_bundle(*argv) if i == 0 else cli_in_process("bundle", *argv)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert lines[0].startswith(f"error: {field}: "), (name, lines[0])
        assert words in lines[0], (name, lines[0])
        assert list(parent.iterdir()) == [], (name, "wrote something")


def test_certificates_not_on_this_machine_are_checked_by_install(tmp_path):
    """A bundle made away from the server names certificates only the server holds."""
    out = bundle_dir(tmp_path, "2x4-mapped", tls_cert="/etc/letsencrypt/live/shop/fullchain.pem",
                     tls_key="/etc/letsencrypt/live/shop/privkey.pem")
    assert "ssl_certificate /etc/letsencrypt/live/shop/fullchain.pem;" in \
        (out / "green/nginx/sites-available/shop.conf").read_text()


def test_out_must_be_new_or_empty(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.conf").write_text("mine\n")
    proc = run_bundle("2x4-mapped", "--out", str(out), "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv",
                      "--server-name", "shop.example.com")
    assert proc.returncode == 2 and proc.stderr.startswith("error: out: ") and "not an empty directory" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["old.conf"] and (out / "old.conf").read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_bundle("2x4-mapped", "--out", str(empty), "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv",
                      "--server-name", "shop.example.com")
    assert proc.returncode == 0, proc.stderr
    assert (empty / "bundle.json").is_file()
    assert "next, on the server: uwsgi-layouts install" in proc.stdout


def test_bundle_cli_defaults(tmp_path):
    out = tmp_path / "b"
    app = ["--app", "shop.wsgi:application", "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv"]
    proc = run_bundle("2x4-mapped", "--out", str(out), *app, "--server-name", "shop.example.com")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "bundle.json").read_text())
    assert record["name"] == "shop" and record["server"]["user"] == "www-data" and record["stop_grace"] == 30
    assert record["server"]["uwsgi"] == "/srv/shop/venv/bin/uwsgi"
    site = (out / "blue/nginx/sites-available/shop.conf").read_text()
    assert "server_name shop.example.com;" in site and "client_max_body_size 10m;" in site
    assert "server_name unknown-host.shop.invalid;" in site
    # Every Host only when asked for by an option named for the risk; never both.
    for options, words in [([], "give the site's host names with --server-name HOST"),
                           (["--any-host", "--server-name", "a.example"], "drop --server-name or --any-host")]:
        proc = run_bundle("2x4-mapped", "--out", str(tmp_path / "refused"), *app, *options)
        assert proc.returncode == 2 and proc.stderr.startswith("error: server_name: ") and words in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "refused").exists()
    proc = run_bundle("2x4-mapped", "--out", str(tmp_path / "any"), *app, "--any-host")
    assert proc.returncode == 0, proc.stderr
    assert "server_name _;" in (tmp_path / "any/blue/nginx/sites-available/shop.conf").read_text()
    assert "sites-enabled/default" in (tmp_path / "any/INSTALL.md").read_text(), "warns about Debian's default site"


def test_bundle_help_lists_it():
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "--help"], cwd=PACKAGE_DIR, capture_output=True,
                          text=True, timeout=60)
    assert "bundle" in proc.stdout and "install" in proc.stdout
    assert os.path.basename(bundle_mod.__file__) == "bundle.py"


# --- install's pure parts: nginx -t's messages about the site, the app's fingerprint ----------------


def test_nginx_t_messages_about_the_site_name_the_other_file(tmp_path):
    """What nginx prints names one file (or none): the other one is found in the configuration."""
    from uwsgi_layouts.deploy.ship.conflicts import site_conflicts

    (tmp_path / "sites").mkdir()
    ours = tmp_path / "sites/shop.conf"
    ours.write_text("server { listen 127.0.0.1:8080; server_name shop.example.com; }\n")
    other = tmp_path / "sites/old"
    other.write_text("server { listen 127.0.0.1:8080 backlog=511; server_name shop.example.com www.example.com; }\n"
                     "server { listen 9090; server_name shop.example.com; }\n")
    unrelated = tmp_path / "sites/blog"
    unrelated.write_text("server { listen 127.0.0.1:7070 reuseport; server_name blog.example.com; }\n")
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"events {{}}\nhttp {{\n    include {tmp_path}/sites/*;\n}}\n")
    output = ('nginx: [warn] conflicting server name "shop.example.com" on 127.0.0.1:8080, ignored\n'
              'nginx: [warn] conflicting server name "www.example.com" on 127.0.0.1:8080, ignored\n'
              f"nginx: [emerg] duplicate listen options for 127.0.0.1:8080 in {ours}:1\n"
              f"nginx: [emerg] duplicate listen options for 127.0.0.1:7070 in {unrelated}:1\n")
    lines = site_conflicts(output, conf, {str(ours)}, {"shop.example.com"})
    assert lines == [f'conflicting server name "shop.example.com" on 127.0.0.1:8080: also in {other}',
                     f"duplicate listen options for 127.0.0.1:8080: also in {other}"]
    assert site_conflicts("nginx: configuration file test is successful\n", conf, {str(ours)}, set()) == []


def test_the_app_fingerprint_sees_code_and_packages_not_caches_or_uploads(tmp_path):
    from uwsgi_layouts.deploy.ship.manifest import app_fingerprint

    app, venv = tmp_path / "app", tmp_path / "app/venv"
    for d in (app / "pkg/__pycache__", app / "media", app / "static", venv / "lib"):
        d.mkdir(parents=True)
    (app / "pkg/views.py").write_text("X = 1\n")
    (venv / "lib/flask.py").write_text("V = 1\n")
    fingerprint = lambda: app_fingerprint(str(app), str(venv), [str(app / "static"), str(app / "media")])  # noqa: E731
    first = fingerprint()
    (app / "pkg/__pycache__/views.cpython-311.pyc").write_bytes(b"\0")
    (app / "media/upload.jpg").write_bytes(b"\0")
    (app / "static/site.css").write_text("body {}\n")
    assert fingerprint() == first, "caches, uploads and static files are not code"
    (app / "pkg/views.py").write_text("X = 22\n")  # another size: mtimes may share a clock tick
    second = fingerprint()
    assert second != first
    (venv / "lib/flask.py").write_text("V = 22\n")
    assert fingerprint() != second, "a package upgraded in the virtualenv is new code too"


def test_a_static_directory_among_the_systems_is_served_only_when_allowed_by_name(tmp_path):
    app = ["--app", "shop:app", "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv", "--server-name",
           "shop.example.com", "--static", "/s=/var/lib/shop/static"]
    proc = run_bundle("2x4-mapped", "--out", str(tmp_path / "allowed"), *app, "--allow-system-static")
    assert proc.returncode == 0, proc.stderr
    assert "/var/lib/shop/static" in (tmp_path / "allowed/blue/nginx/sites-available/shop.conf").read_text()
