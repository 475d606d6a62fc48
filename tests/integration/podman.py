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
75 s on a busy machine).

The images a session builds are built in a build cache kept across runs
(``ROOT/build-caches/KEY``: a storage of its own, graph, run and tmp directories, used by
``podman build --layers``), so that a second run skips the unchanged steps (apt-get, pip, the
uWSGI compile). What a step reuses is podman's own layer cache: an intermediate image of the same
parent, the same instruction (build arguments included) and, for COPY, the same checksum of the
copied files. KEY names what those parents rest on: podman's version and the base stores the cache
lists (each one's tarball identity), so a base image made again starts a new cache. The build
leaves its image untagged there; the session tags it in its own storage, which lists the cache as
a read-only additional image store (as the base stores), and runs it from there; the session's
containers, pods and tags go with the session as before.

Sessions share a cache through podman's own locking (concurrent builds into one storage), and a
lock file of ours (``KEY.lock``) that each session holds shared from its first build to its end
(its containers run on the cache's layers), and so do its ``podman build`` processes (the
descriptor is passed on: a build that outlives a killed test process, until the SIGTERM that its
death sends the build, PR_SET_PDEATHSIG, has stopped it, keeps it). Only a session
that gets it exclusively (no other session is using that cache) cleans: it removes the containers
a killed build left (``podman rm --force``; the layers committed before stay), and the whole
cache when it holds more than ``BUILD_CACHE_MAX_BYTES`` or was last used more than
``BUILD_CACHE_MAX_AGE`` ago (also the apt-get layers' age: Debian's updates come in then); other
keys' caches, unused that long, likewise. To clear it by hand, when
no tests run: ``rm -rf /var/tmp/uwsgi-layouts-podman/build-caches`` (umount anything still
mounted under it first); the next run is a cold one.

A session whose test process died (SIGKILL) is removed by the next one, which says so: its pods,
images and volumes, and its builds' cgroups (``--cgroup-parent``, named for the session), killing
what still runs there (a killed build's RUN step outlives it under runc).

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
import threading
import time
from pathlib import Path

import psutil

from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.run import remove_cgroups
from uwsgi_layouts.deploy.run.processes import child_setup

ROOT = Path("/var/tmp/uwsgi-layouts-podman")
CACHE = ROOT / "base-images"
STORES = ROOT / "base-stores"  # read-only image stores holding one base image each
SESSIONS = ROOT / "sessions"
CGROUP_ROOT = Path("/sys/fs/cgroup")  # one directory per cgroup v1 hierarchy (and unified)
BUILD_CACHES = ROOT / "build-caches"  # podman build's layer caches, one storage per KEY
# Bounds of a build cache: the cold build of the bundle's three images leaves about 0.6 GB (app,
# nginx and exporter stages, the compiler included; 1.2 GB when two sessions built it at the same
# time, each its own chain); each warm run adds a few MB (its own uwsgi.ini and nginx
# configuration); a base image made again starts a new KEY.
BUILD_CACHE_MAX_BYTES = 4 * 2**30
BUILD_CACHE_MAX_AGE = 7 * 86400  # seconds since a session last used it
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
        self.build_cache: BuildCache | None = None  # opened by the first build
        self._opening = threading.Lock()  # the first builds run in threads at the same time

    def __enter__(self) -> Podman:
        trusted_root()
        remove_stale_sessions()
        self.dir.mkdir(parents=True, mode=0o700)
        write_config(self.dir)
        return self

    def __exit__(self, *exc) -> None:
        try:
            remove_session(self.dir)
        finally:
            if self.build_cache:
                self.build_cache.close()  # after the session's containers, which ran on its layers

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
        """podman build with the host's network and CA certificates (pip and apt-get fetch), in the
        build cache (its unchanged steps reused); the image is tagged ``tag`` in the session."""
        cache = self._open_build_cache()
        iidfile = self.dir / f"iid-{secrets.token_hex(4)}"
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        built = subprocess.run(["podman", "build", "--layers", "--iidfile", str(iidfile), "--network", "host",
                                "--cgroup-parent", build_cgroup_parent(self.dir), "-v",
                                "/etc/ssl/certs:/etc/ssl/certs:ro", "--target", target, *args, str(context)],
                               env=cache.env, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                               # The build holds the cache's lock too: should this process be killed,
                               # no session cleans the cache while the build goes on writing to it;
                               # and it gets SIGTERM then (podman build stops), not left running;
                               # in the terminal's process group, so Ctrl-C reaches it too.
                               pass_fds=(cache.lock.fileno(),), preexec_fn=child_setup(own_group=False))
        if built.returncode != 0:
            raise RuntimeError(f"podman build --target {target} failed ({built.returncode}): {built.stderr[-3000:]}")
        self.run("tag", iidfile.read_text().strip(), tag)
        return built

    def _open_build_cache(self) -> BuildCache:
        with self._opening:
            if self.build_cache is None:
                self.build_cache = BuildCache.open(self.stores, self.dir)
                write_storage_config(self.dir, (*self.stores, self.build_cache.graph))
            elif self.build_cache.stores != self.stores:
                raise RuntimeError("a base image was added after the first build: its build cache lists the "
                                   "base stores of that build")
            return self.build_cache


def write_config(directory: Path) -> None:
    (directory / "tmp").mkdir()
    (directory / "networks").mkdir()
    write_containers_config(directory / "containers.conf", directory, events="file")
    write_storage_config(directory, ())


def write_containers_config(path: Path, directory: Path, events: str) -> None:
    """runc, cgroupfs, our ulimits; libpod's temporary and network directories in ``directory``."""
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={_ulimit(resource.RLIMIT_NOFILE)}", '
        f'"nproc={_ulimit(resource.RLIMIT_NPROC)}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        f'events_logger = "{events}"\n'
        f'tmp_dir = "{directory}/tmp"\n'
        "[network]\n"
        f'network_config_dir = "{directory}/networks"\n'
    )


def write_storage_config(directory: Path, stores: tuple[Path, ...], path: Path | None = None) -> None:
    """A storage in ``directory`` (graph, run), listing ``stores`` as read-only additional image
    stores: the session's (the base images' stores, then the build cache), or the build cache's."""
    listed = ", ".join(f'"{store}"' for store in stores)
    (path or directory / "storage.conf").write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{directory}/graph"\n'
        f'runroot = "{directory}/run"\n'
        + (f"[storage.options]\nadditionalimagestores = [{listed}]\n" if stores else "")
    )


