"""The app's environment: --virtualenv, --env, --static validation, and the pre-flight import.

No nginx or uWSGI here. The pre-flight tests run the real pre-flight (a fresh interpreter,
as www-data under root) on tiny standard-library-only apps written into run directories;
the Flask app in its own virtualenv is exercised in tests/integration/test_yourapp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from pathlib import Path

import pytest

from tests import flaskapp
from uwsgi_layouts.deploy.cli import add_app_options, app_options
from uwsgi_layouts.deploy.machine import checked, preflight, uwsgi_python, virtualenv_python
from uwsgi_layouts.deploy.model import LayoutError, layout_from_record, parse_layout
from uwsgi_layouts.deploy.render import render_texts, write_map

RUN = "/tmp/ul-appenv-test"  # never created: validation must not need it


def layout(spec="2x4-mapped", **opts):
    opts.setdefault("run_dir", RUN)
    return checked(parse_layout(spec, **opts))


def refused(field: str, **opts) -> str:
    with pytest.raises(LayoutError) as info:
        layout(**opts)
    err = info.value
    assert err.field == field, str(err)
    assert "\n" not in str(err), "one-line messages only"
    return err.problem


@pytest.fixture
def app_dir(run_dirs):
    """An app directory the run user (www-data under root) can read."""
    def make(**files: str) -> Path:
        d = run_dirs()
        d.chmod(0o755)
        for name, text in files.items():
            (d / name).write_text(text)
            (d / name).chmod(0o644)
        return d
    return make


WSGI = "def app(environ, start_response):\n    start_response('200 OK', [])\n    return [b'ok']\n"


# --- virtualenv ---------------------------------------------------------------------------------


def test_our_python_version_comes_from_the_uwsgi_binary():
    version, how = uwsgi_python()
    assert version == sys.version_info[:2]  # pip built our uWSGI with this interpreter
    # make venv's uWSGI is pyuwsgi (its venv's Python); a uWSGI binary names the libpython it links
    pyuwsgi = f"is pyuwsgi, built for Python {version[0]}.{version[1]}"
    assert pyuwsgi in how or f"libpython{version[0]}.{version[1]}" in how, how


def test_default_virtualenv_is_this_projects():
    assert layout().virtualenv == (sys.prefix if sys.prefix != sys.base_prefix else "")


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs to run inside a venv (make venv)")
def test_a_virtualenv_of_our_version_is_accepted_and_resolved():
    lay = layout(virtualenv=sys.prefix + "/bin/..")
    assert lay.virtualenv == str(Path(sys.prefix).resolve())
    assert virtualenv_python(Path(lay.virtualenv)) == sys.version_info[:2]
    assert f"virtualenv = {lay.virtualenv}" in render_texts(lay)["uwsgi.ini"].splitlines()


def test_missing_virtualenv(tmp_path):
    problem = refused("virtualenv", virtualenv=str(tmp_path / "nowhere"))
    assert "does not exist" in problem and "-m venv" in problem


def test_directory_that_is_not_a_virtualenv(tmp_path):
    problem = refused("virtualenv", virtualenv=str(tmp_path))
    assert "is not a virtualenv" in problem and "pyvenv.cfg" in problem


@pytest.mark.parametrize("kind", ["real-if-found", "venv-shaped"])
def test_virtualenv_of_another_python_version_names_both(tmp_path, monkeypatch, record_property, kind):
    """With a real venv of another Python when this machine has one (pyenv's here; CI's fresh
    machine may not), else, and always in the second case, a directory shaped like a venv whose
    pyvenv.cfg says another version."""
    if kind == "venv-shaped":
        monkeypatch.setattr(flaskapp, "other_pythons", lambda: [])
    ours = uwsgi_python()[0]
    venv, how, theirs = flaskapp.other_version_venv(tmp_path / "venv", ours)
    record_property("other_version_venv", how)
    print(f"other-version virtualenv: {how}, Python {theirs[0]}.{theirs[1]}")
    problem = refused("virtualenv", virtualenv=str(venv))
    assert f"is Python {theirs[0]}.{theirs[1]}" in problem, problem
    assert f"our uWSGI runs Python {ours[0]}.{ours[1]}" in problem, problem
    assert f"python{ours[0]}.{ours[1]} -m venv" in problem and "make venv PYTHON=" in problem, problem


def test_version_is_read_from_pyvenv_cfg_of_either_tool(tmp_path):
    for key, value in (("version", "3.9.18"), ("version_info", "3.12.1.final.0")):
        (tmp_path / "pyvenv.cfg").write_text(f"home = /usr/bin\n{key} = {value}\n")
        assert virtualenv_python(tmp_path) == tuple(int(x) for x in value.split(".")[:2])


# --- env ----------------------------------------------------------------------------------------


def test_env_pairs_are_stored_and_rendered():
    lay = layout(env=["DJANGO_SETTINGS_MODULE=shop.settings", "EMPTY=", "URL=postgres://u:p%40ss@db/x?a=b=c",
                      "SPACES=a b ;# c"])
    assert lay.env == (("DJANGO_SETTINGS_MODULE", "shop.settings"), ("EMPTY", ""),
                       ("URL", "postgres://u:p%40ss@db/x?a=b=c"), ("SPACES", "a b ;# c"))
    lines = render_texts(lay)["uwsgi.ini"].splitlines()
    assert "env = DJANGO_SETTINGS_MODULE=shop.settings" in lines
    assert "env = URL=postgres://u:p%%40ss@db/x?a=b=c" in lines  # uWSGI reads %% as %
    assert "env = SPACES=a b ;# c" in lines


def test_env_accepts_pairs_as_layout_json_stores_them():
    assert layout(env=[["A", "1"], ("B", "x=y")]).env == (("A", "1"), ("B", "x=y"))
    assert layout(env="A=1").env == (("A", "1"),)


@pytest.mark.parametrize("item,words", [
    ("NOEQUALS", "KEY=VALUE"),
    ("=x", "key ''"),
    ("1ABC=x", "key '1ABC'"),
    ("A-B=x", "key 'A-B'"),
    ("A B=x", "key 'A B'"),
    ("UWSGI_MODULE=os:system", "UWSGI_"),
    ("uwsgi_ini=/etc/passwd", "UWSGI_"),
    ("PYTHONHOME=/x", "--virtualenv"),
    ("UL_DATA_DIR=/x", "--data-dir"),
    ("A=$(HOME)", "'$('"),
    ("A=@(/etc/shadow)", "'@('"),
    ("A=%(socket)", "'%('"),
    ("A=line1\nline2", "'\\n'"),
    ("A=\r", "'\\r'"),
    ("A=tab\tin", "'\\t'"),
    ("A=trailing ", "ends with whitespace"),
])
def test_bad_env_is_refused(item, words):
    problem = refused("env", env=[item])
    assert words in problem, problem


def test_env_key_given_twice():
    assert "given twice" in refused("env", env=["A=1", "A=2"])


# --- static -------------------------------------------------------------------------------------


def test_static_is_normalised(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "m").mkdir()
    lay = layout(static=[f"/static/={tmp_path}/s/", f"/media/uploads={tmp_path}/m"])
    assert lay.static == (("/static", str(tmp_path.resolve() / "s")), ("/media/uploads", str(tmp_path.resolve() / "m")))


@pytest.mark.parametrize("prefix,words", [
    ("static", "clean URL path"),
    ("/", "hide the app"),
    ("//x", "clean URL path"),
    ("/a/../b", "clean URL path"),
    ("/a/./b", "clean URL path"),
    ("/..", "clean URL path"),
    ("/a b", "clean URL path"),
    ("/a;b", "clean URL path"),
    ("/a%2e", "clean URL path"),
    ("/$uri", "clean URL path"),
    ("/a{b}", "clean URL path"),
])
def test_bad_static_prefix(tmp_path, prefix, words):
    problem = refused("static", static=[f"{prefix}={tmp_path}"])
    assert words in problem, problem


def test_bad_static_dir(tmp_path):
    assert "existing directory" in refused("static", static=[f"/s={tmp_path}/nowhere"])
    (tmp_path / "file").write_text("x")
    assert "existing directory" in refused("static", static=[f"/s={tmp_path}/file"])
    assert "needs a directory" in refused("static", static=["/s="])
    assert "whole filesystem" in refused("static", static=["/s=/"])
    assert "PREFIX=DIR" in refused("static", static=["/s"])
    (tmp_path / "a b").mkdir()
    assert "cannot hold" in refused("static", static=[f"/s={tmp_path}/a b"])  # unquoted in nginx.conf


def test_static_prefixes_may_not_overlap(tmp_path):
    for first, second in (("/s", "/s"), ("/s", "/s/css"), ("/s/css", "/s/")):
        problem = refused("static", static=[f"{first}={tmp_path}", f"{second}={tmp_path}"])
        assert "overlap" in problem, problem
    assert layout(static=[f"/s={tmp_path}", f"/s2={tmp_path}"]).static  # a shared name start is fine


def test_static_prefixes_clear_of_the_data_set(tmp_path):
    data = tmp_path / "data"
    (data / "files").mkdir(parents=True)
    (data / "index.json").write_text("{}")
    write_map(data, {"s00001": "small/s00001.bin"}, source={})
    for prefix in ("/static", "/files", "/_internal_files/x", "/files/", "/nfiles"):
        problem = refused("static", static=[f"{prefix}={tmp_path}"], data_dir=str(data))
        assert "--data-dir" in problem, problem
    assert layout(static=[f"/static={tmp_path}"]).static  # without a data set /static is the user's


def test_static_locations_are_rendered_with_matching_slashes(tmp_path):
    lay = layout(static=[f"/assets={tmp_path}"])
    conf = render_texts(lay)["nginx.conf"]
    assert f"location ^~ /assets/ {{\n            alias {tmp_path.resolve()}/;" in conf
    assert "autoindex off;" in conf and f"disable_symlinks on from={tmp_path.resolve()};" in conf


# --- layout.json round trip -------------------------------------------------------------------


def test_layout_json_records_the_app_environment(tmp_path):
    lay = layout(env=["A=1%", "B=x"], static=[f"/assets={tmp_path}"])
    data = json.loads(render_texts(lay)["layout.json"])
    assert data["env"] == [["A", "1%"], ["B", "x"]]
    assert data["static"] == [["/assets", str(tmp_path.resolve())]]
    assert data["virtualenv"] == lay.virtualenv
    assert layout_from_record(data) == lay


# --- the shared command-line options --------------------------------------------------------------


def test_app_options_give_layout_keywords(tmp_path):
    parser = argparse.ArgumentParser()
    add_app_options(parser)
    args = parser.parse_args(["--app", "shop:app", "--app-dir", str(tmp_path), "--env", "A=1", "--env", "B=2",
                              "--static", f"/s={tmp_path}"])
    assert app_options(args) == {"app": "shop:app", "app_dir": str(tmp_path), "env": ("A=1", "B=2"),
                                 "static": (f"/s={tmp_path}",)}
    assert app_options(parser.parse_args([])) == {}
    lay = layout(**app_options(args))
    assert lay.env == (("A", "1"), ("B", "2")) and lay.static[0][0] == "/s"


# --- pre-flight ---------------------------------------------------------------------------------


def preflight_error(lay) -> str:
    with pytest.raises(LayoutError) as info:
        preflight(lay)
    assert info.value.field == "app"
    assert "\n" not in str(info.value)
    return info.value.problem


def test_preflight_passes_a_good_app_and_the_demo(app_dir):
    preflight(layout(app="wsgi_ok:app", app_dir=str(app_dir(**{"wsgi_ok.py": WSGI}))))
    preflight(layout())  # app.wsgi:application from this project


def test_preflight_reports_the_apps_own_exception_and_where(app_dir):
    code = "import os\n\ndef connect():\n    raise RuntimeError('no database at ' + os.environ.get('DB', '?'))\n\n" \
           "connect()\n"
    d = app_dir(**{"boom.py": code})
    problem = preflight_error(layout(app="boom:app", app_dir=str(d), env=["DB=pg://db"]))
    assert "RuntimeError: no database at pg://db" in problem, problem  # the env reached the import
    assert "boom.py:4 in connect <- boom.py:6 in <module>" in problem, problem
    assert "raise RuntimeError" in problem and "Traceback" not in problem


def test_preflight_module_not_found_is_the_apps_line(app_dir):
    d = app_dir(**{"shop.py": "import flask_that_is_not_installed\n"})
    problem = preflight_error(layout(app="shop:app", app_dir=str(d)))
    assert "ModuleNotFoundError: No module named 'flask_that_is_not_installed'" in problem, problem
    assert "shop.py:1 in <module>" in problem
    assert "callable not found" not in problem


def test_preflight_syntax_error(app_dir):
    d = app_dir(**{"broken.py": "def app(environ, start_response:\n    return []\n"})
    problem = preflight_error(layout(app="broken:app", app_dir=str(d)))
    assert "SyntaxError" in problem and "broken.py:1" in problem, problem


@pytest.mark.parametrize("name", ["site", "json"])
def test_preflight_names_a_module_shadowing_the_standard_library(app_dir, name):
    d = app_dir(**{f"{name}.py": WSGI})
    problem = preflight_error(layout(app=f"{name}:app", app_dir=str(d)))
    assert f"module {name!r} resolves to the standard library" in problem, problem
    assert f"/python{sys.version_info[0]}.{sys.version_info[1]}/{name}" in problem  # its resolved path
    assert str(d / f"{name}.py") in problem and "rename" in problem


def test_preflight_names_a_standard_library_module_given_as_the_app(app_dir):
    problem = preflight_error(layout(app="os:system", app_dir=str(app_dir())))
    assert "module 'os' resolves to the standard library" in problem and "os.py" in problem, problem


def test_preflight_names_a_module_outside_app_dir_and_virtualenv(app_dir):
    elsewhere = app_dir(**{"shop.py": WSGI})
    d = app_dir()
    problem = preflight_error(layout(app="shop:app", app_dir=str(d), env=[f"PYTHONPATH={elsewhere}"]))
    assert f"resolves to {elsewhere.resolve()}/shop.py, outside the app dir" in problem, problem


def test_preflight_attribute_missing_and_not_callable(app_dir):
    d = app_dir(**{"shop.py": WSGI + "VERSION = '1.0'\n"})
    assert "has no attribute 'nope'" in preflight_error(layout(app="shop:nope", app_dir=str(d)))
    problem = preflight_error(layout(app="shop:VERSION", app_dir=str(d)))
    assert "is a str ('1.0'), not a callable" in problem, problem


def test_preflight_runs_as_the_workers_will(app_dir):
    """Same user, cwd, sys.path order and environment as uWSGI's workers."""
    check = ("import os, sys\n"
             "want = os.environ['WANT'].split(',')\n"
             "assert str(os.geteuid()) == want[0], (os.geteuid(), want)\n"
             "assert os.getcwd() == want[1], os.getcwd()\n"
             "assert sys.path[:2] == [want[1], '.'], sys.path[:3]\n"
             "assert sys.prefix == want[2], sys.prefix\n" + WSGI)
    d = app_dir(**{"check.py": check})
    lay = layout(app="check:app", app_dir=str(d))
    uid = os.geteuid() if not lay.drops_privileges else pwd.getpwnam(lay.user).pw_uid
    want = f"{uid},{d.resolve()},{lay.virtualenv or sys.prefix}"
    preflight(layout(app="check:app", app_dir=str(d), env=[f"WANT={want}"]))
    assert not (d / "__pycache__").exists(), "the pre-flight leaves nothing behind"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops privileges")
def test_preflight_as_root_reads_as_the_run_user(app_dir):
    d = app_dir(**{"private.py": WSGI})
    (d / "private.py").chmod(0o600)  # root can read it, www-data cannot: uWSGI's workers would fail
    problem = preflight_error(layout(app="private:app", app_dir=str(d)))
    assert "PermissionError" in problem, problem


def test_preflight_bounded_in_time(app_dir):
    d = app_dir(**{"slow.py": "import time\ntime.sleep(60)\n" + WSGI})
    with pytest.raises(LayoutError) as info:
        preflight(layout(app="slow:app", app_dir=str(d)), timeout=1.0)
    assert "took longer than 1 s" in str(info.value)


def test_preflight_an_interpreter_that_dies(app_dir):
    d = app_dir(**{"dies.py": "import os\nos._exit(7)\n"})
    problem = preflight_error(layout(app="dies:app", app_dir=str(d)))
    assert "exit code 7" in problem and "without an exception" in problem, problem
