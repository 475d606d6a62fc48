"""The variants scripts/overhead.py tries, on paper: uWSGI's HTTP sockets (``@protocol=http``,
``@protocol=http11``): the rendered uwsgi.ini and nginx.conf, checked by `nginx -t` and the
cross-checks; the layout.json of older runs; what a bundle refuses; another uWSGI build
(``uwsgi_bin``) and the checks on it. tests/integration/test_overhead.py serves requests
through them.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_peers_render import make, nginx_directives
from uwsgi_layouts.deploy.machine import checked, find_uwsgi, uwsgi_python
from uwsgi_layouts.deploy.machine import python as machine_python
from uwsgi_layouts.deploy.machine.python import check_uwsgi_bin, uwsgi_has_routing, uwsgi_has_ssl
from uwsgi_layouts.deploy.model import LayoutError, layout_from_record, parse_variant
from uwsgi_layouts.deploy.render import LAYOUT_JSON_VERSION, crosscheck, parse_uwsgi_ini, render_texts, write_layout
from uwsgi_layouts.deploy.run.servers import PYUWSGI_LAUNCHER, process_for
from uwsgi_layouts.deploy.ship import build_bundle

CASES = [
    # (layout, options, uWSGI socket option, nginx keeps connections)
    ("2x4-mapped", {}, "socket", False),
    ("2x4-mapped@protocol=http", {}, "http-socket", False),
    ("2x4-mapped@protocol=http", {"transport": "unix"}, "http-socket", False),
    ("2x4-shared@protocol=http", {"nginx_workers": 2}, "http-socket", False),
    ("2x4-mapped@protocol=http11", {}, "http11-socket", True),
    ("1x4-shared@protocol=http11", {"transport": "unix"}, "http11-socket", True),
]


@pytest.mark.parametrize("variant,options,option,kept", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_uwsgi_http_sockets_render_and_cross_check(make_layout, variant, options, option, kept):
    layout = make(make_layout, variant, **options)
    result = write_layout(layout, layout.run_dir)
    out = Path(layout.run_dir)
    assert "syntax is ok" in result.nginx_test and crosscheck(layout, out) == []
    ini = parse_uwsgi_ini((out / "uwsgi.ini").read_text())
    bound = [(k, v) for k, v in ini if k.endswith("socket") and k not in ("chmod-socket", "chown-socket", "map-socket")]
    assert bound == [(option, s.address) for s in layout.sockets]
    assert dict(ini).get("socket-timeout") == ("30" if kept else None)  # longer than nginx's 20 s idle
    nginx = nginx_directives(out / "nginx.conf")
    if option == "socket":
        assert nginx["uwsgi_pass"] == [["uwsgi_app"]] and "proxy_pass" not in nginx
    else:
        assert nginx["proxy_pass"] == [["http://uwsgi_app"]] and "uwsgi_pass" not in nginx
    assert ("keepalive" in nginx) == kept and ("proxy_http_version" in nginx) == kept
    servers = [args for args in nginx["server"] if args]  # upstream servers, not the `server {}` block
    if kept:  # never more kept connections to a worker's socket than it has threads
        assert all(f"max_conns={layout.threads}" in args for args in servers)
        assert nginx["keepalive_timeout"] == [["20s"]] and nginx["worker_processes"] == [["1"]]
    else:
        assert not any(a.startswith("max_conns=") for args in servers for a in args)


def test_http11_is_refused_where_kept_connections_could_outnumber_a_workers_threads():
    for variant, words in (("2x4-shared@protocol=http11", "one socket per worker"),
                           ("2x4-overflow@protocol=http11", "one socket per worker"),
                           ("2x4-mapped@protocol=http11,nginx_workers=auto", "nginx_workers 1")):
        with pytest.raises(LayoutError) as info:
            parse_variant(variant, run_dir="/tmp/ul-never")
        assert info.value.field == "protocol" and words in str(info.value), variant


def test_protocols_each_server_speaks():
    assert parse_variant("2x4-mapped", run_dir="/tmp/x").protocol == "uwsgi"
    assert parse_variant("2x4-gunicorn", run_dir="/tmp/x").protocol == "http"
    assert parse_variant("2x4-granian", run_dir="/tmp/x").protocol == "http"
    with pytest.raises(LayoutError, match="granian speaks http to nginx, got 'uwsgi'"):
        parse_variant("2x4-granian@protocol=uwsgi", run_dir="/tmp/x")
    with pytest.raises(LayoutError, match="only uwsgi speak it"):
        parse_variant("2x4-gunicorn@protocol=http11", run_dir="/tmp/x")


def test_keepalive_is_what_each_layout_says():
    kept = {v: parse_variant(v, run_dir="/tmp/x").upstream_keepalive for v in (
        "2x4-gunicorn", "2x4-gunicorn@keepalive=off", "2x4-granian@keepalive=off", "2x4-gunicorn@protocol=uwsgi",
        "2x4-mapped", "2x4-mapped@protocol=http", "2x4-mapped@protocol=http11")}
    assert kept == {"2x4-gunicorn": True, "2x4-gunicorn@keepalive=off": False, "2x4-granian@keepalive=off": False,
                    "2x4-gunicorn@protocol=uwsgi": False, "2x4-mapped": False, "2x4-mapped@protocol=http": False,
                    "2x4-mapped@protocol=http11": True}


def test_layout_json_records_the_protocol_and_older_files_meant_uwsgi(make_layout):
    layout = make(make_layout, "2x4-mapped@protocol=http")
    data = json.loads(render_texts(layout)["layout.json"])
    assert data["format_version"] == LAYOUT_JSON_VERSION == 2
    assert data["protocol"] == "http" and layout_from_record(data) == layout
    plain = make_layout("2x4-mapped")
    old = {**json.loads(render_texts(plain)["layout.json"]), "format_version": 1, "protocol": "http"}
    assert layout_from_record(old).protocol == "uwsgi"  # format 1 wrote gunicorn's default for every layout
    peer = make_layout("2x4-gunicorn", protocol="uwsgi")
    old_peer = {**json.loads(render_texts(peer)["layout.json"]), "format_version": 1}
    assert layout_from_record(old_peer).protocol == "uwsgi"


def test_a_bundle_ships_the_uwsgi_protocol_only():
    with pytest.raises(LayoutError) as info:
        build_bundle("2x4-mapped", app_dir="/srv/shop", virtualenv="/srv/shop/venv", protocol="http")
    assert info.value.field == "protocol" and "variant to measure" in str(info.value)


# --- uwsgi_bin: another build of uWSGI ------------------------------------------------------------


def test_uwsgi_bin_is_uwsgis_and_absolute(tmp_path):
    with pytest.raises(LayoutError, match="uwsgi_bin: is uWSGI's binary; gunicorn runs gunicorn"):
        parse_variant("2x4-gunicorn@uwsgi_bin=/x/uwsgi", run_dir="/tmp/x")
    # checked() looks at the run directory too: one of our own, so that whatever another user left
    # at a fixed path in /tmp cannot answer first.
    with pytest.raises(LayoutError, match="must be an absolute path"):
        checked(parse_variant("2x4-mapped@uwsgi_bin=x/uwsgi", run_dir=str(tmp_path / "run")))
    with pytest.raises(LayoutError) as info:
        build_bundle("2x4-mapped", app_dir="/srv/shop", virtualenv="/srv/shop/venv", uwsgi_bin="/x/uwsgi")
    assert info.value.field == "uwsgi_bin" and "--uwsgi" in str(info.value)


def test_uwsgi_bin_must_be_ours_to_change_and_link_our_python(tmp_path):
    ours = find_uwsgi()
    where = tmp_path / "build"
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    copy = where / "uwsgi"
    shutil.copy2(ours, copy)
    copy.chmod(0o755)
    layout = checked(parse_variant(f"2x4-mapped@uwsgi_bin={copy}", run_dir=str(tmp_path / "run")))
    assert layout.uwsgi_bin == str(copy.resolve())
    copy.chmod(0o775)  # a group that may write could swap the binary we start
    with pytest.raises(LayoutError, match="writable by group or others"):
        checked(parse_variant(f"2x4-mapped@uwsgi_bin={copy}", run_dir=str(tmp_path / "run")))
    copy.chmod(0o755)
    other = where / "ls"
    shutil.copy2("/bin/ls", other)
    with pytest.raises(LayoutError, match="links no libpython"):
        checked(parse_variant(f"2x4-mapped@uwsgi_bin={other}", run_dir=str(tmp_path / "run")))
    with pytest.raises(LayoutError, match="not an executable file"):
        checked(parse_variant(f"2x4-mapped@uwsgi_bin={where / 'none'}", run_dir=str(tmp_path / "run")))
    if os.geteuid() == 0:  # only root can give a file to another user
        os.chown(copy, 65534, 65534)
        with pytest.raises(LayoutError, match="belongs to another user"):
            checked(parse_variant(f"2x4-mapped@uwsgi_bin={copy}", run_dir=str(tmp_path / "run")))


def _build_dir(tmp_path: Path, name: str) -> Path:
    """A directory laid out as scripts/build-uwsgi.sh lays one out (DIR/bin/uwsgi, DIR/BUILD.json)."""
    where = tmp_path / name
    (where / "bin").mkdir(parents=True)
    for d in (tmp_path, where, where / "bin"):
        d.chmod(0o755)
    return where


def test_a_static_build_says_its_python_in_build_json(tmp_path, monkeypatch):
    """A uWSGI linked against the static libpython names no libpython.so (the stand-in binary
    here, /bin/ls, names none either, and is taken to have routing: pure logic): BUILD.json's
    python decides."""
    monkeypatch.setattr(machine_python, "uwsgi_has_routing", lambda binary: True)
    where = _build_dir(tmp_path, "static")
    binary = where / "bin" / "uwsgi"
    shutil.copy2("/bin/ls", binary)
    spec = f"2x4-mapped@uwsgi_bin={binary}"
    with pytest.raises(LayoutError, match="links no libpython we can read"):
        checked(parse_variant(spec, run_dir=str(tmp_path / "run")))
    (where / "BUILD.json").write_text(json.dumps({"profile": "static", "python": "3.1"}))
    with pytest.raises(LayoutError, match=r"runs Python 3\.1, but our uWSGI runs Python"):
        checked(parse_variant(spec, run_dir=str(tmp_path / "run")))
    major, minor = uwsgi_python()[0]
    (where / "BUILD.json").write_text(json.dumps({"profile": "static", "python": f"{major}.{minor}"}))
    assert checked(parse_variant(spec, run_dir=str(tmp_path / "run"))).uwsgi_bin == str(binary)


def _pyuwsgi_venv(where: Path) -> Path:
    """A stand-in pyuwsgi build: a venv whose site-packages holds a file named as pyuwsgi's extension
    module (pure logic: nothing loads it). Returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = where / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / f"pyuwsgi{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    return site


