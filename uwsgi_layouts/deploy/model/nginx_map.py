"""The id -> path map nginx resolves file ids with (``/nfiles/<id>``), and its hash sizes.

A data set holds two files beside its ``index.json`` (``deploy.render.write_map`` writes them,
``deploy.machine.read_map_facts`` reads them back; this module is their pure part):

- ``nginx-files.map``: one ``<id> <path relative to files/>;`` line per file, included inside
  nginx.conf's ``map $nfile_id $nfile_path { default ""; include ...; }``;
- ``nginx-files.json``: what the map holds and the hash sizes nginx needs for it
  (``map_hash_max_size``, ``map_hash_bucket_size``), plus the ``source`` it was made from, so a
  caller can tell whether it is current. Written last: it is the map's commit mark.

Hash sizes. nginx keeps a map's exact keys in a hash table that it builds when it reads its
configuration (src/core/ngx_hash.c, ``ngx_hash_init``): each key takes ``8 + align(len + 2, 8)``
bytes in its bucket, a bucket of ``map_hash_bucket_size`` bytes (rounded up to the CPU's cache
line) holds keys up to that size minus an 8-byte end mark, and nginx tries table sizes
(buckets) one by one until every bucket fits, up to ``map_hash_max_size``. If none fits it warns
"could not build optimal map_hash, you should increase either map_hash_max_size: N or
map_hash_bucket_size: M; ignoring map_hash_bucket_size" and builds oversized buckets; a key
larger than a bucket is an error ("you should increase map_hash_bucket_size"). Its defaults
(2048 buckets of one cache line) do not fit 10,000 ids. nginx starts the search at
``max_size - 1000`` when ``max_size > 10000`` (and ``max_size / keys < 100``), else at
``keys / (bucket / 16)``.

``size_hash`` replays that search on the real keys (the same hash: ``k = k * 31 + c`` over the
lowercased key, 64-bit) and picks:

- the bucket: the smallest number of cache lines for which some table of at most one bucket
  per id fits (nginx's advice is to raise max_size before bucket_size, so a lookup reads one
  line; the cap keeps the table's pointer array at 8 bytes per id, which for 1,000,000 ids
  moves to two-line buckets and roughly halves the table's memory);
- the table: the first size that fits from where nginx will start (sizes one by one for the
  first ``LINEAR_WORK / ids`` tries, as nginx tries them, then 2% apart);
- max_size: table + 1000 where that exceeds 10000 with fewer than 100 buckets per id (for more
  than about 100 ids, so tables start at 9001), else the table itself. With table + 1000 nginx's
  first try is the fitting size: one pass over the keys at start, not one per size it walks
  through (measured here with 10,000 ids: nginx -t 0.10 s walking 1,422 sizes vs 0.02 s).

numpy does the replay (a bincount per tried size); it is only imported when sizing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MAP_NAME = "nginx-files.map"
FACTS_NAME = "nginx-files.json"
MAP_FORMAT_VERSION = 1
# The route nginx answers from the map: /nfiles/<id> (templates/nginx/_files.j2).
ROUTE_PREFIX = "/nfiles/"
# nginx's map variables: the id a request asks for (a named capture of the /nfiles/ location)
# and the path it maps to ("" for an id not in the map).
ID_VARIABLE = "nfile_id"
PATH_VARIABLE = "nfile_path"

# ngx_cacheline_size: nginx measures it at start (cpuid); 64 bytes on x86-64 and most arm64.
# On a CPU with longer lines nginx rounds bucket sizes up, which only makes buckets roomier.
CACHELINE = 64
POINTER = 8  # sizeof(void *) on 64-bit
BUCKET_LINES = (1, 2, 4, 8, 16)  # bucket sizes tried, in cache lines, smallest first
TABLE_PER_ID = 1  # at most this many buckets per id (8 bytes of pointer each)
LINEAR_WORK = 20_000_000  # keys x sizes tried one by one before stepping 1% at a time
GROWTH = 1.02
NGINX_DEFAULTS = {"max_size": 2048, "bucket_size": CACHELINE}  # map_hash_max_size, map_hash_bucket_size
# nginx's fast path: with max_size > 10000 (and max_size / keys < 100) it starts at max_size - 1000.
FAST_START_ABOVE = 10_000
FAST_START_SPAN = 1000
MAX_IDS = 10_000_000


class MapError(ValueError):
    """A missing, stale or malformed map (the message says which and what to run)."""


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def elt_size(key_len: int) -> int:
    """Bytes one key takes in its bucket (NGX_HASH_ELT_SIZE on 64-bit)."""
    return POINTER + _align(key_len + 2, POINTER)


def ngx_hash_key(key: str) -> int:
    """nginx's hash of a map key (ngx_hash_key_lc): lowercase, ``k = k * 31 + c``, 64-bit."""
    k = 0
    for c in key.lower().encode("latin-1"):
        k = (k * 31 + c) & 0xFFFF_FFFF_FFFF_FFFF
    return k


