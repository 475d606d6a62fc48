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

TARGETS = ("debian", "container", "kubernetes")
# Where the app, its virtualenv and the static files live inside the images.
IMAGE_APP_DIR = "/srv/app"
IMAGE_VENV = "/opt/venv"
IMAGE_STATIC_DIR = "/srv/static"
# Numeric ids, so that Kubernetes can check runAsNonRoot without reading the image's /etc/passwd.
SOCKET_GID = 10000
APP_UID = 10001
NGINX_UID = 10002
APP_USER, SOCKET_GROUP, NGINX_USER = "app", "sockets", "nginx-sidecar"
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
# A floor, not a measurement: an interpreter with uWSGI and a small app (Flask) takes about this
# much resident memory per process; --memory below (P + 1) of these cannot hold P workers and the master.
MIN_PROCESS_MEMORY = 24 * 2**20
DEFAULT_REPLICAS = 2
DEFAULT_MAX_REPLICAS = 4
DEFAULT_CPU_TARGET = 70  # per cent of the CPU request, the HorizontalPodAutoscaler's target

# distribution/reference's grammar (the one docker and podman parse), with a tag required:
# we build the image and name it, so it needs a tag; a digest is only known after the build.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]+)?"
IMAGE_RE = re.compile(rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
                      r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
CPU_RE = re.compile(r"^(?:(?P<milli>[1-9][0-9]{0,6})m|(?P<cores>[0-9]{1,3}(?:\.[0-9]{1,3})?))$")
MEMORY_RE = re.compile(r"^(?P<number>[1-9][0-9]{0,6})(?P<unit>Ki|Mi|Gi|Ti|k|M|G|T)?$")
MEMORY_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
                "T": 10**12}
PYTHON_RE = re.compile(r"^3\.[0-9]{1,2}$")
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


def sidecar_image(image: str) -> str:
    """The nginx image beside the app's: NAME-nginx with the same registry and tag."""
    name, _, tag = image.rpartition(":")
    return f"{name}-nginx:{tag}"


def parse_cpus(raw) -> int:
    """A Kubernetes CPU quantity (``2``, ``1.5``, ``750m``) in millicores, at least 100m."""
    text = str(raw).strip()
    match = CPU_RE.match(text)
    milli = (int(match["milli"]) if match["milli"] else round(float(match["cores"]) * 1000)) if match else 0
    if not 100 <= milli <= 256_000:
        raise LayoutError("cpus", f"expected a CPU limit such as 2, 1.5 or 750m (100m to 256), got {text!r}")
    return milli


