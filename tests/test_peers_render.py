"""Peers (gunicorn, granian) on paper: their rendered files, checked by the servers' own option
parsers and by `nginx -t`; the cross-checks; bad peer options; a peer that is not installed;
the launcher's import rules. Nothing here starts a server (tests/integration/test_peers.py does).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import crossplane
import pytest

from uwsgi_layouts.deploy import cli
from uwsgi_layouts.deploy.machine import python as machine_python
from uwsgi_layouts.deploy.model import STRATEGIES, layout_from_record, parse_variant
from uwsgi_layouts.deploy.render import SERVERS, Granian, crosscheck, nginx_test, render_texts, server_for, write_layout
from uwsgi_layouts.deploy.run import LAUNCHER
from uwsgi_layouts.deploy.run.peer_launch import SERVER_PACKAGES

# (id, variant, options): every peer shape the integration tests start, over tcp and unix sockets.
TCP = {"transport": "tcp"}
PEERS = [
    ("gunicorn-gthread", "2x4-gunicorn", TCP),
    ("gunicorn-sync", "2x1-gunicorn", TCP),
    ("gunicorn-reuse-port", "2x4-gunicorn@reuse_port=on", {}),  # tcp by default: SO_REUSEPORT needs it
    ("gunicorn-uwsgi", "2x4-gunicorn@protocol=uwsgi", TCP),
    ("gunicorn-unix", "2x4-gunicorn", {}),
    ("gunicorn-uwsgi-unix", "2x1-gunicorn@protocol=uwsgi", {"nginx_workers": 2}),
    ("gunicorn-no-keepalive", "2x4-gunicorn@keepalive=off", TCP),
    ("gunicorn-no-keepalive-unix", "2x4-gunicorn@keepalive=off", {}),
    ("granian", "2x4-granian", TCP),
    ("granian-no-keepalive", "2x4-granian@keepalive=off", TCP),
    ("granian-unix", "3x2-granian", {"transport": "unix", "nginx_workers": "auto"}),
]


def make(make_layout, variant: str, **options):
    """make_layout for a PxT-STRATEGY@opt=value variant (ports and run dir from the fixture)."""
    spec, _, extra = variant.partition("@")
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        options[key] = value
    return make_layout(spec, **options)


def nginx_directives(conf: Path) -> dict[str, list[list[str]]]:
    payload = crossplane.parse(str(conf), catch_errors=False, combine=True)
    assert payload["status"] == "ok", payload["errors"]
    found: dict[str, list[list[str]]] = {}

    def walk(block):
        for d in block:
            found.setdefault(d["directive"], []).append(d["args"])
            walk(d.get("block", []))

    walk(payload["config"][0]["parsed"])
    return found


def gunicorn_settings(path: Path):
    """gunicorn's own Config, loaded from the rendered file as `gunicorn -c` loads it. gunicorn
    ignores names that are not settings: here any lower-case one fails (a misspelt setting),
    and a bad value raises, as in gunicorn."""
    from gunicorn.config import Config

    namespace: dict = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # what gunicorn does with -c
    cfg = Config()
    for key, value in namespace.items():
        if key.startswith("__") or key == "os" or key.isupper():  # the module, our constants
            continue
        assert key in cfg.settings, f"gunicorn has no setting {key!r}"
        cfg.set(key, value)
    return cfg


def granian_options(path: Path, app: str) -> dict:
    """granian's own command line, given the rendered env file as its environment: an
    unknown GRANIAN_* name is ignored by click, so each is checked against granian's options."""
    from granian.cli import cli as granian_cli

    env = Granian.read_env_file(path.read_text())
    known = {f"GRANIAN_{p.name.upper()}" for p in granian_cli.params}
    unknown = sorted(k for k in env if k.startswith("GRANIAN_") and k not in known)
    assert not unknown, f"granian has no options {unknown}"
    saved = os.environ.copy()
    try:
        os.environ.update(env)
        ctx = granian_cli.make_context("granian", [app], auto_envvar_prefix="GRANIAN")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return ctx.params