def _hashes(keys: list[str]):
    """(hashes, element sizes) as numpy arrays, the hash computed column by column per key length."""
    import numpy as np

    hashes = np.zeros(len(keys), dtype=np.uint64)
    sizes = np.zeros(len(keys), dtype=np.int64)
    by_len: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_len.setdefault(len(key), []).append(i)
    for length, where in by_len.items():
        rows = np.frombuffer("".join(keys[i] for i in where).lower().encode("latin-1"),
                            dtype=np.uint8).reshape(len(where), length)
        h = np.zeros(len(where), dtype=np.uint64)
        with np.errstate(over="ignore"):  # uint64 wraps, as ngx_uint_t does
            for col in range(length):
                h = h * np.uint64(31) + rows[:, col].astype(np.uint64)
        hashes[where] = h
        sizes[where] = elt_size(length)
    return hashes, sizes


def _fits(hashes, sizes, table: int, room: int) -> bool:
    import numpy as np

    buckets = (hashes % np.uint64(table)).astype(np.int64)
    if sizes[0] == sizes.min() == sizes.max():  # one key size (the usual case): count, then scale
        return bool(np.bincount(buckets, minlength=table).max() * int(sizes[0]) <= room)
    return bool(np.bincount(buckets, weights=sizes, minlength=table).max() <= room)


