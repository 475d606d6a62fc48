"""A reproducible file set for the file-offload scenarios, and page-cache control over it.

``make_dataset(root)`` writes many small files (default 10,000 x 5 KB) plus a few large ones
(default 3 x 4 MB) under ``root/files/`` and an index ``root/index.json`` mapping short
opaque ids ("s00042", "l0001") to paths relative to ``root/files/``::

    {"format_version": 1, "files": {"s00000": "small/00/00/s00000.bin", ...},
     "hot_id": "s00000", "small_count": ..., "small_size": ..., "large_count": ...,
     "large_size": ..., "seed": 0, "total_bytes": ...}

Small files fan out over two directory levels (at most 100 entries per directory), so no
directory holds thousands of files. Content is pseudo-random and depends only on the seed
and the file id, so the same parameters give byte-identical files on any machine. The set
is built in a temporary sibling directory and renamed into place: a reader sees the old
data set, no data set, or the complete new one, never half of one. Re-running with the
same parameters is a no-op when every file is present with its size.

Beside index.json, ``nginx-files.map`` and ``nginx-files.json`` (``deploy.render.write_map``): the
same id -> path pairs as an nginx ``map`` include and the hash sizes nginx needs for them, so
nginx can resolve ids itself (``/nfiles/<id>``). They are written with the data set and
rewritten whenever it is (or when they are missing or were made from other parameters), so
the map always matches the index.

``evict(root)`` asks the kernel to drop the data set's pages from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed), and ``residency(paths)`` /
``resident_fraction(paths)`` measure how much of it is cached (``mmap`` + ``mincore``),
so a cold-cache run can say whether the disk was really read. ``disk_read_bytes(path)``
reads the backing block device's counter, the direct evidence.

CLI: ``uwsgi-layouts dataset [--root DIR] [--small-count N] [--small-size BYTES]
[--large-count N] [--large-size BYTES] [--seed N] [--evict]``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.app.files import FILES_SUBDIR, FORMAT_VERSION, INDEX_NAME, valid_id, valid_rel_path
from uwsgi_layouts.arguments import EXIT_BAD_INPUT, PROG, Ints, OneLineParser
from uwsgi_layouts.deploy.machine import map_is_current, read_map_facts
from uwsgi_layouts.deploy.model import MAP_NAME, MapError, MapFacts
from uwsgi_layouts.deploy.render import write_map as write_nginx_map


def default_root() -> Path:
    """Where the data set goes unless --root says: build/dataset in the current directory."""
    return Path.cwd() / "build" / "dataset"


# Bounds: ids have at most 6 digits, and nothing here should fill a disk by a typo. The CLI's
# options parse with them too (each range written once, shown in the help).
LIMITS = {
    "small_count": Ints(1, 1_000_000),
    "small_size": Ints(1, 64 * 1024 * 1024),
    "large_count": Ints(0, 1000),
    "large_size": Ints(1, 4 * 1024 * 1024 * 1024),
    "seed": Ints(0, 2**63 - 1),
}
FANOUT = 100  # entries per directory level
WRITE_BLOCK = 1024 * 1024


class DatasetError(ValueError):
    """Bad parameters or an unusable root; the message names the field and what is allowed."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


class MincoreUnavailable(RuntimeError):
    """Page-cache residency cannot be measured here; the message says why."""


# --- ids and paths -------------------------------------------------------------------------


def small_id(n: int, count: int) -> str:
    return f"s{n:0{max(5, len(str(count - 1)))}d}"


def large_id(n: int) -> str:
    return f"l{n:04d}"


def small_rel_path(n: int, file_id: str) -> str:
    # 2-level fan-out by number: 100 files per leaf, 100 leaves per top directory.
    return f"small/{n // (FANOUT * FANOUT):02d}/{n // FANOUT % FANOUT:02d}/{file_id}.bin"


def large_rel_path(file_id: str) -> str:
    return f"large/{file_id}.bin"


def file_chunks(seed: int, file_id: str, size: int):
    """Deterministic content of one file, in blocks: depends only on (seed, id, size)."""
    rng = random.Random(f"{seed}:{file_id}")
    left = size
    while left:
        n = min(WRITE_BLOCK, left)
        yield rng.randbytes(n)
        left -= n


def file_bytes(seed: int, file_id: str, size: int) -> bytes:
    return b"".join(file_chunks(seed, file_id, size))