@pytest.mark.parametrize("variant,options", [c[1:] for c in PEERS], ids=[c[0] for c in PEERS])
def test_peer_renders_files_its_server_accepts(make_layout, variant, options):
    layout = make(make_layout, variant, **options)
    server = server_for(layout)
    result = write_layout(layout, layout.run_dir)
    out = Path(layout.run_dir)
    assert sorted(result.files) == sorted(["nginx.conf", "mime.types", *server.files(layout), "layout.json"])
    assert {p.name for p in out.iterdir() if p.is_file()} == set(result.files)
    assert "syntax is ok" in result.nginx_test
    assert crosscheck(layout, out) == []
    for name in result.files:
        text = (out / name).read_text()
        if name not in ("layout.json", "uwsgi_params", "mime.types"):  # the latter two: copies of nginx's
            assert text.startswith(f"# Generated from layout {layout.name} by `uwsgi-layouts render`: do not edit.")

    address = layout.sockets[0].address
    if layout.server == "gunicorn":
        cfg = gunicorn_settings(out / "gunicorn.conf.py")
        assert cfg.workers == layout.processes
        assert cfg.worker_class_str == ("sync" if layout.threads == 1 else "gthread")
        assert cfg.threads == layout.threads
        assert cfg.bind == [f"unix:{address}" if layout.transport == "unix" else address]
        assert cfg.backlog == layout.backlog
        assert cfg.reuse_port == layout.reuse_port
        assert cfg.settings["protocol"].get() == layout.nginx_protocol
        assert cfg.control_socket_disable is True
        assert cfg.secure_scheme_headers == {"X-FORWARDED-PROTO": "https"}
        assert cfg.chdir == layout.app_dir and cfg.wsgi_app == layout.app
        if layout.transport == "unix":
            assert 0o777 & ~cfg.umask == 0o660
        if layout.drops_privileges:
            assert (cfg.uid, cfg.gid) == (pwd.getpwnam(layout.user).pw_uid, pwd.getpwnam(layout.user).pw_gid)
    else:
        params = granian_options(out / "granian.env", layout.app)
        assert params["interface"].value == "wsgi" and params["workers"] == layout.processes
        assert params["blocking_threads"] == layout.threads
        assert params["backpressure"] >= 768 * (os.cpu_count() if layout.nginx_workers == "auto"
                                                else layout.nginx_workers)
        assert params["backlog"] == max(128, layout.backlog)
        if layout.transport == "unix":
            assert str(params["uds"]) == address and params["uds_permissions"] == 0o660
        else:
            assert (params["host"], params["port"]) == tuple(address.split(":")[:1]) + (layout.base_port,)
        assert str(params["working_dir"]) == layout.app_dir and params["respawn_failed_workers"] is True

    nginx = nginx_directives(out / "nginx.conf")
    target = f"unix:{address}" if layout.transport == "unix" else address
    assert nginx["server"][:2] == [[target, "max_fails=0"], [target, "max_fails=0", "backup"]]
    assert nginx["upstream"] == [[server.upstream]]
    if layout.nginx_protocol == "uwsgi":
        assert nginx["uwsgi_pass"] == [[server.upstream]] and "proxy_pass" not in nginx
        assert ["HTTP_HOST", "$host"] in nginx["uwsgi_param"]  # uwsgi_params is included (combined here)
        assert "keepalive" not in nginx  # nginx keeps no uwsgi upstream connection alive
    else:
        assert nginx["proxy_pass"] == [[f"http://{server.upstream}"]] and "uwsgi_pass" not in nginx
        headers = {args[0]: args[1] for args in nginx["proxy_set_header"]}
        forwarded = {"Host": "$host", "X-Forwarded-For": "$remote_addr", "X-Forwarded-Proto": "$scheme",
                     "X-Forwarded-Host": "$host"}
        if layout.keepalive:
            assert nginx["proxy_http_version"] == [["1.1"]]
            assert headers == {"Connection": "", **forwarded}
            assert nginx["keepalive"] == [[str(max(16, 2 * layout.processes * layout.threads))]]
            assert nginx["keepalive_timeout"] == [["20s"]]
        else:  # HTTP/1.0, Connection: close, nothing kept: a connection per request
            assert headers == forwarded
            assert "proxy_http_version" not in nginx and "keepalive" not in nginx
            assert "keepalive_timeout" not in nginx
        assert [d for d in nginx if d.startswith("uwsgi_") and d != "uwsgi_temp_path"] == []
    # The same failover policy as for uWSGI, as proxy_* directives for HTTP.
    p = "uwsgi" if layout.nginx_protocol == "uwsgi" else "proxy"
    assert nginx[f"{p}_next_upstream"] == [["error"]]
    assert nginx[f"{p}_next_upstream_tries"] == [[str(layout.retries + 1)]]
    assert nginx[f"{p}_read_timeout"] == [[f"{2 * layout.harakiri + 1}s"]]
    assert nginx[f"{p}_connect_timeout"] == [[f"{layout.connect_timeout}s"]]

    data = json.loads((out / "layout.json").read_text())
    assert data["server"] == layout.server and data["stats"] is None
    assert (data["reuse_port"], data["protocol"], data["keepalive"]) == (layout.reuse_port, layout.protocol,
                                                                         layout.keepalive)
    assert layout_from_record(data) == layout


