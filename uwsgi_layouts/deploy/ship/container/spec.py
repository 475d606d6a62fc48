"""What a container bundle is made of: the layout (as a ``Bundle`` whose paths are the image's),
the app's directory on this machine (copied into the build context), its requirements, the
images and, for Kubernetes, the limits and replicas. Validated on creation: a bad value is a
``LayoutError`` naming its option, before anything is written.

Inside the images every path is fixed (the app in /srv/app, its virtualenv in /opt/venv, the
sockets in /run/NAME, an emptyDir both containers mount), and so are the accounts: uWSGI runs as
uid 10001, nginx as 10002, both with the group 10000 that owns the sockets (mode 0660): only
these two containers of the pod can connect.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError, parse_env, parse_static
from uwsgi_layouts.deploy.ship.bundle import Bundle, build_bundle
from uwsgi_layouts.deploy.ship.container.measured import capacity_plan, tune_pod
from uwsgi_layouts.deploy.ship.container.sizing import (
    Limits,
    limits_for,
    pod_variant,
    whole,
)

TARGETS = ("debian", "container", "kubernetes")
# Where the app, its virtualenv and the static files live inside the images.
IMAGE_APP_DIR = "/srv/app"
IMAGE_VENV = "/opt/venv"
IMAGE_STATIC_DIR = "/srv/static"
# Numeric ids, so that Kubernetes can check runAsNonRoot without reading the image's /etc/passwd.
SOCKET_GID = 10000
APP_UID = 10001
NGINX_UID = 10002
WATCH_UID = 10003
APP_USER, SOCKET_GROUP, NGINX_USER, WATCH_USER = "app", "sockets", "nginx-sidecar", "watch"
# The files the build installs the app's dependencies from, the lock first (pip's requirements
# format: pip-compile, `uv pip compile`, `pip freeze`).
REQUIREMENTS_FILES = ("requirements.lock", "requirements.txt")
DEFAULT_NGINX_IMAGE = "docker.io/library/nginx:1.28-bookworm"
DEFAULT_HTTP_PORT = 8080
DEFAULT_PROBE_PORT = 8081
# Kubernetes removes a pod from the Service's endpoints while it stops it: nginx first pauses
# this long (preStop), so the last requests routed to the pod still find it serving.
PRESTOP_SECONDS = 5
# uWSGI pauses longer: nginx must stop accepting (SIGQUIT) before uWSGI closes its sockets
# (SIGTERM, shutdown-sockets), or a request nginx took in between finds every socket closed (502:
# seen in tests/integration/test_bundle_kubernetes.py when both stopped at once).
APP_PRESTOP_SECONDS = PRESTOP_SECONDS + 2
# The sidecar's own resources: nginx in front of one pod's sockets needs little.
NGINX_CPU_MILLI = 250
NGINX_MEMORY = 64 * 2**20

# distribution/reference's grammar (the one docker and podman parse), with a tag required:
# we build the image and name it, so it needs a tag; a digest is only known after the build.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]+)?"
IMAGE_RE = re.compile(rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
                      r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
PYTHON_RE = re.compile(r"^3\.[0-9]{1,2}$")
# The exporter sidecar (--watch-sidecar): its metrics port on the pod's interfaces (Prometheus scrapes pod
# IPs; a NetworkPolicy admits only the monitoring namespace), nginx's timed log as datagrams on a
# unix socket in a volume of nginx and the exporter alone (nothing on disk grows).
DEFAULT_WATCH_LISTEN = "0.0.0.0:9717"
DEFAULT_METRICS_NAMESPACE = "monitoring"
WATCH_LOG_DIR = "/run/uwsgi-layouts-log"
WATCH_LOG_SOCKET = f"{WATCH_LOG_DIR}/access.sock"
# The exporter's image runs the Python of the machine that wrote the bundle: its libraries are
# pinned to the versions installed there (which may not install on the app's older Python).
WATCH_BASE_IMAGE = f"docker.io/library/python:{sys.version_info[0]}.{sys.version_info[1]}-slim-bookworm"
WATCH_CPU_MILLI = 100
WATCH_MEMORY = 96 * 2**20
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
IPV4_LISTEN_RE = re.compile(r"^(?P<host>(?:[0-9]{1,3}\.){3}[0-9]{1,3}):(?P<port>[0-9]{1,5})$")
UNIX_ONLY = ("the nginx sidecar reaches uWSGI over unix sockets in a volume the pod's two containers share (mode "
             "0660): tcp would let every container of the pod, and with host networking the node, connect")


def image_reference(field_name: str, raw: str, need_tag: bool) -> str:
    """A valid image reference (``registry/name:tag``); ``need_tag``: an image we build and name."""
    text = str(raw).strip()
    match = IMAGE_RE.match(text) if len(text) <= 255 else None
    if not match or (need_tag and (not match["tag"] or match["digest"])):
        shape = "REGISTRY/NAME:TAG such as registry.example.com/shop:1.4 (lowercase name, a tag, no digest)" \
            if need_tag else "[REGISTRY/]NAME[:TAG][@sha256:DIGEST] such as docker.io/library/python:3.11-slim"
        raise LayoutError(field_name, f"{text!r} is not a valid image reference: expected {shape}")
    return text


def sidecar_image(image: str, role: str = "nginx") -> str:
    """A sidecar's image beside the app's: NAME-ROLE with the same registry and tag."""
    name, _, tag = image.rpartition(":")
    return f"{name}-{role}:{tag}"


@dataclass(frozen=True)
class WatchSidecar:
    """``--watch-sidecar``: ``uwsgi-layouts watch`` in the pod, reading the stats socket and nginx's timed
    log, serving /metrics on ``host:port``."""

    host: str
    port: int
    metrics_namespace: str = DEFAULT_METRICS_NAMESPACE

    def __post_init__(self):
        if not NAMESPACE_RE.match(self.metrics_namespace):
            raise LayoutError("metrics_namespace", f"expected a Kubernetes namespace name (lowercase letters, digits, "
                                                   f"'-'), got {self.metrics_namespace!r}")

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pod_local(self) -> bool:
        """Only the pod's own containers reach it (no scrape from outside the pod)."""
        return self.host.startswith("127.")


