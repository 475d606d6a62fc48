"""A container bundle's files, rendered and cross-checked before ``--out`` appears::

    image/Containerfile            the build stage, the app image, the nginx sidecar image
    image/uwsgi.ini                uWSGI in the app container (the shared uWSGI partials)
    image/nginx/nginx.conf         the sidecar's main file: paths in /tmp, the probes' server
    image/nginx/site.conf          the site a Debian bundle gets for the layout (its upstream)
    image/nginx/uwsgi_params, mime.types
    image/app/                     a copy of the app's directory (no virtualenv, no VCS, no caches)
    kubernetes/{deployment,service,pdb,hpa}.yaml, compose.yaml     (--target kubernetes)
    kubernetes/networkpolicy.yaml, image/watch/                    (--watch-sidecar: the exporter sidecar)
    README.md

nginx's site comes from the Debian bundle's template with the image's paths, and it is
cross-checked against uwsgi.ini with the lab's ``crosscheck`` (upstream == sockets, the mapping,
0660, the balancer, static aliases), as a Debian bundle is.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from uwsgi_layouts.deploy.render import TEMPLATES_DIR, environment, server_for
from uwsgi_layouts.deploy.ship.bundle import UWSGI_PIN
from uwsgi_layouts.deploy.ship.container.sizing import cpu_quantity, memory_quantity
from uwsgi_layouts.deploy.ship.container.spec import (
    APP_PRESTOP_SECONDS,
    APP_UID,
    APP_USER,
    IMAGE_APP_DIR,
    IMAGE_STATIC_DIR,
    IMAGE_VENV,
    NGINX_CPU_MILLI,
    NGINX_MEMORY,
    NGINX_UID,
    NGINX_USER,
    PRESTOP_SECONDS,
    SOCKET_GID,
    SOCKET_GROUP,
    WATCH_BASE_IMAGE,
    WATCH_CPU_MILLI,
    WATCH_LOG_DIR,
    WATCH_LOG_SOCKET,
    WATCH_MEMORY,
    WATCH_UID,
    WATCH_USER,
    ContainerBundle,
)
from uwsgi_layouts.deploy.ship.files import (
    check_out_dir,
    crosscheck_site,
    outdent,
    raise_if_problems,
    site_checks,
    staged,
    write_texts,
)

READY_PATH = "/_uwsgi-layouts/ready"
# The variable nginx's probe server passes to uWSGI, whose readiness route answers only it.
PROBE_VAR = "UL_READINESS_PROBE"
LIVE_PATH = "/_uwsgi-layouts/live"
STATS_DIR = "/run/uwsgi-stats"
# Not copied into the image: virtualenvs of this machine (another Python, other paths), version
# control, caches and the bundle's own output, should it sit inside the app's directory.
SKIPPED_NAMES = ("venv", ".venv", ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox",
                 "node_modules", "*.pyc")
# nginx workers in the sidecar: its CPU limit is a fraction of one CPU.
SIDECAR_NGINX_WORKERS = 1

IMAGE_TEMPLATES = {
    "image/Containerfile": "container/Containerfile.j2",
    "image/uwsgi.ini": "container/uwsgi.ini.j2",
    "image/nginx/nginx.conf": "container/nginx.conf.j2",
    "image/nginx/site.conf": "bundle/site.conf.j2",
    "README.md": "container/README.md.j2",
}
KUBERNETES_TEMPLATES = {
    "kubernetes/deployment.yaml": "container/kubernetes/deployment.yaml.j2",
    "kubernetes/service.yaml": "container/kubernetes/service.yaml.j2",
    "kubernetes/pdb.yaml": "container/kubernetes/pdb.yaml.j2",
    "kubernetes/hpa.yaml": "container/kubernetes/hpa.yaml.j2",
    "compose.yaml": "container/compose.yaml.j2",
}
WATCH_TEMPLATES = {"kubernetes/networkpolicy.yaml": "container/kubernetes/networkpolicy.yaml.j2"}
# The exporter image's virtualenv; uwsgi-layouts' package goes into its src/.
WATCH_VENV = "/opt/uwsgi-layouts"
PACKAGE_DIR = TEMPLATES_DIR.parent  # uwsgi_layouts/, copied into the exporter's build context
# What `uwsgi-layouts watch` imports beyond the standard library (tests/test_container_bundle.py
# checks this against a fresh interpreter), pinned to the versions installed here.
WATCH_DISTRIBUTIONS = ("prometheus_client", "psutil", "Jinja2", "MarkupSafe", "crossplane")
COPIED = {"image/nginx/uwsgi_params": "uwsgi_params", "image/nginx/mime.types": "mime.types"}


def origin(cb: ContainerBundle) -> list[str]:
    """What the files came from, for their header: the options, and for Kubernetes the
    measurement (or none) behind the resources and behind the replicas and autoscaler."""
    given = f"options `{' '.join(cb.options)}`" if cb.options else "no options"
    lines = [f"From: {given}; Python {cb.python} ({cb.python_from})."]
    if cb.limits:
        lines += [f"Resources (app container: {cb.limits.cpu} CPU, memory request {cb.limits.memory_request_text}, "
                  f"limit {cb.limits.memory_text}): {cb.limits.resources_from}.",
                  f"Replicas ({cb.limits.replicas}-{cb.limits.max_replicas}, CPU target {cb.limits.cpu_target}%): "
                  f"{cb.limits.scaling_from}."]
    return lines


def render_container_bundle(cb: ContainerBundle) -> dict[str, str]:
    """Bundle-relative path -> text of every generated file (the app's copy aside)."""
    env = environment(outdent=outdent)
    context = {
        "cb": cb, "bundle": cb.bundle, "layout": cb.bundle, "server": server_for(cb.bundle.layout),
        "unix_mode": "660", "origin_lines": origin(cb), "limits": cb.limits, "prestop": PRESTOP_SECONDS,
        "app_prestop": APP_PRESTOP_SECONDS,
        "app_dir": IMAGE_APP_DIR, "venv": IMAGE_VENV, "static_dir": IMAGE_STATIC_DIR, "uwsgi_pin": UWSGI_PIN,
        "app_uid": APP_UID, "nginx_uid": NGINX_UID, "socket_gid": SOCKET_GID, "app_user": APP_USER,
        "nginx_user": NGINX_USER, "socket_group": SOCKET_GROUP, "ready_path": READY_PATH, "live_path": LIVE_PATH,
        "probe_var": PROBE_VAR,
        "stats_dir": STATS_DIR, "stats_socket": f"{STATS_DIR}/stats.sock", "nginx_workers": SIDECAR_NGINX_WORKERS,
        "nginx_cpu": cpu_quantity(NGINX_CPU_MILLI), "nginx_memory": memory_quantity(NGINX_MEMORY),
        "nginx_cpu_milli": NGINX_CPU_MILLI, "nginx_memory_bytes": NGINX_MEMORY,
        "socket_dir_setup": f"mkdir -p {cb.socket_dir} && chown {APP_UID}:{SOCKET_GID} {cb.socket_dir} "
                            f"&& chmod 0750 {cb.socket_dir}",
        # With the exporter, its group may pass into the stats directory (the socket is 0660).
        "stats_dir_setup": f"mkdir -p {STATS_DIR} && chown {APP_UID}:{SOCKET_GID} {STATS_DIR} && chmod "
                           f"{'0750' if cb.watch else '0700'} {STATS_DIR}",
        "log_dir_setup": f"mkdir -p {WATCH_LOG_DIR} && chown {WATCH_UID}:{SOCKET_GID} {WATCH_LOG_DIR} "
                         f"&& chmod 0750 {WATCH_LOG_DIR}",
        "extra_access_log": f"syslog:server=unix:{WATCH_LOG_SOCKET},nohostname" if cb.watch else "",
        "watch_uid": WATCH_UID, "watch_base_image": WATCH_BASE_IMAGE,
        "watch_user": WATCH_USER, "watch_venv": WATCH_VENV, "watch_log_dir": WATCH_LOG_DIR,
        "watch_cpu": cpu_quantity(WATCH_CPU_MILLI), "watch_memory": memory_quantity(WATCH_MEMORY),
        "watch_args": watch_args(cb) if cb.watch else [],
    }
    templates = dict(IMAGE_TEMPLATES, **(KUBERNETES_TEMPLATES if cb.target == "kubernetes" else {}),
                     **(WATCH_TEMPLATES if cb.watch else {}))
    texts = {path: env.get_template(template).render(context) for path, template in templates.items()}
    if cb.watch:
        texts["image/watch/requirements.txt"] = watch_requirements()
    return texts


def watch_args(cb: ContainerBundle) -> list[str]:
    """The exporter's command line in the pod: the stats socket, the log socket, the listen address
    (beyond loopback only with the option named for that risk: Prometheus scrapes pod IPs)."""
    args = ["--stats", f"{STATS_DIR}/stats.sock", "--access-log-socket", WATCH_LOG_SOCKET, "--listen", cb.watch.listen]
    return args if cb.watch.pod_local else [*args, "--allow-public-listen"]


def watch_requirements() -> str:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WATCH_DISTRIBUTIONS]
    return "# What `uwsgi-layouts watch` imports, at the versions of the machine that wrote this bundle.\n" + \
        "\n".join(pins) + "\n"