def test_peers_render_the_apps_environment_exactly(make_layout):
    env = ["PLAIN=1", "PERCENT=50% off", "QUOTES=it's \"q\"", "URL=a=b;c#d"]
    for spec in ("2x2-gunicorn", "2x2-granian"):
        layout = make_layout(spec, env=env)
        write_layout(layout, layout.run_dir)
        facts = server_for(layout).facts(layout, Path(layout.run_dir))
        assert facts.env == [tuple(e.split("=", 1)) for e in env], spec
        assert crosscheck(layout, Path(layout.run_dir)) == []
        if layout.server == "gunicorn":  # as gunicorn itself reads raw_env
            cfg = gunicorn_settings(Path(layout.run_dir) / "gunicorn.conf.py")
            assert cfg.env == dict(e.split("=", 1) for e in env)


def test_lock_engine_is_rendered_for_thunder_only(make_layout):
    layout = make(make_layout, "2x4-thunder@lock_engine=ipcsem")
    text = render_texts(layout)["uwsgi.ini"]
    assert "\nlock-engine = ipcsem\n" in text and "\nthunder-lock = true\n" in text
    assert "lock-engine" not in render_texts(make_layout("2x4-thunder"))["uwsgi.ini"]
    write_layout(layout, layout.run_dir)
    assert crosscheck(layout, Path(layout.run_dir)) == []


# --- the cross-checks: tampered peer configs are among tests/test_render.py TAMPER ----------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="only root renders a user switch")
def test_crosscheck_wants_gunicorn_to_name_the_run_user(make_layout):
    layout = make_layout("2x4-gunicorn")
    write_layout(layout, layout.run_dir)
    conf = Path(layout.run_dir) / "gunicorn.conf.py"
    conf.write_text(conf.read_text().replace(f"user = '{layout.user}'", "user = 'root'"))
    assert any("switches to root" in p for p in crosscheck(layout, Path(layout.run_dir)))


# --- bad peer options: exit 2, one line, nothing written -------------------------------------------

BAD = [
    # (id, layout, extra args, field the error line names)
    ("reuse-port-on-uwsgi", "2x4-mapped@reuse_port=on", [], "reuse_port"),
    ("reuse-port-on-granian", "2x4-granian@reuse_port=on", [], "reuse_port"),
    ("reuse-port-not-bool", "2x4-gunicorn@reuse_port=maybe", [], "reuse_port"),
    ("reuse-port-unix", "2x4-gunicorn@reuse_port=on", ["--transport", "unix"], "reuse_port"),
    ("protocol-xyz", "2x4-gunicorn@protocol=xyz", [], "protocol"),
    ("protocol-on-granian", "2x4-granian@protocol=uwsgi", [], "protocol"),
    ("protocol-unknown-to-uwsgi", "2x4-shared@protocol=fastcgi", [], "protocol"),
    ("http11-on-shared", "2x4-shared@protocol=http11", [], "protocol"),
    ("http11-on-overflow", "2x4-overflow@protocol=http11", [], "protocol"),
    ("http11-several-nginx-workers", "2x4-mapped@protocol=http11", ["--nginx-workers", "2"], "protocol"),
    ("http-with-uwsgi-tls", "2x4-mapped@protocol=http,uwsgi_tls=suwsgi", [], "protocol"),
    ("keepalive-on-uwsgi", "2x4-mapped@keepalive=off", [], "keepalive"),
    ("keepalive-over-uwsgi-protocol", "2x4-gunicorn@protocol=uwsgi,keepalive=off", [], "keepalive"),
    ("keepalive-not-bool", "2x4-granian@keepalive=sometimes", [], "keepalive"),
    ("lock-engine-on-gunicorn", "2x4-gunicorn@lock_engine=ipcsem", [], "lock_engine"),
    ("lock-engine-on-mapped", "2x4-mapped@lock_engine=ipcsem", [], "lock_engine"),
    ("lock-engine-unknown", "2x4-thunder@lock_engine=futex", [], "lock_engine"),
    ("unknown-variant-option", "2x4-gunicorn@workers=8", [], "workers"),
    ("variant-without-value", "2x4-gunicorn@reuse_port", [], "layout"),
    ("granian-env", "2x4-granian", ["--env", "GRANIAN_WORKERS=8"], "env"),
]


