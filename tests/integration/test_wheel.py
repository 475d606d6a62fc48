"""The tool as a user installs it: the wheel built from this checkout, installed into a fresh
virtualenv outside the repository, run from another directory against the Flask test app.

What the wheel must carry is what a clone had beside the code: the templates (nginx, uWSGI, the
bundle's), nginx's mime.types, wrk's Lua scripts, the demo app. Its third-party dependencies are
pip's job, not ours, and one of them, uWSGI, compiles for a minute: the fresh venv takes them from
this project's venv (a .pth line) and a copy of its uwsgi binary, and installs only our wheel, with
--no-deps. Everything else (the console script, the package's own files, the working directory)
is the installed wheel's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.flaskapp import SYSTEM_PYTHON
from tests.integration.support import REPO_ROOT, kill_run, reset_signals
from tests.tunefakes import fake_run
from uwsgi_layouts.deploy.run import http_get

# One worker runs the module, so its wheel and venv (the module fixture) are built once, not once
# per worker that picks up one of its tests.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.xdist_group("wheel")]


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in line]
    assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}:\n" + "\n".join(lines[-30:])
    return proc


@pytest.fixture(scope="module")
def installed():
    """(the fresh venv, the wheel's path, a scratch directory outside the repository); removed
    afterwards. World-traversable: started as root, the stacks run as www-data, which must read
    the venv's Python and the package."""
    top = Path(tempfile.mkdtemp(prefix="ul-wheel-", dir="/tmp"))
    try:
        top.chmod(0o755)
        src = top / "src"  # only what the wheel is built from: a build never writes into the checkout
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO_ROOT / name, src / name)
        shutil.copytree(REPO_ROOT / "uwsgi_layouts", src / "uwsgi_layouts",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(top / "dist"), str(src)])
        wheel = next((top / "dist").glob("uwsgi_layouts-*.whl"))
        venv = top / "venv"
        # Without a pip of its own (ensurepip took about 5 CPU-s, 11 s on a busy machine): this
        # project's pip installs the wheel into it (--python), as the venv's own pip would.
        _run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)])
        _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
              str(wheel)])
        purelib = _run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        Path(purelib.stdout.strip(), "project-deps.pth").write_text(site.getsitepackages()[0] + "\n")
        shutil.copy2(Path(sys.prefix) / "bin" / "uwsgi", venv / "bin" / "uwsgi")
        work = top / "elsewhere"
        work.mkdir(mode=0o755)
        work.chmod(0o755)
        for path in top.rglob("*"):  # the venv's files as pip wrote them may be 0600 under a umask
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | (0o755 if path.is_dir() else 0o444))
        yield venv, wheel, work
    finally:
        shutil.rmtree(top, ignore_errors=True)


