"""The Jinja environments are made once and shared by every render (deploy/render/templates.py): a
render that changed one (a filter, a global, the loader) would leak into every later render."""

from __future__ import annotations

from tests.test_cli import cli_in_process
from tests.test_container_bundle import make_app
from uwsgi_layouts.deploy.render.templates import environment
from uwsgi_layouts.deploy.ship.files import outdent


def _state(env) -> tuple:
    return dict(env.filters), dict(env.globals), env.loader, env.undefined


def test_renders_and_bundles_leave_the_kept_environments_as_they_were(tmp_path, tmp_run_dir):
    kept = [environment(), environment(outdent=outdent)]  # render's; the bundles' (deb and container)
    before = [_state(env) for env in kept]
    app = make_app(tmp_path)
    deb = ["--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv", "--server-name", "shop.example"]
    for args in (["render", "2x4-mapped", "--out", tmp_run_dir / "render", "--no-nginx-test"],
                 ["bundle", "2x4-mapped", "--app", "shop:app", *deb, "--out", tmp_path / "deb"],
                 ["bundle", "2x4-mapped@cpus=1,memory=512", "--target", "kubernetes", "--app", "shop:app",
                  "--app-dir", app, "--out", tmp_path / "kube"]):
        proc = cli_in_process(*args)
        assert proc.returncode == 0, proc.stderr
    assert [_state(env) for env in kept] == before
    # The same set of filters is the same environment: kept, not made again per render.
    assert environment() is kept[0] and environment(outdent=outdent) is kept[1]