@pytest.mark.parametrize("command", ["render", "run"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_peer_option_exits_2_with_one_line(capsys, tmp_run_dir, case, command):
    _, spec, extra, field = case
    out = tmp_run_dir / "out"
    where = ["--out", str(out)] if command == "render" else ["--run-dir", str(out), "--for", "1"]
    rc = cli.main([command, spec, *extra, *where])
    captured = capsys.readouterr()
    assert rc == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), captured.err
    assert list(tmp_run_dir.iterdir()) == [], "nothing is written for bad input"


def test_a_refusal_names_the_strategies_that_take_the_option():
    with pytest.raises(Exception) as info:
        parse_variant("3x2-mapped@reuse_port=on", run_dir="/tmp/ul-never")
    assert str(info.value) == ("reuse_port: does not apply to mapped (only to gunicorn); remove it or use e.g. "
                               "3x2-gunicorn")


# --- a peer that is not installed -----------------------------------------------------------------------


@pytest.mark.parametrize("peer", ["gunicorn", "granian"])
def test_a_peer_that_is_not_installed_gives_one_line_saying_how_to_install_it(capsys, monkeypatch, tmp_run_dir,
                                                                              free_ports, peer):
    # Simulated: the lookup of the server's package is pointed at an empty directory, as in a
    # venv without the `peers` group. The real lookup (importlib's PathFinder) runs.
    empty = tmp_run_dir / "empty-site"
    empty.mkdir()
    monkeypatch.setattr(machine_python, "PEER_SEARCH_PATH", [str(empty)])
    run_dir = tmp_run_dir / "run"
    ports = free_ports(2)
    rc = cli.main(["run", f"2x2-{peer}", "--run-dir", str(run_dir), "--base-port", str(ports[0]),
                   "--listen", f"127.0.0.1:{ports[1]}", "--for", "5"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.splitlines() == [f"error: {peer} is not installed in {sys.prefix}: it is a dependency of "
                                "uwsgi-layouts: reinstall it (in a checkout: make venv)"], err
    assert not run_dir.exists(), "nothing is written or started"
    # Render alone does not need the server.
    out = tmp_run_dir / "out"
    assert cli.main(["render", f"2x2-{peer}", "--out", str(out)]) == 0, capsys.readouterr().err


# --- the launcher takes only the server's packages from our venv ----------------------------------------


def test_launcher_requirements_match_the_installed_metadata():

    top_level = importlib.metadata.packages_distributions()
    for peer, (package, requires) in SERVER_PACKAGES.items():
        dist = importlib.metadata.distribution(peer)
        unconditional = [re.split(r"[ <>=!~;\[]", r, maxsplit=1)[0] for r in dist.requires or () if ";" not in r]
        names = sorted(name for name, dists in top_level.items() if any(d.lower() in map(str.lower, unconditional)
                                                                       for d in dists))
        assert sorted(requires) == names, (peer, unconditional)
        assert SERVERS[peer].package == package and SERVERS[peer].requires == requires


def test_launcher_prefers_our_server_and_the_apps_requirements(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for site, packages in ((ours, ("granian", "click", "jinja2")), (theirs, ("granian", "click"))):
        for name in packages:
            (site / name).mkdir(parents=True)
            (site / name / "__init__.py").write_text(f"WHO = {site.name!r}\n")
    # -S: no site-packages of ours; "theirs" plays the app's venv.
    code = (f"import sys; sys.path.insert(0, {str(LAUNCHER.parent)!r}); import peer_launch; sys.path.pop(0); "
            f"sys.path.append({str(theirs)!r}); peer_launch.use_server_packages('granian', {str(ours)!r})\n"
            "import granian, click\n"
            "try:\n    import jinja2\nexcept ImportError:\n    jinja2 = None\n"
            "print(granian.WHO, click.WHO, jinja2)")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.split() == ["ours", "theirs", "None"], proc.stderr
    # An app without the requirement gets ours; nothing else of ours is visible.
    shutil.rmtree(theirs / "click")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.split() == ["ours", "ours", "None"], proc.stderr


def test_every_strategy_names_a_server_with_an_app_server():
    assert {s.server for s in STRATEGIES.values()} == set(SERVERS)


def test_nginx_test_runs_on_a_rendered_peer(make_layout):
    layout = make_layout("2x4-granian")
    write_layout(layout, layout.run_dir, check_nginx=False)
    ok, output = nginx_test(Path(layout.run_dir))
    assert ok and "test is successful" in output, output