def tool(venv: Path, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin" / "uwsgi-layouts"), *args], cwd=cwd, timeout=timeout)


def test_the_wheel_carries_one_package_with_its_data(installed):
    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    # no generic top-level names (app, deploy, bench) that could shadow a user's own modules
    assert tops == {"uwsgi_layouts", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    # every file of the package in the checkout, at any depth (bundle/nginx/ was once left out)
    ours = {f"uwsgi_layouts/{p.relative_to(REPO_ROOT / 'uwsgi_layouts').as_posix()}"
            for p in (REPO_ROOT / "uwsgi_layouts").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert ours - set(names) == set()
    for data in ("templates/nginx.conf.j2", "templates/uwsgi.ini.j2", "templates/mime.types",
                 "templates/uwsgi_params", "templates/bundle/site.conf.j2", "templates/bundle/nginx/_forwarded.j2",
                 "bench/load/lua/report.lua", "bench/load/lua/random_files.lua", "app/wsgi.py"):
        assert f"uwsgi_layouts/{data}" in names, data
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "uwsgi-layouts = uwsgi_layouts.console:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_it_imports_from_the_fresh_venv_not_from_the_checkout(installed):
    venv, _, work = installed
    where = _run([str(venv / "bin" / "python"), "-c", "import uwsgi_layouts; print(uwsgi_layouts.__file__)"],
                 cwd=work).stdout.strip()
    assert where.startswith(str(venv)), where
    assert "usage: uwsgi-layouts COMMAND" in tool(venv, "--help", cwd=work).stdout


def test_render_the_demo_app_and_the_flask_app_from_another_directory(installed, flask_app):
    venv, _, work = installed
    tool(venv, "render", "2x2-mapped", "--out", "demo", cwd=work)
    ini = (work / "demo" / "uwsgi.ini").read_text()
    assert str(venv) in ini and str(REPO_ROOT) not in ini  # the demo app is the installed one
    assert (work / "demo" / "mime.types").is_file() and (work / "demo" / "nginx.conf").is_file()
    tool(venv, "render", "2x4-mapped", "--out", "shop", *flask_app.cli_args(), cwd=work)
    assert f"chdir = {flask_app.app_dir}" in (work / "shop" / "uwsgi.ini").read_text()


def test_run_serves_the_flask_app_then_stops_on_ctrl_c(installed, flask_app, run_dirs, free_ports):
    venv, _, work = installed
    base, listen = free_ports(2)
    run_dir = run_dirs()
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.Popen([str(venv / "bin" / "uwsgi-layouts"), "run", "2x2-mapped", *flask_app.cli_args(),
                                 "--run-dir", str(run_dir / "run"), "--listen", f"127.0.0.1:{listen}",
                                 "--base-port", str(base), "--for", "60"],
                                cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=reset_signals)  # Ctrl-C works even where make test runs in the background
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (run_dir.parent / f"{run_dir.name}.log").read_text()
            try:
                if http_get("127.0.0.1", listen, "/", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "run did not serve within 60 s"
            time.sleep(0.1)
        answers = [http_get("127.0.0.1", listen, path, timeout=10)
                   for path in ("/", "/api/items", "/assets/hello.txt", "/", "/api/items")]
        assert [a[0] for a in answers] == [200] * 5
        assert answers[0][2] == b"Hello from shop" and json.loads(answers[1][2])[0]["name"] == "teapot"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"run after Ctrl-C: {code}\n" + (run_dir.parent / f"{run_dir.name}.log").read_text() + \
            "".join(f"\n--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-20:])
                    for f in sorted((run_dir / "run" / "logs").glob("*")) if f.is_file())
    finally:
        kill_run(proc)
        (run_dir.parent / f"{run_dir.name}.log").unlink(missing_ok=True)


def test_a_short_compare_of_the_flask_app(installed, flask_app, run_dirs):
    venv, _, work = installed
    out = run_dirs() / "compare"
    proc = tool(venv, "compare", "--app", flask_app.app, "--app-dir", str(flask_app.app_dir), "--virtualenv",
                str(flask_app.venv), "--request", "GET /", "--request", "GET /api/items", "--layouts", "2x2-mapped",
                "--concurrency", "2", "--duration", "2", "--repeats", "1", "--warmup", "1", "--out", str(out),
                cwd=work)
    assert "pre-flight: 2 distinct requests answered 200 through nginx" in proc.stdout
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert len(cells) == 1 and cells[0]["requests"] > 0 and cells[0]["errors"]["total"] == 0
    assert (out / "report.md").is_file()


def test_tune_replay_writes_a_run_md_that_works_from_here(installed, run_dirs, tmp_path):
    venv, _, work = installed
    results, outcome, *_ = fake_run(concurrency="4", p99_ms="400")
    stored = results.save(tmp_path / "stored" / "results.json")
    out = run_dirs() / "tuned"
    shown = tool(venv, "tune", "--replay", str(stored), "--out", str(out), cwd=work).stdout
    assert f"RECOMMENDATION: {outcome.chosen.spec}" in shown
    run_md = (out / "recommended" / "RUN.md").read_text()
    # the serve command names this installation's script (it is not on PATH here)
    assert f"{venv}/bin/uwsgi-layouts run {outcome.chosen.spec}" in run_md
    assert (out / "recommended" / "bundle" / "INSTALL.md").is_file()


def test_bundle_the_flask_app(installed, flask_app):
    venv, _, work = installed
    tool(venv, "bundle", "2x4-mapped", "--out", "bundle", *flask_app.cli_args(), "--server-name",
         "shop.example.com", cwd=work)
    written = {p.relative_to(work / "bundle").as_posix() for p in (work / "bundle").rglob("*") if p.is_file()}
    assert "INSTALL.md" in written and any(name.endswith("shop.conf") or name.endswith(".conf") for name in written)
    assert any(name.endswith(".ini") for name in written) and any(name.endswith(".service") for name in written)