def watch_sidecar(listen, metrics_namespace, http_port: int, probe_port: int) -> WatchSidecar:
    text = str(listen or DEFAULT_WATCH_LISTEN).strip()
    match = IPV4_LISTEN_RE.match(text)
    if not match or any(int(octet) > 255 for octet in match["host"].split(".")):
        raise LayoutError("watch_listen", f"expected IPV4:PORT such as {DEFAULT_WATCH_LISTEN} (the pod's interfaces, "
                                          f"for Prometheus) or 127.0.0.1:9717 (the pod alone), got {text!r}")
    port = whole("watch_listen", match["port"], 0, 1024, 65535)
    if port in (http_port, probe_port):
        raise LayoutError("watch_listen", f"port {port} is nginx's in the same pod")
    return WatchSidecar(match["host"], port, str(metrics_namespace or DEFAULT_METRICS_NAMESPACE).strip())


def _port(field_name: str, raw, default: int) -> int:
    return whole(field_name, raw, default, 1024, 65535)  # nginx runs as a user: no port below 1024


def requirements_file(app_dir: Path) -> str:
    """The name of the app's lock or requirements file, the lock first."""
    for name in REQUIREMENTS_FILES:
        if (app_dir / name).is_file():
            return name
    raise LayoutError("app_dir", f"{app_dir} has no {' or '.join(REQUIREMENTS_FILES)}: the image installs the app's "
                                 "dependencies from one (pip freeze > requirements.txt, or pip-compile)")