def parse_memory(raw) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``1Gi``, ``800M``) in bytes."""
    text = str(raw).strip()
    match = MEMORY_RE.match(text)
    if not match:
        raise LayoutError("memory", f"expected a memory limit such as 512Mi, 1Gi or 800M, got {text!r}")
    return int(match["number"]) * MEMORY_UNITS[match["unit"]]


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(size: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if size % MEMORY_UNITS[unit] == 0:
            return f"{size // MEMORY_UNITS[unit]}{unit}"
    return str(size)


def _whole(field_name: str, raw, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise LayoutError(field_name, f"expected a whole number in {low}..{high}, got {text!r}")
    return int(text)


def _port(field_name: str, raw, default: int) -> int:
    return _whole(field_name, raw, default, 1024, 65535)  # nginx runs as a user: no port below 1024


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
class Limits:
    """The app container's resources and the pod count (Kubernetes): requests equal limits, so
    the pod gets the CPUs the layout was measured with (Guaranteed QoS), never more workers."""

    cpu_milli: int
    memory: int
    replicas: int = DEFAULT_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    cpu_target: int = DEFAULT_CPU_TARGET

    def __post_init__(self):
        if not 1 <= self.replicas <= self.max_replicas:
            raise LayoutError("max_replicas", f"must be at least --replicas ({self.replicas}), got {self.max_replicas}")

    @property
    def cpu(self) -> str:
        return cpu_quantity(self.cpu_milli)

    @property
    def memory_text(self) -> str:
        return memory_quantity(self.memory)


@dataclass(frozen=True)
class ContainerBundle:
    bundle: Bundle  # the layout with the image's paths: what the shared nginx/uWSGI templates read
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
    # --env: set by the Deployment and compose.yaml, never baked into the image (it may hold secrets).
    env: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()  # the command line's options, for the generated header

    def __post_init__(self):
        if self.target not in TARGETS[1:]:
            raise LayoutError("target", f"expected one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.target == "kubernetes" and self.limits is None:
            raise LayoutError("cpus", "a kubernetes bundle needs --cpus and --memory: the limits the layout was "
                                      "measured at")
        if self.http_port == self.probe_port:
            raise LayoutError("probe_port", f"{self.probe_port} is also the HTTP port")

    name = property(lambda self: self.bundle.name)
    layout = property(lambda self: self.bundle.layout)
    nginx_image = property(lambda self: sidecar_image(self.image))
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
                           probe_port=None, stop_grace=None, options=(), **layout_options) -> ContainerBundle:
    """A validated ContainerBundle, or LayoutError naming the option."""
    if target not in TARGETS[1:]:
        raise LayoutError("target", f"expected one of {', '.join(TARGETS)}, got {target!r}")
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
        spec, app=app, app_dir=IMAGE_APP_DIR, virtualenv=IMAGE_VENV, name=name, user=APP_USER, group=SOCKET_GROUP,
        nginx_group=SOCKET_GROUP, static=tuple(f"{p}={IMAGE_STATIC_DIR}{p}" for p, _ in statics),
        listen=(port_text,), stop_grace=stop_grace, **layout_options)
    if bundle.transport != "unix":  # a variant of the spec (@transport=tcp) as well as --transport
        raise LayoutError("transport", UNIX_ONLY)
    http_port = int(bundle.listen[0].rpartition(":")[2])
    if http_port < 1024:
        raise LayoutError("listen", f"port {http_port}: nginx runs as a user in the sidecar, so 1024 or above")
    limits = None
    if target == "kubernetes" and (cpus is not None or memory is not None):
        if cpus is None or memory is None:
            raise LayoutError("cpus" if cpus is None else "memory", "give both --cpus and --memory")
        size = parse_memory(memory)
        floor = (bundle.processes + 1) * MIN_PROCESS_MEMORY
        if size < floor:
            raise LayoutError("memory", f"{memory} cannot hold {bundle.processes} workers and the master: at least "
                                        f"{memory_quantity(floor)} ({memory_quantity(MIN_PROCESS_MEMORY)} per process)")
        count = _whole("replicas", replicas, DEFAULT_REPLICAS, 1, 1000)
        limits = Limits(cpu_milli=parse_cpus(cpus), memory=size, replicas=count,
                        max_replicas=_whole("max_replicas", max_replicas, max(count, DEFAULT_MAX_REPLICAS), 1, 1000),
                        cpu_target=_whole("cpu_target", cpu_target, DEFAULT_CPU_TARGET, 10, 100))
    default_image = f"localhost/{bundle.name}:latest"
    return ContainerBundle(
        bundle=bundle, target=target, source_dir=source, requirements=requirements, python=version,
        python_from=version_from, image=image_reference("image", image or default_image, need_tag=True),
        base_image=image_reference("base_image", base_image or f"docker.io/library/python:{version}-slim-bookworm",
                                   need_tag=False),
        nginx_base_image=image_reference("nginx_base_image", nginx_base_image or DEFAULT_NGINX_IMAGE, need_tag=False),
        static_sources=tuple(statics), http_port=http_port, http_address=bundle.listen[0],
        probe_port=_port("probe_port", probe_port, DEFAULT_PROBE_PORT), limits=limits, env=parse_env(env or ()),
        options=tuple(options),
    )
