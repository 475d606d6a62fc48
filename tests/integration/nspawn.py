"""A throwaway systemd for the tests: this machine's own /usr booted by systemd-nspawn.

When PID 1 is not systemd (containers, CI runners, this project's VM), a unit cannot be
started for real. ``Container`` boots systemd 252 from the host's /usr (read-only) with a copy of
/etc (the host's enabled units removed) in a temporary root, with a private network (only its
own loopback), so a bundle can be installed there with ``uwsgi-layouts install`` and its
unit started, reloaded and stopped by systemd itself, hardening included.

Nothing outlives the context manager: the container is powered off (then killed), its root
removed, and the empty directories nspawn creates under /run/systemd on the host are removed
when they did not exist before. A host whose / is not merged-/usr, or without systemd-nspawn,
raises ``ContainerUnavailable`` with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

NSPAWN = "/usr/bin/systemd-nspawn"
# Host paths systemd-nspawn creates (empty once it is done): removed after us if they were new.
HOST_LEFTOVERS = ("/run/systemd/nspawn/propagate", "/run/systemd/nspawn/locks", "/run/systemd/nspawn",
                  "/run/systemd/nspawn-root")


class ContainerUnavailable(RuntimeError):
    pass


class Container:
    def __init__(self, workdir: Path, binds: list[tuple[str, str]], boot_timeout: float = 90.0):
        """``binds``: (host path, path inside) pairs, mounted read-only."""
        self.workdir = workdir
        self.root = workdir / "root"
        self.binds = binds
        self.boot_timeout = boot_timeout
        self.name = f"ul-{os.getpid()}-{time.monotonic_ns() % 100000}"
        self.proc: subprocess.Popen | None = None
        self.leader = 0
        self._existed = {p: os.path.lexists(p) for p in HOST_LEFTOVERS}

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Container:
        if not os.access(NSPAWN, os.X_OK):
            raise ContainerUnavailable(f"{NSPAWN} is missing: apt-get install systemd-container")
        if not all(Path(p).is_symlink() for p in ("/bin", "/lib", "/sbin")):
            raise ContainerUnavailable("/ is not merged-/usr: the host's /usr alone cannot boot")
        try:
            self._make_root()
            self._boot()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _make_root(self) -> None:
        self.root.mkdir(parents=True)
        for d in ("usr/lib", "var", "tmp", "run", "srv", "opt", "home", "root", "mnt", "proc", "sys", "dev"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").chmod(0o1777)
        for link in ("bin", "lib", "lib64", "sbin"):
            if Path("/" + link).is_symlink():
                (self.root / link).symlink_to(os.readlink("/" + link))
        # nspawn looks for os-release before mounting /usr over it.
        shutil.copy("/usr/lib/os-release", self.root / "usr/lib/os-release")
        shutil.copytree("/etc", self.root / "etc", symlinks=True)
        for wants in (self.root / "etc/systemd/system").glob("*.wants"):
            shutil.rmtree(wants)  # the host's enabled services (nginx, databases, getty...) stay off
        (self.root / "etc/machine-id").write_text("")  # a transient id for this boot
        self._copy_var_tree()
        for host, inside in self.binds:
            target = self.root / inside.lstrip("/")
            if Path(host).is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()

    def _copy_var_tree(self, depth: int = 3) -> None:
        """/var's directories (not their files), with their modes and owners: packages expect
        /var/lib/nginx, /var/log/nginx... to exist."""
        for top, dirs, _ in os.walk("/var"):
            rel = os.path.relpath(top, "/")
            if rel.count("/") >= depth:
                dirs[:] = []
            for d in list(dirs):
                src = os.path.join(top, d)
                dst = self.root / rel / d
                if os.path.islink(src):
                    dst.symlink_to(os.readlink(src))
                    dirs.remove(d)
                    continue
                st = os.stat(src)
                dst.mkdir(exist_ok=True)
                os.chown(dst, st.st_uid, st.st_gid)
                dst.chmod(st.st_mode & 0o7777)

    def _boot(self) -> None:
        log = open(self.workdir / "nspawn.log", "w")
        cmd = [NSPAWN, "--quiet", "--directory", str(self.root), "--bind-ro=/usr", "--private-network",
               "--register=no", "--keep-unit", "--machine", self.name,
               *(f"--bind-ro={host}:{inside}" for host, inside in self.binds), "--boot"]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + self.boot_timeout
        state = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ContainerUnavailable(f"systemd-nspawn exited with {self.proc.returncode}: {self.log_tail()}")
            if not self.leader:
                kids = [c for c in psutil.Process(self.proc.pid).children() if c.name() == "systemd"]
                self.leader = kids[0].pid if kids else 0
            if self.leader:
                state = self.run("systemctl", "is-system-running", check=False, timeout=10).stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.2)  # polling the boot
        raise ContainerUnavailable(f"systemd did not finish booting in {self.boot_timeout:g} s (state {state!r}): "
                                   f"{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        try:
            self._stop()
        finally:
            self._remove()

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # nspawn powers the container off
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in (self.leader, self.proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)  # PID 1 of the container: the kernel ends the rest
                except (ProcessLookupError, PermissionError):
                    pass
            self.proc.wait(timeout=30)

    def _remove(self) -> None:
        mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if line.split()[4].startswith(str(self.workdir))]
        if mounted:  # never rmtree through a bind mount of /usr
            raise RuntimeError(f"mounts left under {self.workdir}: {mounted}; not removing it")
        shutil.rmtree(self.workdir, ignore_errors=True)
        for path in HOST_LEFTOVERS:
            if not self._existed[path]:
                try:
                    os.rmdir(path)
                except OSError:
                    pass

    # --- inside --------------------------------------------------------------------------------

    PREFIX = ("nsenter", "--target", "{leader}", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd")
    ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}

    def _inside(self, cmd: tuple[str, ...]) -> list[str]:
        return [a.format(leader=self.leader) for a in self.PREFIX] + list(cmd)

    def run(self, *cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside the container (its mount, pid, network... namespaces and root)."""
        proc = subprocess.run(self._inside(cmd), capture_output=True, text=True, timeout=timeout, env=self.ENV)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}) in the container:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *cmd: str) -> subprocess.Popen:
        """Start ``cmd`` inside the container in the background, its output piped. The caller
        waits for it (or kills it); powering the container off ends it in any case."""
        return subprocess.Popen(self._inside(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.ENV)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.workdir / "nspawn.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