def python_version(raw, app_dir: Path, virtualenv) -> tuple[str, str]:
    """(major.minor, where it came from): --python, else the virtualenv's pyvenv.cfg (--virtualenv,
    or venv/.venv in the app's directory), else .python-version, else the Python running this tool."""
    if raw is not None:
        text = str(raw).strip()
        if not PYTHON_RE.match(text):
            raise LayoutError("python", f"expected a Python major.minor such as 3.11, got {text!r}")
        return text, "--python"
    venvs = [Path(virtualenv)] if virtualenv else [app_dir / "venv", app_dir / ".venv"]
    for venv in venvs:
        cfg = venv / "pyvenv.cfg"
        if cfg.is_file():
            found = re.search(r"^version(?:_info)?\s*=\s*(3\.[0-9]+)", cfg.read_text(errors="replace"), re.MULTILINE)
            if found:
                return found[1], f"{cfg}"
    pinned = app_dir / ".python-version"
    if pinned.is_file():
        found = re.match(r"^\s*(3\.[0-9]+)", pinned.read_text(errors="replace"))
        if found:
            return found[1], f"{pinned}"
    return f"{sys.version_info[0]}.{sys.version_info[1]}", "the Python running uwsgi-layouts"


@dataclass(frozen=True)
class ContainerBundle:
    bundle: Bundle  # the layout with the image's paths: what the shared nginx/uWSGI templates read
    spec: str  # the layout as given, its pod variants (@cpus...) included: the generated headers name it
    target: str  # "container" (the build context) or "kubernetes" (that, the manifests and compose.yaml)
    source_dir: Path  # the app's directory on this machine, copied into the build context
    requirements: str  # its lock or requirements file (a name in source_dir)
    python: str  # major.minor of the default base image
    python_from: str  # where that came from (the generated header says)
    image: str
    base_image: str
    nginx_base_image: str
    static_sources: tuple[tuple[str, str], ...]  # (prefix, directory relative to source_dir)
    http_port: int = DEFAULT_HTTP_PORT
    probe_port: int = DEFAULT_PROBE_PORT
    http_address: str = ""  # nginx's listen: the port, or IPV4:PORT (podman's host network in the tests)
    limits: Limits | None = None
    watch: WatchSidecar | None = None
    # --env: set by the Deployment and compose.yaml, never baked into the image (it may hold secrets).
    env: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()  # the command line's options, for the generated header

    def __post_init__(self):
        if self.target not in TARGETS[1:]:
            raise LayoutError("target", f"expected one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.target == "kubernetes" and self.limits is None:
            raise LayoutError("cpus", "a kubernetes bundle needs the pod's size, the limits the layout was measured "
                                      "at: the layout's @cpus and @memory (2x4-mapped@cpus=1,memory=300), --from-tune "
                                      "DIR, or --cpus and --memory")
        if self.watch is not None and self.target != "kubernetes":
            raise LayoutError("watch_sidecar", "the exporter sidecar is part of the pod: --target kubernetes")
        if self.http_port == self.probe_port:
            raise LayoutError("probe_port", f"{self.probe_port} is also the HTTP port")

    name = property(lambda self: self.bundle.name)
    layout = property(lambda self: self.bundle.layout)
    nginx_image = property(lambda self: sidecar_image(self.image))
    watch_image = property(lambda self: sidecar_image(self.image, "watch"))
    socket_dir = property(lambda self: self.bundle.run_dir)

    @property
    def stop_grace(self) -> int:
        return self.bundle.stop_grace

    @property
    def termination_grace(self) -> int:
        """uWSGI's pause, then the requests in flight (the grace), then 5 s for the processes to exit."""
        return APP_PRESTOP_SECONDS + self.stop_grace + 5

    @property
    def listen(self) -> str:
        return self.http_address or str(self.http_port)


def build_container_bundle(spec: str, *, target: str, app=None, app_dir=None, virtualenv=None, env=None,
                           static=None, name=None, image=None, base_image=None, nginx_base_image=None, python=None,
                           cpus=None, memory=None, replicas=None, max_replicas=None, cpu_target=None, listen=None,
                           probe_port=None, stop_grace=None, from_tune=None, plan=None, watch=False, watch_listen=None,
                           metrics_namespace=None, options=(), **layout_options) -> ContainerBundle:
    """A validated ContainerBundle, or LayoutError naming the option."""
    if target not in TARGETS[1:]:
        raise LayoutError("target", f"expected one of {', '.join(TARGETS)}, got {target!r}")
    sized = dict(cpus=cpus, memory=memory, replicas=replicas, max_replicas=max_replicas, cpu_target=cpu_target,
                 from_tune=from_tune, plan=plan, watch_listen=watch_listen, metrics_namespace=metrics_namespace)
    if target != "kubernetes":
        given = next((k for k, v in sized.items() if v is not None), "watch_sidecar" if watch else None)
        if given:
            raise LayoutError(given, "is for --target kubernetes (the pod's size, count and sidecars)")
    if not watch and (watch_listen is not None or metrics_namespace is not None):
        raise LayoutError("watch_listen" if watch_listen is not None else "metrics_namespace",
                          "goes with --watch-sidecar here (--watch is a Debian bundle's exporter unit)")
    variant = pod_variant(spec)
    if layout_options.get("transport") not in (None, "unix"):
        raise LayoutError("transport", UNIX_ONLY)
    if layout_options.get("hosts"):
        raise LayoutError("hosts", "a container bundle runs one layout per pod; replicas spread it over nodes")
    if not app_dir:
        raise LayoutError("app_dir", "a container bundle copies the app into the image: give --app-dir (this machine)")
    source = Path(app_dir).absolute()
    if not source.is_dir():
        raise LayoutError("app_dir", f"{source} is not a directory on this machine")
    requirements = requirements_file(source)
    version, version_from = python_version(python, source, virtualenv)
    statics = []
    for prefix, directory in parse_static(static or ()):
        resolved = Path(directory).resolve()
        if not resolved.is_relative_to(source.resolve()):
            raise LayoutError("static", f"{directory} (for {prefix}/) is outside --app-dir {source}: the build "
                                        "context holds the app's directory only")
        statics.append((prefix, str(resolved.relative_to(source.resolve()))))
    port_text = str(listen[0] if isinstance(listen, (list, tuple)) and listen else listen or DEFAULT_HTTP_PORT)
    bundle = build_bundle(
        variant.shape, app=app, app_dir=IMAGE_APP_DIR, virtualenv=IMAGE_VENV, name=name, user=APP_USER,
        group=SOCKET_GROUP, nginx_group=SOCKET_GROUP, static=tuple(f"{p}={IMAGE_STATIC_DIR}{p}" for p, _ in statics),
        listen=(port_text,), stop_grace=stop_grace, **layout_options)
    if bundle.transport != "unix":  # a variant of the spec (@transport=tcp) as well as --transport
        raise LayoutError("transport", UNIX_ONLY)
    http_port = int(bundle.listen[0].rpartition(":")[2])
    if http_port < 1024:
        raise LayoutError("listen", f"port {http_port}: nginx runs as a user in the sidecar, so 1024 or above")
    limits = None
    if target == "kubernetes":
        limits = limits_for(variant, bundle.processes, cpus=cpus, memory=memory, replicas=replicas,
                            max_replicas=max_replicas, cpu_target=cpu_target,
                            tune=tune_pod(from_tune) if from_tune is not None else None,
                            plan=capacity_plan(plan) if plan is not None else None)
    probe = _port("probe_port", probe_port, DEFAULT_PROBE_PORT)
    default_image = f"localhost/{bundle.name}:latest"
    return ContainerBundle(
        bundle=bundle, spec=str(spec).strip(), target=target, source_dir=source, requirements=requirements,
        python=version, python_from=version_from, image=image_reference("image", image or default_image, need_tag=True),
        base_image=image_reference("base_image", base_image or f"docker.io/library/python:{version}-slim-bookworm",
                                   need_tag=False),
        nginx_base_image=image_reference("nginx_base_image", nginx_base_image or DEFAULT_NGINX_IMAGE, need_tag=False),
        static_sources=tuple(statics), http_port=http_port, http_address=bundle.listen[0],
        probe_port=probe, limits=limits, env=parse_env(env or ()), options=tuple(options),
        watch=watch_sidecar(watch_listen, metrics_namespace, http_port, probe) if watch else None,
    )
