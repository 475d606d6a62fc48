"""Rendering: the generated nginx.conf and uwsgi.ini, parsed back independently of deploy.render.

nginx.conf is parsed with crossplane, uwsgi.ini with a small parser here; both are compared
with the layout. ``nginx -t`` is run (it starts no server).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import crossplane
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from uwsgi_layouts.deploy.machine import checked
from uwsgi_layouts.deploy.model import STRATEGIES, LayoutError, RenderError, parse_layout
from uwsgi_layouts.deploy.render import (
    TEMPLATES_DIR,
    crosscheck,
    nginx_test,
    parse_uwsgi_ini,
    render_texts,
    write_layout,
)
from uwsgi_layouts.deploy.render import write as render

# This file checks uWSGI's files; the peers' (gunicorn.conf.py, granian.env) are in tests/test_peers_render.py.
UWSGI_STRATEGIES = sorted(name for name, s in STRATEGIES.items() if s.server == "uwsgi")
SHAPES = ["1x1", "1x4", "2x4", "3x4", "4x4", "8x2"]
FILES = {"nginx.conf", "mime.types", "uwsgi.ini", "uwsgi_params", "layout.json"}
SUBDIRS = {"logs", "tmp", "sockets", "control"}


# --- independent parsers --------------------------------------------------------------------


def ini_pairs(text: str) -> list[tuple[str, str]]:
    """(key, value) of the [uwsgi] section; asserts it is the only section."""
    pairs, sections, section = [], [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("["):
            assert line.endswith("]"), raw
            section = line[1:-1]
            sections.append(section)
            continue
        assert section is not None, f"option before any section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not key = value: {raw!r}"
        pairs.append((key.strip(), value.strip()))
    assert sections == ["uwsgi"], sections
    return pairs


def ini_values(pairs, key) -> list[str]:
    return [v for k, v in pairs if k == key]


def ini_single(pairs, key) -> str:
    vals = ini_values(pairs, key)
    assert len(vals) == 1, f"{key}: {vals}"
    return vals[0]


def nginx_parsed(conf: Path) -> list[dict]:
    payload = crossplane.parse(str(conf), catch_errors=False, combine=False)
    assert payload["status"] == "ok", payload["errors"]
    main = [c for c in payload["config"] if c["file"] == str(conf)]
    assert len(main) == 1
    return main[0]["parsed"]


def walk(block, parents=()):
    """Yield (parents, directive) for every directive, depth first."""
    for d in block:
        yield parents, d
        yield from walk(d.get("block", []), parents + (d["directive"],))


def directives(block, name):
    return [(p, d) for p, d in walk(block) if d["directive"] == name]


def nginx_facts(conf: Path) -> dict:
    parsed = nginx_parsed(conf)
    ups = directives(parsed, "upstream")
    assert len(ups) == 1, f"expected exactly one upstream, got {len(ups)}"
    up_parents, up = ups[0]
    assert up_parents == ("http",)
    body = up["block"]
    return {
        "parsed": parsed,
        "upstream_name": up["args"][0],
        "upstream_body": [d["directive"] for d in body],
        "servers": [d["args"] for d in body if d["directive"] == "server"],
        "zone": [d["args"] for d in body if d["directive"] == "zone"],
        "listens": [(p, d["args"]) for p, d in directives(parsed, "listen")],
        "passes": [(p, d["args"]) for p, d in directives(parsed, "uwsgi_pass")],
        "worker_processes": [d["args"] for p, d in directives(parsed, "worker_processes")],
    }


# --- helpers ----------------------------------------------------------------------------------


def render_into(layout):
    result = write_layout(layout, layout.run_dir)
    return Path(result.out_dir), result


def expected(layout) -> dict:
    """What each strategy must render, stated from the README table (not from the code).
    ``servers`` lists (socket index, server parameters) in upstream order."""
    p, t, nw = layout.processes, layout.threads, layout.nginx_workers
    out = _expected(layout, p, t, nw)
    # uWSGI's master keeps sockets open: no server is ever marked down (max_fails=0).
    out["servers"] = [(i, ["max_fails=0", *params]) for i, params in out["servers"]]
    return out


def _expected(layout, p, t, nw) -> dict:
    # nginx never retries a lone server: a single socket is listed again as backup (retry alias).
    alias = [(0, ["backup"])] if layout.retries else []
    if layout.strategy in ("shared", "thunder"):
        return dict(n=1, maps=[], servers=[(0, [])] + alias, least_conn=False, zone=nw > 1)
    if layout.strategy == "mapped":
        return dict(n=p, maps=[f"{i}:{i + 1}" for i in range(p)],
                    servers=[(i, []) for i in range(p)] + (alias if p == 1 else []), least_conn=True, zone=nw > 1)
    if layout.strategy == "overflow":
        return dict(n=p + 1, maps=[f"{i}:{i + 1}" for i in range(p)],
                    servers=[(i, [f"max_conns={t}"]) for i in range(p)] + [(p, ["backup"])], least_conn=True,
                    zone=True)
    raise AssertionError(f"strategy {layout.strategy!r} has no expectations in tests/test_render.py: add them")


def expected_socket_addresses(layout) -> list[str]:
    n = expected(layout)["n"]
    if layout.transport == "unix":
        return [f"{layout.run_dir}/sockets/uwsgi-{i}.sock" for i in range(n)]
    return [f"127.0.0.1:{layout.base_port + i}" for i in range(n)]


def no_staging_left(out: Path) -> bool:
    return not list(out.parent.glob(f".{out.name}.staging-*"))


# --- the matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("strategy", UWSGI_STRATEGIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rendered_files_match_layout(make_layout, shape, strategy, transport):
    p, t = map(int, shape.split("x"))
    nginx_workers = 2 if p % 2 == 0 else 1  # both sides of the `zone` rule across the matrix
    layout = make_layout(f"{shape}-{strategy}", transport=transport, nginx_workers=nginx_workers, backlog=64)
    out, result = render_into(layout)

    # files and directories, nothing else (nginx -t leftovers are cleaned up), no staging left
    assert {e.name for e in out.iterdir()} == FILES | SUBDIRS
    assert all((out / s).is_dir() and not any((out / s).iterdir()) for s in SUBDIRS)
    assert sorted(result.files) == sorted(FILES)
    assert "syntax is ok" in result.nginx_test
    assert no_staging_left(out)

    nginx_text = (out / "nginx.conf").read_text()
    ini_text = (out / "uwsgi.ini").read_text()
    for text, leader in ((nginx_text, "#"), (ini_text, ";")):
        first = text.splitlines()[0]
        assert first.startswith(f"{leader} Generated from layout {layout.name} "), first
        assert "do not edit" in first

    # --- uwsgi.ini
    pairs = ini_pairs(ini_text)
    assert ini_single(pairs, "processes") == str(p)
    assert ini_single(pairs, "threads") == str(t)
    for flag in ("strict", "need-app", "master", "die-on-term"):
        assert ini_single(pairs, flag) == "true", flag
    assert ini_single(pairs, "listen") == "64"
    assert ini_single(pairs, "module") == "app.wsgi:application"
    assert ini_single(pairs, "stats") == layout.stats_address == f"{layout.run_dir}/control/stats.sock"
    want = expected(layout)
    sockets = ini_values(pairs, "socket")
    assert sockets == expected_socket_addresses(layout)
    assert len(sockets) == want["n"]
    assert ini_values(pairs, "map-socket") == want["maps"]
    assert ini_values(pairs, "thunder-lock") == (["true"] if strategy == "thunder" else [])
    assert ini_values(pairs, "chmod-socket") == ["660"]  # the app's unix sockets, or the stats socket alone
    assert not ini_values(pairs, "workers"), "processes is the one worker count"

    # --- nginx.conf
    facts = nginx_facts(out / "nginx.conf")
    name = facts["upstream_name"]
    expected_servers = [f"unix:{s}" if transport == "unix" else s for s in sockets]
    assert facts["servers"] == [[expected_servers[i], *params] for i, params in want["servers"]]
    assert ("least_conn" in facts["upstream_body"]) == want["least_conn"]
    assert facts["upstream_body"].count("least_conn") <= 1
    if want["zone"]:
        assert len(facts["zone"]) == 1 and facts["zone"][0][0] == name
    else:
        assert facts["zone"] == []
    assert facts["worker_processes"] == [[str(nginx_workers)]]
    assert facts["passes"] == [(("http", "server", "location"), [name])]
    assert facts["listens"] == [(("http", "server"), [layout.listen])]
    includes = [d["args"] for p_, d in directives(facts["parsed"], "include") if p_[-1:] == ("location",)]
    assert includes == [["uwsgi_params"]]

    # --- layout.json agrees
    data = json.loads((out / "layout.json").read_text())
    assert data["name"] == layout.name
    assert [s["address"] for s in data["sockets"]] == sockets
    assert [u["address"] for u in data["upstream"]] == [expected_servers[i] for i, _ in want["servers"]]

    # --- the checks of deploy.render agree
    assert crosscheck(layout, out) == []
    ok, output = nginx_test(out)
    assert ok, output
    shutil.rmtree(out / "tmp", ignore_errors=True)  # nginx -t created temp dirs; harmless


def test_done_when_3x4_mapped(make_layout):
    layout = make_layout("3x4-mapped", transport="tcp")
    out, _ = render_into(layout)
    pairs = ini_pairs((out / "uwsgi.ini").read_text())
    b = layout.base_port
    assert ini_values(pairs, "socket") == [f"127.0.0.1:{b}", f"127.0.0.1:{b + 1}", f"127.0.0.1:{b + 2}"]
    assert ini_values(pairs, "map-socket") == ["0:1", "1:2", "2:3"]
    facts = nginx_facts(out / "nginx.conf")
    assert "least_conn" in facts["upstream_body"]
    assert facts["servers"] == [[f"127.0.0.1:{b + i}", "max_fails=0"] for i in range(3)]
    ok, output = nginx_test(out)
    assert ok and "test is successful" in output, output


def test_nginx_knows_the_mime_types_nginx_ships(make_layout):
    """Files nginx serves itself carry their type: nginx.conf includes the copy of nginx's
    conf/mime.types written next to it (a stylesheet as application/octet-stream is refused by
    browsers). Parsed back with crossplane, includes resolved, as nginx reads them."""
    layout = make_layout("1x2-shared")
    out, _ = render_into(layout)
    assert (out / "mime.types").read_bytes() == (TEMPLATES_DIR / "mime.types").read_bytes()
    payload = crossplane.parse(str(out / "nginx.conf"), combine=True)
    assert payload["status"] == "ok", payload["errors"]
    http = next(d for d in payload["config"][0]["parsed"] if d["directive"] == "http")
    types = [d for d in http["block"] if d["directive"] == "types"]
    assert len(types) == 1
    by_extension = {ext: d["directive"] for d in types[0]["block"] for ext in d["args"]}
    assert by_extension["css"] == "text/css"
    assert by_extension["js"] == "application/javascript"
    assert by_extension["svg"] == "image/svg+xml"
    assert by_extension["woff2"] == "font/woff2"
    assert by_extension["bin"] == "application/octet-stream"  # the data set's files keep the app's type
    assert [d["args"] for d in http["block"] if d["directive"] == "default_type"] == [["application/octet-stream"]]


def test_header_names_the_layout_on_every_generated_file(make_layout):
    layout = make_layout("2x4-thunder")
    texts = render_texts(layout)
    line = "Generated from layout 2x4-thunder by `uwsgi-layouts render`: do not edit."
    assert texts["nginx.conf"].startswith(f"# {line}\n")
    assert texts["uwsgi.ini"].startswith(f"; {line}\n")


def test_render_texts_is_pure(make_layout, tmp_run_dir):
    target = tmp_run_dir / "not-yet"
    layout = make_layout("2x2-mapped", run_dir=str(target))
    texts = render_texts(layout)
    assert set(texts) == FILES
    assert not target.exists()
    assert json.loads(texts["layout.json"])["format_version"] == 2


def test_root_drops_privileges_in_both_files(make_layout):
    layout = make_layout("1x1-shared")
    texts = render_texts(layout)
    user_lines = [line for line in texts["nginx.conf"].splitlines() if line.startswith("user ")]
    pairs = ini_pairs(texts["uwsgi.ini"])
    if os.geteuid() == 0:
        assert layout.user not in ("", "root") and layout.drops_privileges
        assert user_lines == [f"user {layout.user} {layout.group};"]
        # uWSGI is started as that user (deploy.run): a master that switched itself would lose its
        # parent-death signal, so the lab's uwsgi.ini names no uid/gid.
        assert "uid" not in dict(pairs) and "gid" not in dict(pairs) and "master-as-root" not in dict(pairs)
    else:
        assert not layout.drops_privileges and user_lines == []
        assert "uid" not in dict(pairs) and "gid" not in dict(pairs)


def test_app_options_are_rendered(make_layout, tmp_path):
    (tmp_path / "myapp.py").write_text("def app(environ, start_response):\n    return []\n")
    layout = make_layout("1x2-shared", app="myapp:app", app_dir=str(tmp_path))
    pairs = ini_pairs(render_texts(layout)["uwsgi.ini"])
    assert ini_single(pairs, "module") == "myapp:app"
    assert ini_single(pairs, "chdir") == str(tmp_path.resolve())
    assert ini_single(pairs, "pythonpath") == str(tmp_path.resolve())


def test_parse_uwsgi_ini_keeps_order_and_repeats():
    text = "; c\n[other]\nsocket = x\n[uwsgi]\n# c\nsocket = a\nsocket = b\nmap-socket = 0:1\n\nx=1=2\n"
    assert parse_uwsgi_ini(text) == [("socket", "a"), ("socket", "b"), ("map-socket", "0:1"), ("x", "1=2")]


# --- nginx -t ------------------------------------------------------------------------------


def test_nginx_test_rejects_a_broken_conf(make_layout):
    layout = make_layout("2x4-mapped")
    out, _ = render_into(layout)
    conf = out / "nginx.conf"
    conf.write_text(conf.read_text().replace("worker_connections 768;", "worker_connections lots;"))
    ok, output = nginx_test(out)
    assert not ok
    assert '"lots"' in output and "test failed" in output


def test_write_layout_leaves_destination_untouched_when_nginx_rejects(make_layout, monkeypatch):
    layout = make_layout("2x4-mapped")
    out = Path(layout.run_dir)
    render_into(layout)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    real = render.render_texts

    def broken(lay):
        texts = real(lay)
        # crossplane and the cross-checks accept this; only nginx -t knows the value is bad
        texts["nginx.conf"] = texts["nginx.conf"].replace("worker_connections 768;", "worker_connections lots;")
        texts["uwsgi.ini"] += "; changed\n"
        return texts

    monkeypatch.setattr(render, "render_texts", broken)
    with pytest.raises(RenderError) as info:
        write_layout(layout, out)
    assert "nginx -t" in str(info.value)
    assert '"lots"' in info.value.details
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert no_staging_left(out)


def test_write_layout_into_new_dir_creates_nothing_on_failure(make_layout, tmp_run_dir, monkeypatch):
    out = tmp_run_dir / "fresh"
    layout = make_layout("2x4-mapped", run_dir=str(out))
    real = render.render_texts
    monkeypatch.setattr(render, "render_texts",
                        lambda lay: {**real(lay), "uwsgi.ini": real(lay)["uwsgi.ini"].replace("map-socket = 1:2", "")})
    with pytest.raises(RenderError) as info:
        write_layout(layout, out)
    assert "cross-check" in str(info.value)
    assert not out.exists()
    assert list(tmp_run_dir.iterdir()) == []


def test_write_layout_refuses_other_dir(make_layout, tmp_run_dir):
    layout = make_layout("1x1-shared")
    with pytest.raises(RenderError):
        write_layout(layout, tmp_run_dir / "elsewhere")
    assert not (tmp_run_dir / "elsewhere").exists()


def test_write_layout_under_a_regular_file(make_layout, tmp_run_dir):
    blocker = tmp_run_dir / "file"
    blocker.write_text("x")
    out = blocker / "sub"
    layout = make_layout("1x1-shared", run_dir=str(out))
    with pytest.raises(LayoutError) as info:
        write_layout(layout, out)
    assert info.value.field == "out"
    assert blocker.read_text() == "x"
    assert sorted(p.name for p in tmp_run_dir.iterdir()) == ["file"]


def test_rerender_replaces_files_and_keeps_run_state(make_layout, tmp_run_dir):
    layout = make_layout("2x4-mapped", run_dir=str(tmp_run_dir))
    render_into(layout)
    (tmp_run_dir / "logs" / "uwsgi.log").write_text("old log\n")
    bigger = make_layout("3x4-mapped", run_dir=str(tmp_run_dir))
    write_layout(bigger, tmp_run_dir)
    pairs = ini_pairs((tmp_run_dir / "uwsgi.ini").read_text())
    assert ini_values(pairs, "map-socket") == ["0:1", "1:2", "2:3"]
    assert len(nginx_facts(tmp_run_dir / "nginx.conf")["servers"]) == 3
    assert (tmp_run_dir / "logs" / "uwsgi.log").read_text() == "old log\n"


# --- crosscheck catches tampering ---------------------------------------------------------------

TAMPER = [
    # (id, spec, options, file, old, new, words expected in one of the problems)
    ("drop-socket", "3x4-mapped", {}, "uwsgi.ini", "socket = {sock2}\n", "", "upstream"),
    ("remap-socket", "3x4-mapped", {}, "uwsgi.ini", "map-socket = 1:2", "map-socket = 1:1", "worker"),
    ("swap-mapping", "2x4-mapped", {}, "uwsgi.ini", "map-socket = 0:1\nmap-socket = 1:2",
     "map-socket = 0:2\nmap-socket = 1:1", "mapping"),
    ("map-to-two-workers", "2x4-mapped", {}, "uwsgi.ini", "map-socket = 1:2", "map-socket = 1:1,2", "worker"),
    ("drop-map", "3x4-mapped", {}, "uwsgi.ini", "map-socket = 2:3\n", "", "mapping"),
    ("map-missing-socket", "2x4-mapped", {}, "uwsgi.ini", "map-socket = 1:2", "map-socket = 5:2", "index"),
    ("map-garbage", "2x4-mapped", {}, "uwsgi.ini", "map-socket = 1:2", "map-socket = one:two", "INDEX"),
    ("map-on-shared", "2x4-shared", {}, "uwsgi.ini", "stats =", "map-socket = 0:1\nstats =", "mapping"),
    ("processes", "2x4-mapped", {}, "uwsgi.ini", "processes = 2", "processes = 3", "processes"),
    ("threads", "2x4-mapped", {}, "uwsgi.ini", "threads = 4", "threads = 8", "threads"),
    ("extra-socket", "1x4-shared", {}, "uwsgi.ini", "socket = {sock0}", "socket = {sock0}\nsocket = 127.0.0.1:1",
     "upstream"),
    ("stats-public", "2x4-mapped", {"stats_port": 9191, "allow": "tcp-stats"}, "uwsgi.ini", "stats = 127.0.0.1:",
     "stats = 0.0.0.0:", "loopback"),
    # The stats JSON holds every request in flight's variables: its socket must stay the stack's own.
    ("stats-chmod-666", "2x4-mapped", {}, "uwsgi.ini", "chmod-socket = 660", "chmod-socket = 666", "stats server"),
    ("stats-chmod-dropped", "2x4-mapped", {}, "uwsgi.ini", "chmod-socket = 660\n", "", "stats server"),
    ("stats-on-tcp", "2x4-mapped", {}, "uwsgi.ini", "stats = {stats}", "stats = 127.0.0.1:9191", "tcp-stats"),
    ("socket-public", "1x4-shared", {}, "uwsgi.ini", "socket = 127.0.0.1:", "socket = 0.0.0.0:", None),
    ("chmod-666", "2x4-mapped", {"transport": "unix"}, "uwsgi.ini", "chmod-socket = 660", "chmod-socket = 666",
     "chmod-socket"),
    ("chmod-bare", "2x4-mapped", {"transport": "unix"}, "uwsgi.ini", "chmod-socket = 660", "chmod-socket = true",
     "chmod-socket"),
    ("chmod-dropped", "2x4-mapped", {"transport": "unix"}, "uwsgi.ini", "chmod-socket = 660\n", "", "chmod-socket"),
    ("server-port", "2x4-mapped", {}, "nginx.conf", "server {sock1} max_fails=0;", "server 127.0.0.1:1 max_fails=0;",
     "upstream"),
    ("server-dropped", "3x4-mapped", {}, "nginx.conf", "server {sock1} max_fails=0;", "", "upstream"),
    ("server-twice", "2x4-mapped", {}, "nginx.conf", "server {sock1} max_fails=0;",
     "server {sock1} max_fails=0; server {sock1} max_fails=0;",
     "upstream"),
    ("unix-server", "2x4-mapped", {"transport": "unix"}, "nginx.conf", "server unix:{sock0} max_fails=0;",
     "server unix:/tmp/elsewhere.sock max_fails=0;", "upstream"),
    ("pass-elsewhere", "2x4-mapped", {}, "nginx.conf", "uwsgi_pass uwsgi_app;", "uwsgi_pass 127.0.0.1:1;",
     "uwsgi_pass"),
    ("upstream-renamed", "2x4-mapped", {}, "nginx.conf", "upstream uwsgi_app {{", "upstream other {{", "upstream"),
    ("listen-on-socket", "2x4-mapped", {}, "nginx.conf", "listen {listen};", "listen {sock0};", "twice"),
    ("no-zone", "2x4-mapped", {"nginx_workers": 2}, "nginx.conf", "zone uwsgi_app 64k;", "", "zone"),
    ("more-nginx-workers", "2x4-mapped", {}, "nginx.conf", "worker_processes 1;", "worker_processes 4;", "zone"),
    ("no-least-conn", "2x4-mapped", {}, "nginx.conf", "least_conn;", "", "balancing"),
    ("least-conn-on-shared", "2x4-shared", {}, "nginx.conf", "upstream uwsgi_app {{",
     "upstream uwsgi_app {{ least_conn;", "balancing"),
    ("ip-hash", "2x4-mapped", {}, "nginx.conf", "least_conn;", "ip_hash;", "balancing"),
    ("no-max-conns", "2x4-overflow", {}, "nginx.conf", "server {sock0} max_fails=0 max_conns=4;",
     "server {sock0} max_fails=0;", "parameters"),
    ("no-backup", "2x4-overflow", {}, "nginx.conf", "server {sock2} max_fails=0 backup;",
     "server {sock2} max_fails=0;", "parameters"),
    ("overflow-no-zone", "2x4-overflow", {}, "nginx.conf", "zone uwsgi_app 64k;", "", "zone"),
    ("marked-down", "2x4-mapped", {}, "nginx.conf", "server {sock1} max_fails=0;", "server {sock1};", "parameters"),
    # --static: the classic alias traversal (location without "/", alias with), a listing, another dir
    ("alias-traversal", "2x4-mapped", {"static": ["/assets=/usr/share"]}, "nginx.conf", "location ^~ /assets/ {{",
     "location ^~ /assets {{", "ends in '/'"),
    ("autoindex", "2x4-mapped", {"static": ["/assets=/usr/share"]}, "nginx.conf", "autoindex off;", "autoindex on;",
     "autoindex"),
    ("static-elsewhere", "2x4-mapped", {"static": ["/assets=/usr/share"]}, "nginx.conf", "alias /usr/share/;",
     "alias /var/;", "static locations"),
    # --env: the value changed, or a "%" left unescaped (uWSGI would eat it as a magic variable)
    ("env-changed", "2x4-mapped", {"env": ["A=1"]}, "uwsgi.ini", "env = A=1", "env = A=2", "env lines"),
    ("env-percent", "2x4-mapped", {"env": ["A=5%"]}, "uwsgi.ini", "env = A=5%%", "env = A=5%", "env lines"),
    # peers (gunicorn.conf.py, granian.env, their nginx locations) and the uWSGI lock engine
    ("gunicorn-bind", "2x4-gunicorn", {}, "gunicorn.conf.py", "bind = ['{sock0}']", "bind = ['127.0.0.1:1']",
     "sockets"),
    ("gunicorn-public", "2x4-gunicorn", {}, "gunicorn.conf.py", "bind = ['127.0.0.1:", "bind = ['0.0.0.0:", None),
    ("gunicorn-workers", "2x4-gunicorn", {}, "gunicorn.conf.py", "workers = 2", "workers = 3", "processes"),
    ("gunicorn-sync-for-threads", "2x4-gunicorn", {}, "gunicorn.conf.py", 'worker_class = "gthread"',
     'worker_class = "sync"', "worker_class"),
    ("gunicorn-umask", "2x4-gunicorn", {"transport": "unix"}, "gunicorn.conf.py", "umask = 0o117", "umask = 0o002",
     "umask"),
    ("gunicorn-no-umask", "2x4-gunicorn", {"transport": "unix"}, "gunicorn.conf.py", "umask = 0o117\n", "", "umask"),
    ("gunicorn-reuse-port-dropped", "2x4-gunicorn", {"reuse_port": "on"}, "gunicorn.conf.py", "reuse_port = True\n", "",
     "reuse_port"),
    ("gunicorn-protocol-dropped", "2x4-gunicorn", {"protocol": "uwsgi"}, "gunicorn.conf.py", 'protocol = "uwsgi"\n', "",
     "protocol"),
    ("gunicorn-env", "2x4-gunicorn", {"env": ["A=1"]}, "gunicorn.conf.py", "'A=1'", "'A=2'", "env"),
    ("gunicorn-no-ready-hook", "2x4-gunicorn", {}, "gunicorn.conf.py", "def post_worker_init(worker):",
     "def other(worker):", "post_worker_init"),
    ("granian-port", "2x4-granian", {}, "granian.env", "GRANIAN_PORT={port}", "GRANIAN_PORT=1", "sockets"),
    ("granian-public", "2x4-granian", {}, "granian.env", "GRANIAN_HOST=127.0.0.1", "GRANIAN_HOST=0.0.0.0",
     "loopback"),
    ("granian-threads", "2x4-granian", {}, "granian.env", "GRANIAN_BLOCKING_THREADS=4",
     "GRANIAN_BLOCKING_THREADS=8", "threads"),
    ("granian-backpressure", "2x4-granian", {}, "granian.env", "GRANIAN_BACKPRESSURE=768",
     "GRANIAN_BACKPRESSURE=8", "backpressure"),
    ("granian-decimal-mode", "2x4-granian", {"transport": "unix"}, "granian.env", "GRANIAN_UDS_PERMISSIONS=0660",
     "GRANIAN_UDS_PERMISSIONS=660", "GRANIAN_UDS_PERMISSIONS"),
    ("granian-asgi", "2x4-granian", {}, "granian.env", "GRANIAN_INTERFACE=wsgi", "GRANIAN_INTERFACE=asgi",
     "interface"),
    ("granian-env", "2x4-granian", {"env": ["A=1"]}, "granian.env", "\nA=1\n", "\nA=2\n", "env"),
    ("no-keepalive", "2x4-gunicorn", {}, "nginx.conf", "keepalive 16;", "", "keepalive"),
    ("http-1.0", "2x4-granian", {}, "nginx.conf", "proxy_http_version 1.1;", "", "proxy_http_version"),
    ("connection-close", "2x4-granian", {}, "nginx.conf", 'proxy_set_header Connection "";', "", "Connection"),
    ("proxy-elsewhere", "2x4-gunicorn", {}, "nginx.conf", "proxy_pass http://gunicorn_app;",
     "proxy_pass http://127.0.0.1:1;", "proxy_pass"),
    ("uwsgi-to-http-gunicorn", "2x4-gunicorn", {}, "nginx.conf", "proxy_pass http://gunicorn_app;",
     "uwsgi_pass gunicorn_app;", "uwsgi_pass"),
    ("http-to-uwsgi-gunicorn", "2x4-gunicorn", {"protocol": "uwsgi"}, "nginx.conf", "uwsgi_pass gunicorn_app;",
     "proxy_pass http://gunicorn_app;", "proxy_pass"),
    ("route-file-dropped", "2x4-mapped", {}, "uwsgi.ini",
     "route-if-not = empty:${{UWSGI_FILE}}${{UWSGI_SCRIPT}}${{UWSGI_MODULE}}${{UWSGI_CALLABLE}} break:403 Forbidden\n",
     "", "route-if-not"),
    ("route-appid-dropped", "2x4-shared", {"transport": "unix"}, "uwsgi.ini",
     "route-if-not = empty:${{UWSGI_APPID}}${{UWSGI_PYHOME}}${{UWSGI_HOME}}${{UWSGI_CHDIR}} break:403 Forbidden\n",
     "", "route-if-not"),
    ("route-weakened", "2x4-mapped", {}, "uwsgi.ini", "${{UWSGI_FILE}}${{UWSGI_SCRIPT}}", "${{UWSGI_SCRIPT}}",
     "route-if-not"),
    ("route-before-ours", "2x4-mapped", {}, "uwsgi.ini", "route-if-not = empty:${{UWSGI_FILE}}",
     "route = .* continue:\nroute-if-not = empty:${{UWSGI_FILE}}", "routing rules before"),
    ("strict-dropped", "2x4-mapped", {}, "uwsgi.ini", "strict = true\n", "", "strict"),
    ("lock-engine-dropped", "2x4-thunder", {"lock_engine": "ipcsem"}, "uwsgi.ini", "lock-engine = ipcsem\n", "",
     "lock-engine"),
    # @keepalive=off and uWSGI's HTTP sockets: nginx keeps connections only where the layout says so
    ("keepalive-back-on-peer", "2x4-gunicorn", {"keepalive": "off"}, "nginx.conf", "    }}\n\n    server {{",
     "    keepalive 16;\n    }}\n\n    server {{", "keepalive off"),
    ("keepalive-on-http-socket", "2x4-mapped", {"protocol": "http"}, "nginx.conf", "    }}\n\n    server {{",
     "    keepalive 16;\n    }}\n\n    server {{", "http-socket closes"),
    ("http-socket-left-uwsgi", "2x4-mapped", {"protocol": "http"}, "uwsgi.ini", "http-socket = {sock1}",
     "socket = {sock1}", "nginx speaks http"),
    ("uwsgi-socket-made-http", "2x4-mapped", {}, "uwsgi.ini", "socket = {sock0}", "http-socket = {sock0}",
     "nginx speaks uwsgi"),
    ("http11-made-http", "2x4-mapped", {"protocol": "http11"}, "uwsgi.ini", "http11-socket = {sock0}",
     "http-socket = {sock0}", "http11"),
    ("http11-no-max-conns", "2x4-mapped", {"protocol": "http11"}, "nginx.conf",
     "server {sock0} max_fails=0 max_conns=4;", "server {sock0} max_fails=0;", "parameters"),
    ("http11-no-keepalive", "1x4-shared", {"protocol": "http11"}, "nginx.conf", "keepalive 16;", "", "keepalive"),
    ("http-socket-to-uwsgi-pass", "2x4-mapped", {"protocol": "http"}, "nginx.conf", "proxy_pass http://uwsgi_app;",
     "uwsgi_pass uwsgi_app;", "uwsgi_pass"),
]


@pytest.mark.parametrize("case", TAMPER, ids=[c[0] for c in TAMPER])
def test_crosscheck_catches_tampering(make_layout, case):
    _, spec, opts, filename, old, new, words = case
    layout = make_layout(spec, **{"transport": "tcp", **opts})  # the cases name TCP addresses unless they say unix
    out, _ = render_into(layout)
    assert crosscheck(layout, out) == []
    subst = {f"sock{s.index}": s.address for s in layout.sockets} | {"listen": layout.listen, "port": layout.base_port,
                                                                     "stats": layout.stats_address}
    old, new = old.format(**subst), new.format(**subst)
    path = out / filename
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {filename}:\n{text}"
    path.write_text(text.replace(old, new))
    problems = crosscheck(layout, out)
    assert problems, f"tampering {old!r} -> {new!r} went unnoticed"
    if words:
        assert any(words in p for p in problems), problems


# --- property: any valid layout renders consistent files --------------------------------------


@st.composite
def layout_args(draw):
    p = draw(st.integers(1, 64))
    t = draw(st.integers(1, 16))
    strategy = draw(st.sampled_from(UWSGI_STRATEGIES))
    transport = draw(st.sampled_from(["tcp", "unix"]))
    if draw(st.integers(0, 3)):  # mostly valid: ports clear of each other
        n = len(STRATEGIES[strategy].sockets(p, t))
        base = draw(st.integers(1024, 65536 - n))
        listen = draw(st.integers(1, 1023))
        stats = draw(st.integers(1, 1023).filter(lambda x: x != listen))
    else:  # anything, biased towards collisions and the top of the port range
        base = draw(st.one_of(st.integers(1024, 65535), st.integers(65400, 65535)))
        near = st.integers(max(1, base - 2), min(65535, base + 70))
        listen = draw(st.one_of(st.integers(1, 65535), near))
        stats = draw(st.one_of(st.just(0), st.integers(1, 65535), near, st.just(listen)))  # 0: the unix socket
    nginx_workers = draw(st.integers(1, 4))
    return p, t, strategy, transport, base, listen, stats, nginx_workers


def expected_error_fields(p, strategy, transport, base, listen, stats) -> set[str]:
    """Every field the layout may be refused for: the first check that fails names one of them
    (listen == stats == base breaks two rules; either is a true answer)."""
    n = len(STRATEGIES[strategy].sockets(p, 1))
    fields = set()
    if transport == "tcp" and (base + n - 1 > 65535 or base <= listen < base + n or base <= stats < base + n):
        fields.add("base_port")
    if listen == stats:
        fields.add("stats_port")
    return fields


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=layout_args())
def test_property_render_is_consistent(args):
    p, t, strategy, transport, base, listen, stats, nginx_workers = args
    run_dir = tempfile.mkdtemp(prefix="ul-", dir="/tmp")
    os.chmod(run_dir, 0o711)  # an existing run dir keeps its mode: the run user must be able to enter it
    try:
        opts = dict(transport=transport, base_port=base, listen=f"127.0.0.1:{listen}", stats_port=stats,
                    nginx_workers=nginx_workers, run_dir=run_dir, allow="tcp-stats" if stats else "")
        want_errors = expected_error_fields(p, strategy, transport, base, listen, stats)
        event(f"rejected: {'/'.join(sorted(want_errors))}" if want_errors else f"rendered {strategy}/{transport}")
        if want_errors:
            with pytest.raises(LayoutError) as info:
                checked(parse_layout(f"{p}x{t}-{strategy}", **opts))
            assert info.value.field in want_errors
            return
        layout = checked(parse_layout(f"{p}x{t}-{strategy}", **opts))
        write_layout(layout, run_dir, check_nginx=False)
        out = Path(run_dir)
        assert crosscheck(layout, out) == []

        pairs = ini_pairs((out / "uwsgi.ini").read_text())
        sockets = ini_values(pairs, "socket")
        assert sockets == expected_socket_addresses(layout)
        stats_addr = ini_single(pairs, "stats")
        maps = ini_values(pairs, "map-socket")
        want = expected(layout)
        assert maps == want["maps"]
        pairs_sw = [tuple(map(int, m.split(":"))) for m in maps]
        if layout.strategy_obj.one_socket_per_worker:
            assert len(sockets) == p
            assert sorted(s for s, _ in pairs_sw) == list(range(p))  # every socket mapped once
            assert sorted(w for _, w in pairs_sw) == list(range(1, p + 1))  # every worker once
        assert all(w == s + 1 for s, w in pairs_sw)
        assert all(0 <= s < len(sockets) for s, _ in pairs_sw)

        facts = nginx_facts(out / "nginx.conf")
        upstream = [args_[0].removeprefix("unix:") for args_ in facts["servers"]]
        assert upstream == [sockets[i] for i, _ in want["servers"]]
        assert set(upstream) == set(sockets)
        assert [a[1:] for a in facts["servers"]] == [params for _, params in want["servers"]]
        assert ("least_conn" in facts["upstream_body"]) == want["least_conn"]
        assert bool(facts["zone"]) == want["zone"]
        listens = [a[0] for _, a in facts["listens"]]
        everything = listens + sockets + [stats_addr]
        assert len(set(everything)) == len(everything), everything
        if transport == "tcp":
            ports = [int(a.rpartition(":")[2]) for a in everything if not a.startswith("/")]
            assert len(set(ports)) == len(ports), "all on 127.0.0.1: ports must differ too"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        for leftover in Path("/tmp").glob(f".{Path(run_dir).name}.staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def test_write_layout_creates_no_parent_dirs_on_failure(make_layout, tmp_run_dir, monkeypatch):
    # Missing parents are created only when everything passed: a failure leaves no empty folders.
    out = tmp_run_dir / "a" / "b" / "out"
    layout = make_layout("2x4-mapped", run_dir=str(out))
    real = render.render_texts
    monkeypatch.setattr(render, "render_texts",
                        lambda lay: {**real(lay), "uwsgi.ini": real(lay)["uwsgi.ini"].replace("map-socket = 1:2", "")})
    with pytest.raises(RenderError):
        write_layout(layout, out)
    assert list(tmp_run_dir.iterdir()) == []
    monkeypatch.setattr(render, "render_texts", real)
    write_layout(layout, out)
    assert (out / "nginx.conf").is_file() and list(tmp_run_dir.iterdir()) == [tmp_run_dir / "a"]