def check_container_bundle(cb: ContainerBundle, staging: Path) -> list[str]:
    """The sidecar's site against uwsgi.ini, as a Debian bundle's (deploy/ship/files.py)."""
    site, ini = staging / "image/nginx/site.conf", staging / "image/uwsgi.ini"
    problems = crosscheck_site(cb.bundle, site, {"": ini})
    if not (problems and problems[0].startswith("the site does not parse")):
        problems += site_checks(cb.bundle, site)
    return problems


def write_container_bundle(cb: ContainerBundle, out_dir: Path | str) -> list[str]:
    """Render, copy the app, check, and move everything into ``out_dir`` (new or empty). Returns
    the generated files. Nothing appears in ``out_dir`` unless every check passed."""
    out = Path(out_dir).absolute()
    check_out_dir(out)
    texts = render_container_bundle(cb)  # pure: fails before anything is written
    with staged(out) as staging:
        write_texts(staging, texts)
        for rel, source in COPIED.items():
            shutil.copy(TEMPLATES_DIR / source, staging / rel)
        shutil.copytree(cb.source_dir, staging / "image/app", symlinks=True,
                        ignore=_skipping(cb.source_dir, staging, out))
        if cb.watch:
            shutil.copytree(PACKAGE_DIR, staging / "image/watch/uwsgi_layouts",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        raise_if_problems(check_container_bundle(cb, staging))
    return sorted(texts)


def _skipping(source: Path, *ours: Path):
    """shutil.copytree's ignore: SKIPPED_NAMES, and our own staging and output directories
    should they sit inside the app's directory."""
    patterns = shutil.ignore_patterns(*SKIPPED_NAMES)

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(patterns(directory, names))
        skipped |= {n for n in names if Path(directory, n).absolute() in ours or n.startswith(f".{ours[-1].name}.")}
        return skipped

    return ignore
