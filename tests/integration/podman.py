"""Podman for the tests, on configuration and storage of their own.

Debian 12's podman 4.3 runs here only with runc and cgroupfs (crun refuses this machine's hybrid
cgroups) and with ulimits within the machine's hard limits: that goes into a containers.conf of
our own (``CONTAINERS_CONF``), never into /etc/containers. Its storage (graphroot, runroot) and
its temporary and network directories live in a session directory of this test process under
``ROOT/sessions`` (``CONTAINERS_STORAGE_CONF``), so that the tests neither see nor change the
machine's containers and images, and everything they start goes with that directory.

No registry is reachable: base images are made from Debian's packages with mmdebstrap. The
tarball is what is cached across runs (``ROOT/base-images``, named by a key of its packages and
the machine's apt sources), and it is imported once into a read-only image store of its own
(``ROOT/base-stores/KIND-KEY``, complete once ``KIND-KEY.done`` names the very tarball it was
imported from; a tarball made again means a new import), which every session lists
as an additional image store: nothing is imported per session (two imports of 190 and 230 MB took
75 s on a busy machine), and the images a session builds, their layers included, stay in its own
storage. A per-session storage rules out podman's layer cache across runs (built images are
removed at the end anyway); within a session, a second build reuses the layers of the first.

A session whose test process died (SIGKILL) is removed by the next one, which says so.

The one path outside the session that podman still writes: /var/lib/containers/cache (as root,
containers/image keeps its blob-digest cache there; no configuration file moves it).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import resource
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path("/var/tmp/uwsgi-layouts-podman")
CACHE = ROOT / "base-images"
STORES = ROOT / "base-stores"  # read-only image stores holding one base image each
SESSIONS = ROOT / "sessions"
SUITE = "bookworm"
# What each base image holds: the python one mimics the official python:slim (headers aside,
# which the build stage installs), libpython included; the nginx one the sidecar's nginx.
BASES = {
    "python": ("python3", "python3-venv", "ca-certificates", "libpython3.11"),
    "nginx": ("nginx-light", "ca-certificates"),
}
APT_SOURCES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")
MMDEBSTRAP_TIMEOUT = 600
BUILD_TIMEOUT = 900


class PodmanUnavailable(RuntimeError):
    pass


def _ulimit(kind: int) -> str:
    hard = resource.getrlimit(kind)[1]
    value = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
    return f"{value}:{value}"


def base_key(kind: str) -> str:
    """A key of what the tarball holds: its packages, the suite and this machine's apt sources."""
    digest = hashlib.sha256(f"{SUITE} {' '.join(BASES[kind])} minbase".encode())
    for source in APT_SOURCES:
        path = Path(source)
        for file in sorted(path.glob("*.sources")) + sorted(path.glob("*.list")) if path.is_dir() else [path]:
            if file.is_file():
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


class Podman:
    """``with Podman() as podman:`` a podman of our own; ``podman.run(...)`` runs it."""

    def __init__(self):
        self.stores: tuple[Path, ...] = ()  # the base images' stores this session lists
        for tool in ("podman", "runc", "mmdebstrap"):
            if not shutil.which(tool):
                raise PodmanUnavailable(f"{tool} is not installed (apt-get install podman runc catatonit mmdebstrap "
                                        "uidmap)")
        self.dir = SESSIONS / f"{os.getpid()}-{secrets.token_hex(3)}"

    def __enter__(self) -> Podman:
        trusted_root()
        remove_stale_sessions()
        self.dir.mkdir(parents=True, mode=0o700)
        write_config(self.dir)
        return self

    def __exit__(self, *exc) -> None:
        remove_session(self.dir)

    @property
    def env(self) -> dict[str, str]:
        return session_env(self.dir)

    def run(self, *args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              **kwargs)
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
        return done

    def base_image(self, kind: str) -> str:
        """localhost/ul-base-KIND:KEY, from its read-only store (made from the cached tarball on
        first use), which this session's storage lists from now on."""
        key = base_key(kind)
        name = f"localhost/ul-base-{kind}:{key}"
        store = base_store(kind, key, name, self.env)
        self.stores = (*self.stores, store)
        write_storage_config(self.dir, self.stores)
        return name

    def build(self, context: Path, target: str, tag: str, build_args: dict[str, str]) -> subprocess.CompletedProcess:
        """podman build with the host's network and CA certificates (pip and apt-get fetch)."""
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        return self.run("build", "--network", "host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro", "--target", target,
                        "-t", tag, *args, str(context), timeout=BUILD_TIMEOUT)


