"""App factories (``--app 'shop:create_app()'``), the pre-flight's test call, --import-timeout,
and the app options' defaults inside an app's directory.

Parsing is pure; rendering writes files (no server starts); the pre-flight runs the real
pre-flight (a fresh interpreter, as www-data under root) on tiny standard-library-only apps.
Real servers calling factories: tests/integration/test_djangoapp.py.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.arguments import OneLineParser
from uwsgi_layouts.deploy.cli import add_app_options, app_options, build_parser, import_timeout, main
from uwsgi_layouts.deploy.machine import PROBE_PATH, app_virtualenv, checked, preflight, run_user_ids
from uwsgi_layouts.deploy.model import LayoutError, parse_app, parse_layout
from uwsgi_layouts.deploy.render import render_texts, server_for, write_layout
from uwsgi_layouts.deploy.run import process_for

RUN = "/tmp/ul-factories-test"  # never created: validation must not need it
ENTRY = "entry/uwsgi_layouts_entry.py"


def layout(spec="2x2-mapped", **opts):
    opts.setdefault("run_dir", RUN)
    return checked(parse_layout(spec, **opts))


def refused(text: str) -> str:
    with pytest.raises(LayoutError) as info:
        parse_app(text)
    assert info.value.field == "app"
    assert "\n" not in str(info.value)
    return info.value.problem


# --- parsing (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize("text,module,name,arguments", [
    ("app.wsgi:application", "app.wsgi", "application", None),
    ("shop:create_app()", "shop", "create_app", ""),
    ("shop:create_app( 'prod' )", "shop", "create_app", "'prod'"),
    ('shop.main:create_app("prod", debug=False)', "shop.main", "create_app", "'prod', debug=False"),
    ("shop:make(1, -2.5, None, True, (1, 'a'), [2], {'k': [3]}, b'x', n={1, 2})", "shop", "make",
     "1, -2.5, None, True, (1, 'a'), [2], {'k': [3]}, b'x', n={1, 2}"),
    ("shop:make(\n  'a',\n)", "shop", "make", "'a'"),
])
def test_app_forms_are_parsed_and_normalised(text, module, name, arguments):
    target = parse_app(text)
    assert (target.module, target.name, target.arguments) == (module, name, arguments)
    assert target.is_factory == (arguments is not None)
    assert target.reference == f"{module}:{name}"
    assert parse_app(target.text) == target  # the normalised text parses to the same target
    if arguments:  # the normalised arguments are the same literals
        call = ast.parse(f"f({target.arguments})", mode="eval").body
        assert [ast.literal_eval(a) for a in call.args] or call.keywords


def test_layout_keeps_the_normalised_spelling():
    lay = layout(app='shop:create_app( "prod",debug = False )')
    assert lay.app == "shop:create_app('prod', debug=False)"
    assert lay.app_target.arguments == "'prod', debug=False"
    assert layout(app="app.wsgi:application").app_target.is_factory is False


@pytest.mark.parametrize("text,needle", [
    ("shop:create_app(config)", "argument 'config' of create_app(...) is not a literal"),
    ("shop:create_app(os.environ['X'])", "is not a literal"),
    ("shop:create_app(1 + 2)", "argument '1 + 2' of create_app(...) is not a literal"),
    ("shop:create_app(open('/etc/passwd'))", "is not a literal"),
    ("shop:create_app(lambda: 1)", "is not a literal"),
    ("shop:create_app(f'{x}')", "is not a literal"),
    ("shop:create_app(*args)", "*args in create_app(...) is not a literal argument"),
    ("shop:create_app(**{'a': 1})", "is not a literal argument: write each keyword argument out"),
    ("shop:create_app(a=1, a=2)", "keyword argument 'a' is given twice"),
    ("shop:create_app().wsgi_app", "must be a name in shop or a call of one"),
    ("shop:factories.create_app()", "must be a name in shop or a call of one"),
    ("shop:create_app()()", "must be a name in shop or a call of one"),
    ("shop:create_app(", "is neither a name nor a factory call"),
    ("shop:create_app(); import os", "is neither a name nor a factory call"),
    ("shop:__import__('os').system('id')", "must be a name in shop or a call of one"),
    ("shop", "expected module:callable"),
    ("shop:", "expected module:callable"),
    ("sh op:app", "expected module:callable"),
    ("shop:create_app(" + "1, " * 1000 + ")", "at most 2000"),
])
def test_anything_but_a_literal_argument_list_is_refused_in_one_line(text, needle):
    problem = refused(text)
    assert needle in problem, problem


def test_a_refused_factory_never_reaches_a_layout():
    with pytest.raises(LayoutError) as info:
        layout(app="shop:create_app(__import__('os'))")
    assert info.value.field == "app"


# --- rendering: who calls the factory ---------------------------------------------------------


def entry_of(texts: dict) -> str:
    return texts[ENTRY]


def test_uwsgi_loads_a_generated_entry_module_for_a_factory():
    lay = layout("2x2-mapped", app="shop:create_app('prod', debug=False)")
    texts = render_texts(lay)
    ini = texts["uwsgi.ini"]
    assert f"wsgi-file = {RUN}/{ENTRY}" in ini and "\nmodule =" not in ini
    entry = entry_of(texts)
    assert entry.startswith("# Generated from layout 2x2-mapped by `uwsgi-layouts render`: do not edit.")
    assert "from shop import create_app as _factory\n" in entry
    assert "application = _factory('prod', debug=False)\n" in entry
    compile(entry, ENTRY, "exec")  # valid Python
    assert server_for(lay).files(lay) == ["uwsgi.ini", "uwsgi_params", ENTRY]


def test_uwsgi_names_a_plain_callable_as_before():
    texts = render_texts(layout("2x2-mapped", app="app.wsgi:application"))
    assert "module = app.wsgi:application" in texts["uwsgi.ini"] and "wsgi-file" not in texts["uwsgi.ini"]
    assert ENTRY not in texts


def test_gunicorn_calls_the_factory_itself():
    lay = layout("2x2-gunicorn", app="shop:create_app('prod')")
    texts = render_texts(lay)
    assert "wsgi_app = \"shop:create_app('prod')\"" in texts["gunicorn.conf.py"]
    assert ENTRY not in texts


def test_granian_calls_a_factory_without_arguments_and_imports_the_entry_module_otherwise():
    lay = layout("2x2-granian", app="shop:create_app()")
    texts = render_texts(lay)
    assert "\nGRANIAN_FACTORY=true\n" in texts["granian.env"] and ENTRY not in texts
    assert process_for(lay).command(lay)[-1] == "shop:create_app"
    lay = layout("2x2-granian", app="shop:create_app('prod')")
    texts = render_texts(lay)
    assert "GRANIAN_FACTORY" not in texts["granian.env"]
    assert "application = _factory('prod')" in entry_of(texts)
    assert process_for(lay).command(lay)[-1] == f"{RUN}/{ENTRY}:application"
    plain = layout("2x2-granian", app="shop:app")
    assert process_for(plain).command(plain)[-1] == "shop:app"


def test_write_layout_keeps_the_entry_module_to_the_run_group_and_removes_it_when_stale(run_dirs):
    run_dir = run_dirs()
    lay = layout("1x2-shared", app="app.wsgi:make('x')", run_dir=str(run_dir))
    result = write_layout(lay, run_dir, check_nginx=False)
    entry = run_dir / ENTRY
    assert ENTRY in result.files and entry.is_file()
    assert entry.stat().st_mode & 0o777 == 0o640 and entry.parent.stat().st_mode & 0o777 == 0o750
    if lay.drops_privileges:  # under root: root owns it, the run user's group reads it
        assert (entry.stat().st_uid, entry.stat().st_gid) == (0, run_user_ids(lay.user)[1])
    write_layout(layout("1x2-shared", run_dir=str(run_dir)), run_dir, check_nginx=False)  # no factory now
    assert not entry.exists() and not entry.parent.exists()


# --- the pre-flight calls the app once ----------------------------------------------------------

APP = '''\
import os
SEEN = os.environ.get("SEEN_FILE")

def app(environ, start_response):
    if SEEN:
        with open(SEEN, "a") as f:
            f.write(environ["REQUEST_METHOD"] + " " + environ["PATH_INFO"] + "\\n")
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not found"]

def create_app(name="dev", debug=True):
    if name not in ("dev", "prod"):
        raise ValueError("unknown config " + name)
    return app

def make_app():  # a factory that takes no arguments
    return app

def make_any(*args, **kwargs):  # a factory that takes anything
    return app

def streamed(environ, start_response):  # start_response with the first chunk (allowed by PEP 3333)
    start_response("200 OK", [])
    yield b"a"

def raises_inside(environ, start_response):  # the app's own error on that path: its business
    raise KeyError("no route")

def returns_none():
    return None

def no_start(environ, start_response):
    return [b"x"]

VERSION = "1.0"
'''


@pytest.fixture
def factory_dir(run_dirs):
    d = run_dirs()
    d.chmod(0o755)
    (d / "fapp.py").write_text(APP)
    (d / "fapp.py").chmod(0o644)
    return d


def preflight_error(app: str, app_dir: Path, **opts) -> str:
    with pytest.raises(LayoutError) as info:
        preflight(layout(app=app, app_dir=str(app_dir), **opts))
    assert info.value.field == "app" and "\n" not in str(info.value)
    return info.value.problem


@pytest.mark.parametrize("app", ["fapp:app", "fapp:create_app()", "fapp:create_app('prod', debug=False)",
                                 "fapp:make_app()", "fapp:streamed", "fapp:raises_inside"])
def test_preflight_passes_wsgi_apps_and_factories_that_return_one(factory_dir, app):
    preflight(layout(app=app, app_dir=str(factory_dir)))


def test_preflight_sends_one_get_of_the_probe_path(factory_dir, run_dirs):
    seen = run_dirs() / "seen.txt"
    seen.parent.chmod(0o777)  # the pre-flight runs as the run user under root
    preflight(layout(app="fapp:app", app_dir=str(factory_dir), env=[f"SEEN_FILE={seen}"]))
    assert seen.read_text() == f"GET {PROBE_PATH}\n"


@pytest.mark.parametrize("app,needles", [
    # forgot the parentheses: called as a WSGI app, the factory returns the app...
    ("fapp:make_any", ["fapp:make_any, called with a test request, returned a callable (function)",
                       "not a WSGI application", "--app 'fapp:make_any()'"]),
    # ... or fails on the environ it got as its configuration
    ("fapp:create_app", ["fapp:create_app, called with a test request, raised TypeError",
                         "its parameters have defaults, as an app factory's do", "--app 'fapp:create_app()'"]),
    # forgot them, and the factory takes no arguments at all
    ("fapp:make_app", ["fapp:make_app takes (), not a WSGI application's (environ, start_response)",
                       "--app 'fapp:make_app()'"]),
    ("fapp:no_start", ["never called start_response", "--app 'fapp:no_start()'"]),
    ("fapp:returns_none()", ["the app factory returns_none() returned a NoneType (None)", "must return the app"]),
    ("fapp:create_app('staging')", ["the app factory create_app('staging') raised ValueError: unknown config "
                                    "staging (at fapp.py:13 in create_app)"]),
    ("fapp:create_app(1, 2, 3)", ["raised TypeError: create_app() takes from 0 to 2 positional arguments"]),
    ("fapp:nope()", ["has no attribute 'nope'"]),
    ("fapp:VERSION()", ["is a str ('1.0'), not a callable"]),
])
def test_preflight_refuses_what_is_not_a_wsgi_app_naming_the_fix(factory_dir, app, needles):
    problem = preflight_error(app, factory_dir)
    for needle in needles:
        assert needle in problem, problem


def test_preflight_timeout_covers_the_factory_and_names_the_option(factory_dir):
    (factory_dir / "slowf.py").write_text("import time\n\ndef create_app():\n    time.sleep(60)\n")
    (factory_dir / "slowf.py").chmod(0o644)
    with pytest.raises(LayoutError) as info:
        preflight(layout(app="slowf:create_app()", app_dir=str(factory_dir)), timeout=1.0)
    assert "took longer than 1 s" in str(info.value) and "--import-timeout SECONDS" in str(info.value)


# --- --import-timeout --------------------------------------------------------------------------


def parsed(*argv: str) -> argparse.Namespace:
    parser = OneLineParser(prog="app")
    add_app_options(parser)
    return parser.parse_args(list(argv))


def test_import_timeout_default_and_values():
    assert import_timeout(parsed()) == 30.0
    assert import_timeout(parsed("--import-timeout", "90")) == 90.0
    assert import_timeout(parsed("--import-timeout", "0.5")) == 0.5
    assert import_timeout(parsed("--import-timeout", "3600")) == 3600.0  # the range's closed end


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3601", "soon", ""])
def test_import_timeout_refuses_what_is_not_a_duration(value, capsys):
    with pytest.raises(SystemExit) as info:
        parsed("--import-timeout", value)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("app: error: argument --import-timeout: must be a number of seconds in (0, 3600], got ")


@pytest.mark.parametrize("command", [["run", "1x1-shared"], ["reload", "1x1-shared"], ["install", "/nonexistent"]])
def test_commands_that_run_the_preflight_take_import_timeout(command, capsys):
    args = build_parser().parse_args([*command, "--import-timeout", "45"])
    assert import_timeout(args) == 45.0
    with pytest.raises(SystemExit) as info:
        main([*command, "--import-timeout", "never"])
    assert info.value.code == 2
    assert "error: argument --import-timeout: must be a number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["render", "1x1-shared"], ["bundle", "1x1-shared", "--out", "/tmp/x"]])
def test_commands_without_a_preflight_do_not_take_import_timeout(command, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, "--import-timeout", "45"])
    assert info.value.code == 2
    assert "unrecognized arguments: --import-timeout" in capsys.readouterr().err


# --- inside an app's directory, the defaults follow it ------------------------------------------


def fake_venv(where: Path) -> Path:
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "python").symlink_to(sys.executable)
    (where / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return where


def test_app_virtualenv_prefers_the_active_one_then_dot_venv_then_venv(tmp_path):
    assert app_virtualenv(tmp_path, {}) == ("", f"no $VIRTUAL_ENV, .venv or venv in {tmp_path}")
    fake_venv(tmp_path / "venv")
    assert app_virtualenv(tmp_path, {}) == (str(tmp_path / "venv"), "venv in the app's directory")
    fake_venv(tmp_path / ".venv")
    assert app_virtualenv(tmp_path, {}) == (str(tmp_path / ".venv"), ".venv in the app's directory")
    assert app_virtualenv(tmp_path, {"VIRTUAL_ENV": "/opt/shop-venv"}) == ("/opt/shop-venv", "$VIRTUAL_ENV")
    # this tool's own venv, active because the tool runs from it, is not the app's
    assert app_virtualenv(tmp_path, {"VIRTUAL_ENV": sys.prefix}) == (str(tmp_path / ".venv"),
                                                                    ".venv in the app's directory")


def test_with_app_the_app_dir_and_virtualenv_default_to_the_current_directory(tmp_path, monkeypatch):
    venv = fake_venv(tmp_path / ".venv")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    notes: list[str] = []
    options = app_options(parsed("--app", "shop:app"), notes=notes)
    assert options == {"app": "shop:app", "app_dir": str(tmp_path), "virtualenv": str(venv)}
    assert notes == [f"--app shop:app: app dir {tmp_path} (the current directory), virtualenv {venv} "
                     "(.venv in the app's directory)"]
    # what is given wins, and a default that is not used is not announced
    notes.clear()
    assert app_options(parsed("--app", "shop:app", "--app-dir", "/srv/shop", "--virtualenv", "/srv/v"),
                       notes=notes) == {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/v"}
    assert notes == []


def test_without_a_virtualenv_to_find_the_line_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    assert app_options(parsed("--app", "shop:app")) == {"app": "shop:app", "app_dir": str(tmp_path)}
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "this tool's own Python" in out and "give --virtualenv" in out, out


def test_without_app_the_demo_keeps_its_directory_and_our_venv(tmp_path, monkeypatch, capsys):
    fake_venv(tmp_path / ".venv")
    monkeypatch.chdir(tmp_path)
    assert app_options(parsed()) == {}
    assert capsys.readouterr().out == ""


def test_a_bundle_takes_no_local_defaults(tmp_path, monkeypatch):
    """Its paths are the server's: nothing of this machine's current directory goes into them."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["bundle", "1x1-mapped", "--app", "shop:app", "--out", str(tmp_path / "b")])
    assert app_options(args, here=False) == {"app": "shop:app"}
    assert main(["bundle", "1x1-mapped", "--app", "shop:create_app()", "--app-dir", "/srv/shop", "--virtualenv",
                 "/srv/shop/venv", "--out", str(tmp_path / "b")]) == 2
    assert not (tmp_path / "b").exists()