def test_a_pyuwsgi_launcher_runs_uwsgi_in_the_apps_virtualenvs_python(tmp_path, monkeypatch):
    """pyuwsgi's bin/uwsgi is a script of its own venv: the stack starts pyuwsgi with the app's
    virtualenv's python instead (pyuwsgi_launch.py loads the module from the build's site-packages),
    so the app runs in its own virtualenv (uWSGI's `virtualenv =` is inherent). A script whose venv
    has no pyuwsgi module is refused in one line."""
    monkeypatch.setattr(machine_python, "uwsgi_has_routing", lambda binary: True)
    where = _build_dir(tmp_path, "pyuwsgi")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    launcher = where / "bin" / "uwsgi"
    launcher.write_text(f"#!{where}/bin/python\nimport sys\n")
    launcher.chmod(0o755)
    app_venv = tmp_path / "app-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(app_venv)], check=True)
    spec = f"2x4-mapped@uwsgi_bin={launcher}"
    with pytest.raises(LayoutError, match=r"^uwsgi_bin: .* is a script whose venv holds no pyuwsgi module"):
        checked(parse_variant(spec, run_dir=str(tmp_path / "run"), virtualenv=str(app_venv)))
    site = _pyuwsgi_venv(where)
    layout = checked(parse_variant(spec, run_dir=str(tmp_path / "run"), virtualenv=str(app_venv)))
    assert layout.uwsgi_bin == str(launcher)
    python = str(app_venv / "bin" / "python")
    assert process_for(layout).command(layout) == [python, str(PYUWSGI_LAUNCHER), str(site), "--binary-path", python,
                                                   "--ini", str(tmp_path / "run" / "uwsgi.ini")]
    ours = checked(parse_variant("2x4-mapped", run_dir=str(tmp_path / "run")))  # the app: our venv's demo
    command = process_for(ours).command(ours)
    if machine_python.pyuwsgi_site(Path(find_uwsgi())) is None:  # a uWSGI binary runs as is
        assert command == [find_uwsgi(), "--ini", str(tmp_path / "run" / "uwsgi.ini")]
    else:  # make venv's pyuwsgi, run by our venv's python (the demo app's virtualenv)
        assert command[:2] == [str(Path(sys.prefix) / "bin" / "python"), str(PYUWSGI_LAUNCHER)], command