def session_env(directory: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(directory / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(directory / "storage.conf")}


def trusted_root(directories: tuple[Path, ...] = (ROOT, CACHE, STORES, SESSIONS, BUILD_CACHES)) -> None:
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


class BuildCache:
    """ROOT/build-caches/KEY: the storage ``podman build --layers`` builds in, across runs and
    sessions. ``BuildCache.open`` cleans it if it may (see the module's docstring), then holds
    KEY.lock shared until ``close``."""

    def __init__(self, stores: tuple[Path, ...], session: Path):
        self.stores = stores
        self.key = build_cache_key(stores)
        self.dir = BUILD_CACHES / self.key
        self.graph = self.dir / "graph"
        self.lock_path = BUILD_CACHES / f"{self.key}.lock"
        # The build's configuration, in the session: the cache's storage and libpod directories
        # (libpod refuses a storage whose database names other ones), the base stores listed.
        self.containers_conf = session / "build-containers.conf"
        self.storage_conf = session / "build-storage.conf"
        self.lock = None

    @classmethod
    def open(cls, stores: tuple[Path, ...], session: Path) -> BuildCache:
        cache = cls(stores, session)
        write_containers_config(cache.containers_conf, cache.dir, events="none")
        write_storage_config(cache.dir, stores, path=cache.storage_conf)
        prune_build_caches(keep=cache)
        cache.lock = open(cache.lock_path, "a")  # noqa: SIM115 -- held until close()
        fcntl.flock(cache.lock, fcntl.LOCK_SH)
        os.utime(cache.lock_path)  # last used: what BUILD_CACHE_MAX_AGE counts from
        for part in ("graph", "run", "tmp", "networks"):
            (cache.dir / part).mkdir(parents=True, exist_ok=True)
        # Made now, so that the session's storage can list it before the first build is done.
        subprocess.run(["podman", "images", "--quiet"], env=cache.env, capture_output=True, check=True, timeout=120)
        return cache

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.containers_conf),
                "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}

    def close(self) -> None:
        if self.lock:
            self.lock.close()  # releases the shared lock
            self.lock = None


def build_cache_key(stores: tuple[Path, ...]) -> str:
    """What every cached layer rests on: podman's version and the base stores (each one's tarball
    identity, which changes when the base image is made again)."""
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    digest = hashlib.sha256(version.encode())
    for store in stores:  # STORES/KIND-KEY/graph, complete as named by STORES/KIND-KEY.done
        done = store.parent.parent / f"{store.parent.name}.done"
        digest.update(f"{store}\n{done.read_text()}".encode())
    return digest.hexdigest()[:16]