def write_config(directory: Path) -> None:
    (directory / "tmp").mkdir()
    (directory / "networks").mkdir()
    (directory / "containers.conf").write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={_ulimit(resource.RLIMIT_NOFILE)}", '
        f'"nproc={_ulimit(resource.RLIMIT_NPROC)}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{directory}/tmp"\n'
        "[network]\n"
        f'network_config_dir = "{directory}/networks"\n'
    )
    write_storage_config(directory, ())


def write_storage_config(directory: Path, stores: tuple[Path, ...]) -> None:
    """The session's storage, with the base images' read-only stores as additional image stores."""
    listed = ", ".join(f'"{store}"' for store in stores)
    (directory / "storage.conf").write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{directory}/graph"\n'
        f'runroot = "{directory}/run"\n'
        + (f"[storage.options]\nadditionalimagestores = [{listed}]\n" if stores else "")
    )


def session_env(directory: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(directory / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(directory / "storage.conf")}


def trusted_root(directories: tuple[Path, ...] = (ROOT, CACHE, STORES, SESSIONS)) -> None:
    """ROOT and the directories in it, made if missing, and refused unless they are real directories
    of our own user that nobody else can write: /var/tmp is everyone's, and what is cached here
    (base images, image stores) is what the tests then build on and run."""
    for directory in directories:
        directory.mkdir(mode=0o755, exist_ok=True)
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise PodmanUnavailable(f"{directory} is not a directory of uid {os.geteuid()} that only it can write: "
                                    "remove it (the tests make it again)")


def tarball_identity(tarball: Path) -> str:
    """What a base store was imported from: a tarball made again under the same key is another one."""
    info = tarball.stat()
    return f"{info.st_ino} {info.st_mtime_ns} {info.st_size}\n"


def cached_tarball(kind: str, key: str) -> Path:
    """ROOT/base-images/KIND-KEY.tar, made with mmdebstrap on first use (one maker at a time)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{kind}-{key}.tar"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            partial = tarball.with_suffix(".partial.tar")
            done = subprocess.run(["mmdebstrap", "--variant=minbase", f"--include={','.join(BASES[kind])}", SUITE,
                                   str(partial)], capture_output=True, text=True, timeout=MMDEBSTRAP_TIMEOUT)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                raise PodmanUnavailable(f"mmdebstrap failed: {done.stderr[-2000:]}")
            os.rename(partial, tarball)
    return tarball


def base_store(kind: str, key: str, name: str, env: dict[str, str]) -> Path:
    """ROOT/base-stores/KIND-KEY/graph holding the image ``name``, imported from the cached tarball
    on first use (one maker at a time; a store without its .done marker is made again)."""
    tarball = cached_tarball(kind, key)
    store = STORES / f"{kind}-{key}"
    done = STORES / f"{kind}-{key}.done"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() or done.read_text() != tarball_identity(tarball):
            done.unlink(missing_ok=True)
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir(parents=True, exist_ok=True)
            runroot = tempfile.mkdtemp(prefix="ul-base-run-")  # podman wants a runroot of at most 50 characters
            try:
                made = subprocess.run(["podman", "--root", str(store / "graph"), "--runroot", runroot,
                                       "--storage-driver", "overlay", "import", str(tarball), name],
                                      env=env, capture_output=True, text=True, timeout=300)
            finally:
                shutil.rmtree(runroot, ignore_errors=True)
            if made.returncode != 0:
                raise PodmanUnavailable(f"podman import into {store} failed: {made.stderr[-2000:]}")
            done.write_text(tarball_identity(tarball))
    return store / "graph"


def remove_session(directory: Path) -> None:
    """Every pod, container, image and volume of the session, its mounts, then its directory."""
    if (directory / "containers.conf").exists():
        env = session_env(directory)
        for args in (["pod", "rm", "--all", "--force", "--time", "0"], ["rm", "--all", "--force", "--time", "0"],
                     ["rmi", "--all", "--force"], ["volume", "rm", "--all", "--force"]):
            subprocess.run(["podman", *args], env=env, capture_output=True, timeout=180)
    for mount in sorted(mounts_under(directory), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
    shutil.rmtree(directory, ignore_errors=True)


def mounts_under(directory: Path) -> list[str]:
    prefix = str(directory) + "/"
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix) or point == str(directory):
                found.append(point)
    return found


def remove_stale_sessions() -> None:
    """Sessions whose test process is gone (killed before it could clean up)."""
    if not SESSIONS.is_dir():
        return
    for directory in SESSIONS.iterdir():
        pid = directory.name.partition("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            print(f"podman: removing the session of test process {pid}, which died without cleaning up "
                  f"({directory})", file=sys.stderr)
            remove_session(directory)
