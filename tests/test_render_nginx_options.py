"""nginx-side layout options render the right directives, in the right context, and pass
`nginx -t` (renders and runs `nginx -t`; starts no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import default_cpus
from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.deploy.render import crosscheck, find_directives, parse_nginx, write_layout


def context_of(parsed, name, path=()):
    """(context path, args) of every directive ``name``: ("events",), ("http", "server"), ..."""
    found = []
    for d in parsed:
        if d["directive"] == name:
            found.append((path, d["args"]))
        found.extend(context_of(d.get("block", []), name, path + (d["directive"],)))
    return found


@pytest.fixture
def dataset(run_dirs):
    from uwsgi_layouts.bench.dataset import make_dataset

    root = run_dirs()
    root.chmod(0o755)  # nginx workers (www-data under root) read the files
    make_dataset(root / "ds", small_count=20, large_count=1, large_size=50_000)
    (root / "ds").chmod(0o755)
    return root / "ds"


def render(make_layout, **opts):
    layout = make_layout("2x4-mapped", **opts)
    out = write_layout(layout, layout.run_dir).out_dir  # runs the cross-checks and nginx -t
    return layout, parse_nginx(out / "nginx.conf"), (out / "uwsgi.ini").read_text()


def test_defaults_add_no_tuning(make_layout):
    _, parsed, _ = render(make_layout)
    for name in ("sendfile", "aio", "thread_pool", "accept_mutex", "multi_accept", "sendfile_max_chunk"):
        assert context_of(parsed, name) == [], name
    assert all("reuseport" not in args for _, args in context_of(parsed, "listen"))


def test_every_option_lands_in_its_context(make_layout, dataset):
    layout, parsed, ini = render(
        make_layout, nginx_workers="auto", reuseport=True, accept_mutex=True, multi_accept=True, sendfile=True,
        sendfile_max_chunk="512k", aio="threads", aio_threads=8, aio_max_queue=1000, data_dir=str(dataset))
    # auto is rendered as this process's usable CPUs (nginx's own auto ignores a cgroup quota)
    assert context_of(parsed, "worker_processes") == [((), [str(default_cpus())])]
    assert context_of(parsed, "thread_pool") == [((), ["ul_pool", "threads=8", "max_queue=1000"])]
    assert context_of(parsed, "accept_mutex") == [(("events",), ["on"])]
    assert context_of(parsed, "multi_accept") == [(("events",), ["on"])]
    assert context_of(parsed, "sendfile") == [(("http",), ["on"])]
    assert context_of(parsed, "sendfile_max_chunk") == [(("http",), ["512k"])]
    assert context_of(parsed, "aio") == [(("http",), ["threads=ul_pool"])]
    assert context_of(parsed, "listen") == [(("http", "server"), [layout.listen, "reuseport"])]
    # worker_processes auto: balancing counts must be shared
    assert context_of(parsed, "zone")
    locations = {tuple(d["args"]): d for d in find_directives(parsed, "location")}
    internal = locations[("/_internal_files/",)]
    assert [d["directive"] for d in internal["block"]] == ["internal", "alias"]
    assert internal["block"][1]["args"] == [f"{dataset}/files/"]
    assert locations[("/static/",)]["block"][0]["args"] == [f"{dataset}/files/"]
    assert f"env = UL_DATA_DIR={dataset}" in ini.splitlines()


def test_crosscheck_flags_an_internal_location_made_public(make_layout, dataset):
    layout, _, _ = render(make_layout, data_dir=str(dataset))
    conf = f"{layout.run_dir}/nginx.conf"
    text = open(conf).read()
    open(conf, "w").write(text.replace("            internal;\n", ""))
    assert any("internal" in p for p in crosscheck(layout, Path(layout.run_dir)))


@pytest.mark.parametrize("opts,field", [
    ({"aio": "sometimes"}, "aio"),
    ({"aio_threads": 0}, "aio_threads"),
    ({"aio_max_queue": -1}, "aio_max_queue"),
    ({"sendfile_max_chunk": "lots"}, "sendfile_max_chunk"),
    ({"sendfile": "maybe"}, "sendfile"),
    ({"reuseport": "2"}, "reuseport"),
    ({"nginx_workers": "many"}, "nginx_workers"),
    ({"data_dir": "/nonexistent/ds"}, "data_dir"),
])
def test_bad_values_name_the_field(make_layout, opts, field):
    with pytest.raises(LayoutError) as info:
        make_layout("2x4-mapped", **opts)
    assert info.value.field == field