def test_a_uwsgi_bin_without_pcre_or_ssl_is_bad_input_saying_how_to_get_one(tmp_path):
    """The layout's own build is checked (not ours) before anything is written or started: one
    line naming what is missing and how to get it (LayoutError: exit 2). The stand-in launcher
    prints a --help (pure logic)."""
    where = _build_dir(tmp_path, "pyuwsgi")
    _pyuwsgi_venv(where)
    launcher = where / "bin" / "uwsgi"
    launcher.write_text(f"#!{where}/bin/python\nprint('    --socket    bind to the specified UNIX/TCP socket')\n")
    launcher.chmod(0o755)
    spec = f"2x4-mapped@uwsgi_bin={launcher}"
    hint = r"--no-binary pyuwsgi pyuwsgi\) or build one: scripts/build-uwsgi.sh pyuwsgi$"
    with pytest.raises(LayoutError, match=r"^uwsgi_bin: .* was built without PCRE .* libpcre2-dev .* " + hint):
        checked(parse_variant(spec, run_dir=str(tmp_path / "out"), virtualenv=str(where)))
    # The same path rewritten (a rebuild): asked again, not answered from what the old file said.
    launcher.write_text(f"#!{where}/bin/python\nprint('    --route-if-not    add a route when not condition')\n")
    assert check_uwsgi_bin(str(launcher)) == str(launcher)  # no TLS: SSL not needed
    with pytest.raises(LayoutError, match=r"^uwsgi_bin: .* was built without SSL .* libssl-dev .* " + hint):
        check_uwsgi_bin(str(launcher), tls=True)


def test_a_uwsgi_build_is_asked_its_options_once_per_process_until_it_is_replaced(tmp_path):
    """render's checks, a layout's uwsgi_bin and the bundle's each ask whether a build has routing
    and SSL: one ``--help`` answers them all while the file stays the same; a build put in its place
    (a new file at the same path) is asked again. The stand-in counts how often it runs."""
    runs, binary = tmp_path / "runs", tmp_path / "uwsgi"
    build = "#!/bin/sh\necho ran >> {runs}\necho '    --route-if-not    add a route'\n{ssl}"
    binary.write_text(build.format(runs=runs, ssl=""))
    binary.chmod(0o755)
    for _ in range(3):
        assert uwsgi_has_routing(str(binary)) and not uwsgi_has_ssl(str(binary))
    assert runs.read_text().splitlines() == ["ran"]
    replacement = tmp_path / "uwsgi.new"
    replacement.write_text(build.format(runs=runs, ssl="echo '    --ssl-socket    bind with SSL'\n"))
    replacement.chmod(0o755)
    replacement.replace(binary)
    assert uwsgi_has_ssl(str(binary)) and uwsgi_has_routing(str(binary))
    assert runs.read_text().splitlines() == ["ran", "ran"]