def _hash_bytes(hashes, sizes, table: int, cacheline: int = CACHELINE) -> int:
    """The memory nginx allocates for the table: a pointer per bucket, and each non-empty
    bucket's keys + end mark rounded up to a cache line."""
    import numpy as np

    load = np.bincount((hashes % np.uint64(table)).astype(np.int64), weights=sizes, minlength=table)
    used = load[load > 0] + POINTER
    return int(table * POINTER + ((used + cacheline - 1) // cacheline * cacheline).sum())


def nginx_start(keys: int, max_size: int, bucket_size: int, cacheline: int = CACHELINE) -> int:
    """The first table size nginx tries (ngx_hash_init)."""
    room = _align(bucket_size, cacheline) - POINTER
    start = max(1, keys // (room // (2 * POINTER)))
    if max_size > FAST_START_ABOVE and keys and max_size // keys < 100:
        start = max_size - FAST_START_SPAN
    return start


def nginx_table_size(hashes, sizes, max_size: int, bucket_size: int, cacheline: int = CACHELINE) -> int | None:
    """The table size nginx would build for these keys with these settings, or None where nginx
    warns "could not build optimal map_hash" (no size up to max_size fits). Raises MapError
    where nginx fails ("you should increase map_hash_bucket_size")."""
    bucket = _align(bucket_size, cacheline)
    if len(sizes) and int(sizes.max()) + POINTER > bucket:
        raise MapError(f"map_hash_bucket_size {bucket_size} is smaller than a key ({int(sizes.max())} bytes + "
                       f"{POINTER}): nginx refuses to start")
    for table in range(nginx_start(len(sizes), max_size, bucket_size, cacheline), max_size + 1):
        if _fits(hashes, sizes, table, bucket - POINTER):
            return table
    return None


@dataclass(frozen=True)
class HashSizing:
    """Sizes for one set of map keys, validated on creation."""

    ids: int
    key_len_min: int
    key_len_max: int
    bucket_size: int  # map_hash_bucket_size (bytes, a multiple of the cache line)
    max_size: int  # map_hash_max_size
    table_size: int  # the table nginx builds with these (buckets)
    hash_bytes: int  # what that table takes in memory
    tried: int  # table sizes tried while sizing
    cacheline: int = CACHELINE

    def __post_init__(self):
        for name in ("ids", "key_len_min", "key_len_max", "bucket_size", "max_size", "table_size", "hash_bytes",
                     "tried", "cacheline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MapError(f"{name}: must be an integer >= 0, got {value!r}")
        if self.bucket_size % self.cacheline or not self.bucket_size:
            raise MapError(f"bucket_size: must be a multiple of the cache line ({self.cacheline}), "
                           f"got {self.bucket_size}")
        if not 1 <= self.table_size <= self.max_size:
            raise MapError(f"table_size: must be in 1..max_size ({self.max_size}), got {self.table_size}")


def size_hash(keys: list[str], cacheline: int = CACHELINE) -> HashSizing:
    """map_hash_bucket_size and map_hash_max_size for these keys (see the module doc)."""
    if not keys:
        raise MapError("no ids: a map needs at least one")
    if len(keys) > MAX_IDS:
        raise MapError(f"{len(keys)} ids: at most {MAX_IDS} are supported")
    hashes, sizes = _hashes(keys)
    n = len(keys)
    # nginx's fast path needs max_size > 10000 and max_size / ids < 100: tables from 9001 up.
    fast_from = FAST_START_ABOVE - FAST_START_SPAN + 1
    fast = (fast_from + FAST_START_SPAN) // n < 100
    tried = 0
    for lines in BUCKET_LINES:
        bucket = lines * cacheline
        if int(sizes.max()) + POINTER > bucket:
            continue
        room = bucket - POINTER
        natural = nginx_start(n, 0, bucket, cacheline)  # max_size 0: where nginx starts without the fast path
        table = start = max(natural, fast_from) if fast else natural
        cap = max(TABLE_PER_ID * n, 2 * start)
        if fast:  # keep max_size / ids below 100, or nginx would start from `natural` again
            cap = min(cap, 100 * n - FAST_START_SPAN - 1)
        linear = max(1, LINEAR_WORK // n)
        while table <= cap:
            tried += 1
            if _fits(hashes, sizes, table, room):
                max_size = table + FAST_START_SPAN if fast else table
                if nginx_start(n, max_size, bucket, cacheline) == table or table - start < linear:
                    chosen = table  # nginx's first try, or the end of the same one-by-one walk
                else:
                    chosen = nginx_table_size(hashes, sizes, max_size, bucket, cacheline)
                assert chosen is not None  # `table` itself fits and lies in nginx's range
                return HashSizing(ids=n, key_len_min=min(map(len, keys)), key_len_max=max(map(len, keys)),
                                  bucket_size=bucket, max_size=max_size, table_size=chosen,
                                  hash_bytes=_hash_bytes(hashes, sizes, chosen, cacheline), tried=tried,
                                  cacheline=cacheline)
            table = table + 1 if table - start < linear else max(table + 1, int(table * GROWTH))
    raise MapError(f"no hash table of at most {TABLE_PER_ID * n} buckets of up to {BUCKET_LINES[-1] * cacheline} "
                   "bytes fits these ids")


# --------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class MapFacts:
    """``nginx-files.json``: the map beside it and the sizes nginx needs for it."""

    sizing: HashSizing
    map_bytes: int  # size of nginx-files.map, to notice a map replaced without its facts
    source: dict  # what the map was made from (the data set's parameters)
    format_version: int = MAP_FORMAT_VERSION

    def to_json(self) -> dict:
        return {"format_version": self.format_version, "map": MAP_NAME, "map_bytes": self.map_bytes,
                "source": self.source, "sizing": asdict(self.sizing),
                "nginx": {"map_hash_max_size": self.sizing.max_size,
                          "map_hash_bucket_size": self.sizing.bucket_size}}

    @classmethod
    def from_json(cls, data) -> "MapFacts":
        if not isinstance(data, dict) or data.get("format_version") != MAP_FORMAT_VERSION:
            raise MapError(f"{FACTS_NAME}: format_version is not {MAP_FORMAT_VERSION}")
        try:
            sizing = HashSizing(**data["sizing"])
            map_bytes, source = data["map_bytes"], data["source"]
        except (KeyError, TypeError) as exc:
            raise MapError(f"{FACTS_NAME}: missing or unexpected field ({exc})") from None
        if isinstance(map_bytes, bool) or not isinstance(map_bytes, int) or map_bytes <= 0:
            raise MapError(f"{FACTS_NAME}: map_bytes must be an integer > 0")
        if not isinstance(source, dict):
            raise MapError(f"{FACTS_NAME}: source must be an object")
        return cls(sizing=sizing, map_bytes=map_bytes, source=source)


def map_text(files: dict[str, str], check=None) -> str:
    """The map file: a header, then ``id path;`` per file. ``check(id, path)`` must accept every
    pair (ids and paths become nginx tokens, unquoted)."""
    lines = [f"# Generated by `uwsgi-layouts dataset` from index.json ({len(files)} ids): do not edit.",
             f"# Included inside nginx.conf's `map ${ID_VARIABLE} ${PATH_VARIABLE}`; sizes in {FACTS_NAME}."]
    for file_id, rel in files.items():
        if check is not None and not check(file_id, rel):
            raise MapError(f"id {str(file_id)[:20]!r} or its path is not a plain token")
        lines.append(f"{file_id} {rel};")
    return "\n".join(lines) + "\n"