# --- the index -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Index:
    root: Path
    files: dict[str, str]  # id -> path relative to root/files
    sizes: dict[str, int]  # id -> bytes
    hot_id: str
    small_count: int
    small_size: int
    large_count: int
    large_size: int
    seed: int

    @property
    def files_dir(self) -> Path:
        return self.root / FILES_SUBDIR

    @property
    def small_ids(self) -> list[str]:
        return [i for i in self.files if i.startswith("s")]

    @property
    def large_ids(self) -> list[str]:
        return [i for i in self.files if i.startswith("l")]

    @property
    def total_bytes(self) -> int:
        return self.small_count * self.small_size + self.large_count * self.large_size

    def path(self, file_id: str) -> Path:
        return self.files_dir / self.files[file_id]

    def paths(self) -> list[Path]:
        return [self.files_dir / rel for rel in self.files.values()]

    def params(self) -> dict:
        return {"small_count": self.small_count, "small_size": self.small_size,
                "large_count": self.large_count, "large_size": self.large_size, "seed": self.seed}

    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, "files": self.files, "hot_id": self.hot_id,
                **self.params(), "total_bytes": self.total_bytes}

    @classmethod
    def from_json(cls, root: Path, data: dict) -> "Index":
        if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version is not {FORMAT_VERSION}")
        params = {k: data[k] for k in LIMITS}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in params.values()):
            raise ValueError("parameters must be integers")
        expected = build_index(root, **params)
        if data.get("files") != expected.files or data.get("hot_id") != expected.hot_id:
            raise ValueError("files or hot_id do not match the parameters")
        return expected


def check_params(small_count, small_size, large_count, large_size, seed) -> dict[str, int]:
    values = {"small_count": small_count, "small_size": small_size, "large_count": large_count,
              "large_size": large_size, "seed": seed}
    for name, raw in values.items():
        limit = LIMITS[name]
        field = name.replace("_", "-")
        if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
            raw = int(raw.strip())
        if isinstance(raw, bool) or not isinstance(raw, int) or not limit.low <= raw <= limit.high:
            raise DatasetError(field, f"must be {limit.allowed}, got {raw!r}")
        values[name] = raw
    return values


def build_index(root: Path, small_count: int, small_size: int, large_count: int, large_size: int,
                seed: int) -> Index:
    """The index for these parameters (pure: touches no file)."""
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for n in range(small_count):
        file_id = small_id(n, small_count)
        files[file_id] = small_rel_path(n, file_id)
        sizes[file_id] = small_size
    for n in range(large_count):
        file_id = large_id(n)
        files[file_id] = large_rel_path(file_id)
        sizes[file_id] = large_size
    assert all(valid_id(i) and valid_rel_path(r) for i, r in files.items())
    return Index(root=Path(root), files=files, sizes=sizes, hot_id=small_id(0, small_count),
                 small_count=small_count, small_size=small_size, large_count=large_count,
                 large_size=large_size, seed=seed)