def prune_build_caches(keep: BuildCache) -> None:
    """Each build cache no session is using (its lock taken exclusively, without waiting) is
    removed when unused for BUILD_CACHE_MAX_AGE; ``keep``'s also when it is above
    BUILD_CACHE_MAX_BYTES, and the containers a killed build left in it are removed."""
    for lock_path in sorted(BUILD_CACHES.glob("*.lock")):
        key = lock_path.stem
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use: another session cleans it later
            directory = BUILD_CACHES / key
            if not directory.exists():
                continue
            why = clean_build_cache(directory, time.time() - lock_path.stat().st_mtime,
                                    keep if key == keep.key else None)
            if why:
                print(f"podman: removing the build cache {directory} ({why})", file=sys.stderr)
                remove_tree(directory)


def clean_build_cache(directory: Path, idle: float, ours: BuildCache | None) -> str:
    """Why the cache in ``directory`` (idle for ``idle`` seconds) goes whole, or '' once the
    containers of killed builds are removed from it (``ours`` only): the layers that their steps
    committed before are whole and stay; the one a kill cut short c/storage removes itself."""
    if idle > BUILD_CACHE_MAX_AGE:
        return f"unused for {idle / 86400:.0f} days"
    if ours is None:
        return ""
    size = int(subprocess.run(["du", "-sxb", str(directory)], capture_output=True, text=True, check=True,
                              timeout=300).stdout.split()[0])
    if size > BUILD_CACHE_MAX_BYTES:
        return f"{size / 2**30:.1f} GiB, above {BUILD_CACHE_MAX_BYTES / 2**30:g}"
    left = subprocess.run(["podman", "ps", "--all", "--external", "--quiet"], env=ours.env, capture_output=True,
                          text=True, timeout=120)
    if left.returncode != 0:
        return f"podman cannot read it: {left.stderr.strip()[-300:]}"
    left_behind = left.stdout.split()
    if left_behind:
        removed = subprocess.run(["podman", "rm", "--force", *left_behind], env=ours.env, capture_output=True,
                                 text=True, timeout=180)
        if removed.returncode != 0:
            return f"the containers of a killed build could not be removed: {removed.stderr.strip()[-300:]}"
        print(f"podman: removed {len(left_behind)} container(s) that a killed build left in {directory}",
              file=sys.stderr)
    return ""


def remove_tree(directory: Path) -> None:
    """``directory`` after unmounting what is mounted under it (a killed build's layers)."""
    for mount in sorted(mounts_under(directory), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
    shutil.rmtree(directory, ignore_errors=True)


def build_cgroup_parent(directory: Path) -> str:
    """The cgroup (cgroupfs path) under which the session's ``podman build`` steps run: buildah makes
    a ``buildah-buildahN`` cgroup per RUN step and removes it when the step ends, but a killed build
    leaves it behind; under a parent named for the session, the session's removal finds it."""
    return f"/ul-podman-build-{directory.name}"


def remove_build_cgroups(directory: Path) -> None:
    """The session's build cgroups in every hierarchy, deepest first. A killed build's RUN step
    outlives it (``podman build`` ends on its PR_SET_PDEATHSIG, the step's processes under runc do
    not): what still runs in them is ours, and ``remove_cgroups`` kills it first. One that cannot be
    removed is said."""
    for hierarchy in CGROUP_ROOT.iterdir():
        parent = hierarchy / build_cgroup_parent(directory).lstrip("/")
        if parent.is_dir():
            deepest_first = sorted((p for p in parent.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            try:
                remove_cgroups([str(p) for p in [*deepest_first, parent]])
            except StackError as exc:
                print(f"podman: {exc}", file=sys.stderr)


def remove_session(directory: Path) -> None:
    """Every pod, container, image and volume of the session, its build cgroups, its mounts, then
    its directory."""
    if (directory / "containers.conf").exists():
        env = session_env(directory)
        for args in (["pod", "rm", "--all", "--force", "--time", "0"], ["rm", "--all", "--force", "--time", "0"],
                     ["rmi", "--all", "--force"], ["volume", "rm", "--all", "--force"]):
            subprocess.run(["podman", *args], env=env, capture_output=True, timeout=180)
    remove_build_cgroups(directory)
    remove_tree(directory)


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