def read_index(root: Path) -> Index | None:
    """The data set at ``root`` if its index is valid, else None."""
    try:
        data = json.loads((Path(root) / INDEX_NAME).read_text(encoding="utf-8"))
        return Index.from_json(Path(root), data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_complete(index: Index) -> bool:
    """Every file of the index exists with its size (a stat each; no content is read)."""
    for file_id, rel in index.files.items():
        try:
            if os.stat(index.files_dir / rel).st_size != index.sizes[file_id]:
                return False
        except OSError:
            return False
    return True


# --- making the data set --------------------------------------------------------------------


def _write_file(path: Path, seed: int, file_id: str, size: int) -> None:
    with open(path, "wb") as f:
        for block in file_chunks(seed, file_id, size):
            f.write(block)


def _check_root(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise DatasetError("root", f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()) and not (root / INDEX_NAME).exists():
        raise DatasetError("root", f"{root} is a non-empty directory without {INDEX_NAME}; refusing to replace it")


def make_dataset(root: Path | None = None, small_count: int = 10_000, small_size: int = 5 * 1024,
                 large_count: int = 3, large_size: int = 4 * 1024 * 1024, seed: int = 0) -> Index:
    """Create (or keep, if already complete with these parameters) the data set at ``root``."""
    return ensure_dataset(root, small_count, small_size, large_count, large_size, seed)[0]


def ensure_dataset(root: Path | None = None, small_count: int = 10_000, small_size: int = 5 * 1024,
                   large_count: int = 3, large_size: int = 4 * 1024 * 1024, seed: int = 0) -> tuple[Index, bool]:
    """``make_dataset``, also saying whether anything was written (False: already up to date)."""
    params = check_params(small_count, small_size, large_count, large_size, seed)
    root = Path(root or default_root()).absolute()
    wanted = build_index(root, **params)
    existing = read_index(root)
    if existing is not None and existing.params() == wanted.params() and is_complete(existing):
        return existing, ensure_map(existing)
    _check_root(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root.parent).free
    if wanted.total_bytes > free * 0.9:
        raise DatasetError("size", f"{wanted.total_bytes} bytes needed but only {free} free in {root.parent}")
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.staging-", dir=root.parent))
    try:
        files_dir = staging / FILES_SUBDIR
        for rel in sorted({str(Path(r).parent) for r in wanted.files.values()}):
            (files_dir / rel).mkdir(parents=True, exist_ok=True)
        for file_id, rel in wanted.files.items():
            _write_file(files_dir / rel, seed, file_id, wanted.sizes[file_id])
        (staging / INDEX_NAME).write_text(json.dumps(wanted.to_json(), indent=1) + "\n", encoding="utf-8")
        write_map(staging, wanted)
        # mkdtemp made the staging directory 0700: nginx workers (www-data) must read it.
        for dirpath, _dirnames, filenames in os.walk(staging):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        _swap_into_place(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return wanted, True


def map_source(index: Index) -> dict:
    """What a data set's nginx map is made from: the index format and its parameters."""
    return {"index_format_version": FORMAT_VERSION, **index.params()}


def write_map(root: Path, index: Index) -> MapFacts:
    """The nginx map of ``index`` (and its hash sizes) into ``root``, replacing any there."""
    return write_nginx_map(root, index.files, map_source(index),
                               check=lambda i, rel: valid_id(i) and valid_rel_path(rel))


def ensure_map(index: Index) -> bool:
    """Write the data set's nginx map unless a current one is there; True if written."""
    if map_is_current(index.root, map_source(index)):
        return False
    write_map(index.root, index)
    return True


def _swap_into_place(staging: Path, root: Path) -> None:
    if not root.exists():
        staging.rename(root)
        return
    # Two renames: between them no data set exists, but never a half-written one.
    old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
    old.rmdir()
    root.rename(old)
    try:
        staging.rename(root)
    except BaseException:
        old.rename(root)
        raise
    shutil.rmtree(old, ignore_errors=True)


# --- page cache ------------------------------------------------------------------------------


def dataset_paths(root: Path) -> list[Path]:
    """Every file of the data set at ``root`` (from its index)."""
    index = read_index(Path(root))
    if index is None:
        raise DatasetError("root", f"no valid data set at {root}: run uwsgi-layouts dataset")
    return index.paths()


def evict(root: Path) -> int:
    """Ask the kernel to drop every data-set file from the page cache; return the bytes asked.

    Dirty pages cannot be dropped, so each file is flushed first (a no-op when clean).
    Without effect on tmpfs/ramfs, whose pages are the storage.
    """
    asked = 0
    for path in dataset_paths(root):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            asked += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return asked


def warm(paths) -> int:
    """Read every file once, so its pages are in the page cache; return the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while block := f.read(WRITE_BLOCK):
                total += len(block)
    return total


@dataclass(frozen=True)
class Residency:
    resident_pages: int
    total_pages: int
    page_size: int

    @property
    def fraction(self) -> float:
        return self.resident_pages / self.total_pages if self.total_pages else 0.0

    @property
    def resident_bytes(self) -> int:
        return self.resident_pages * self.page_size


_libc = None


def _mincore_libc():
    """libc with mmap/mincore/munmap typed, or raise MincoreUnavailable saying why."""
    global _libc
    if _libc is not None:
        return _libc
    if not sys.platform.startswith("linux"):
        raise MincoreUnavailable(f"mincore residency is only implemented for Linux, not {sys.platform}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    except (OSError, AttributeError) as exc:
        raise MincoreUnavailable(f"cannot load mincore from libc: {exc}") from None
    _libc = libc
    return libc


def _file_residency(libc, path: Path, page_size: int) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        # Linux >= 5.2 hides page-cache state of files the caller neither owns nor may write
        # (it would report 0 whatever the truth): refuse rather than guess.
        if st.st_uid != os.geteuid() and not os.access(path, os.W_OK):
            raise MincoreUnavailable(f"{path}: not owned or writable by this user, so Linux hides its "
                                     "page-cache state from mincore")
        size = st.st_size
        if size == 0:
            return 0, 0
        pages = (size + page_size - 1) // page_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise MincoreUnavailable(f"mmap failed on {path}: {os.strerror(err)}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise MincoreUnavailable(f"mincore failed on {path}: {os.strerror(err)}")
            return sum(b & 1 for b in vec), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def residency(paths) -> Residency:
    """How many of the files' pages are in the page cache (nothing is read or faulted in).

    Raises MincoreUnavailable with the reason if this cannot be measured here.
    """
    libc = _mincore_libc()
    page_size = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in paths:
        r, t = _file_residency(libc, Path(path), page_size)
        resident += r
        total += t
    return Residency(resident, total, page_size)


def resident_fraction(paths) -> float:
    """Share (0..1) of the files' pages in the page cache; 0.0 for no pages.

    Raises MincoreUnavailable (saying why) instead of guessing.
    """
    return residency(paths).fraction


def mincore_problem(path: Path) -> str | None:
    """None if residency can be measured for ``path``, else the reason."""
    try:
        residency([path])
    except MincoreUnavailable as exc:
        return str(exc)
    return None


def fs_type(path: Path) -> str:
    """The filesystem type holding ``path`` (from /proc/self/mounts), or "unknown"."""
    try:
        target = os.path.realpath(path)
        best, kind = "", "unknown"
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1].replace("\\040", " ")
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, parts[2]
        return kind
    except OSError:
        return "unknown"


def disk_read_bytes(path: Path) -> int | None:
    """Bytes read so far from the block device holding ``path`` (/sys/dev/block/M:m/stat,
    sectors read x 512), or None when it is not on a block device (tmpfs, overlay, NFS)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    try:
        fields = stat.read_text().split()
        return int(fields[2]) * 512
    except (OSError, ValueError, IndexError):
        return None


# --- CLI -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"{PROG} dataset", description=__doc__.splitlines()[0])
    p.add_argument("--root", default=None,
                   help="where to write the data set (default: build/dataset in the current directory)")
    for name, default, what in (("small_count", 10_000, "number of small files"),
                                ("small_size", 5 * 1024, "bytes per small file"),
                                ("large_count", 3, "number of large files"),
                                ("large_size", 4 * 1024 * 1024, "bytes per large file"),
                                ("seed", 0, "content seed")):
        p.add_argument(f"--{name.replace('_', '-')}", type=LIMITS[name], default=default,
                       help=f"{what} ({LIMITS[name]}; default {default})")
    p.add_argument("--evict", action="store_true", help="then drop the data set from the page cache")
    p.add_argument("--map-only", action="store_true",
                   help="only (re)write the nginx map of the data set already at --root, whatever its parameters")
    return p


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = Path(args.root) if args.root else default_root()
    if args.map_only:
        return _map_only(root)
    try:
        params = check_params(args.small_count, args.small_size, args.large_count, args.large_size, args.seed)
        started = time.monotonic()
        index, wrote = ensure_dataset(root, **params)
        took = time.monotonic() - started
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: root: {exc.strerror or exc} ({exc.filename or root})", file=sys.stderr)
        return 1
    print(f"{index.root}: {index.small_count} x {index.small_size} B + {index.large_count} x {index.large_size} B"
          f" = {_mb(index.total_bytes)}, hot {index.hot_id}; "
          + (f"written in {took:.1f} s" if wrote else "already up to date"))
    _print_map(index.root)
    if args.evict:
        print(f"evicted: asked the kernel to drop {_mb(evict(index.root))}")
    try:
        r = residency(index.paths())
        print(f"page cache: {r.fraction:.0%} of the data set's pages resident ({r.resident_pages}/{r.total_pages}"
              f" pages of {r.page_size} B); filesystem {fs_type(index.root)}")
    except MincoreUnavailable as exc:
        print(f"page cache: residency unknown ({exc})")
    return 0


def _print_map(root: Path) -> None:
    try:
        m = read_map_facts(root).sizing
        print(f"nginx map: {MAP_NAME}, {m.ids} ids; map_hash_max_size {m.max_size}, "
              f"map_hash_bucket_size {m.bucket_size} (a {m.table_size}-bucket table, {_mb(m.hash_bytes)})")
    except MapError as exc:
        print(f"nginx map: unreadable ({exc})")


def _map_only(root: Path) -> int:
    index = read_index(root)
    if index is None:
        print(f"error: root: no valid data set at {root} (index.json): run uwsgi-layouts dataset", file=sys.stderr)
        return EXIT_BAD_INPUT
    started = time.monotonic()
    try:
        write_map(index.root, index)
    except OSError as exc:
        print(f"error: root: {exc.strerror or exc} ({exc.filename or root})", file=sys.stderr)
        return 1
    print(f"{index.root}: nginx map written in {time.monotonic() - started:.1f} s")
    _print_map(index.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
