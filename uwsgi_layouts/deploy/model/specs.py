"""Layout specs: the text a user writes (``PxT-STRATEGY``, ``PxT-STRATEGY@option=value,...``) and
a layout.json's record, read into a validated ``Layout``."""

from __future__ import annotations

import re
from dataclasses import fields

from uwsgi_layouts.deploy.model.errors import LayoutError
from uwsgi_layouts.deploy.model.fields import int_in
from uwsgi_layouts.deploy.model.layout import MAX_PROCESSES, MAX_THREADS, Layout
from uwsgi_layouts.deploy.model.strategies import STRATEGIES

SPEC_RE = re.compile(r"^(?P<p>[+-]?\d+)x(?P<t>[+-]?\d+)-(?P<strategy>[A-Za-z0-9_-]+)$")

# What a user (an option, a variant, layout.json) may set: every field but the machine's.
OPTION_FIELDS = tuple(f.name for f in fields(Layout) if f.name != "run_as")


def parse_layout(spec: str, **options) -> Layout:
    """Build a Layout from ``PxT-STRATEGY`` plus keyword options (strings or values)."""
    match = SPEC_RE.match(spec.strip()) if isinstance(spec, str) else None
    if not match:
        raise LayoutError(
            "layout",
            f"expected PxT-STRATEGY such as 2x4-mapped (strategies: {', '.join(STRATEGIES)}), got {spec!r}",
        )
    unknown = set(options) - set(OPTION_FIELDS) - {"name"}
    if unknown:
        raise LayoutError(sorted(unknown)[0], "unknown option")
    from_spec = sorted(set(options) & {"processes", "threads", "strategy"})
    if from_spec:  # would reach Layout() twice and raise TypeError
        raise LayoutError(from_spec[0], f"comes from the layout spec {spec.strip()!r}, not from an option")
    return Layout(
        processes=int_in("processes", match["p"], 1, MAX_PROCESSES),
        threads=int_in("threads", match["t"], 1, MAX_THREADS),
        strategy=match["strategy"],
        **{k: v for k, v in options.items() if v is not None and k != "name"},  # name is derived (see to_dict)
    )


def layout_from_record(data: dict) -> Layout:
    """The Layout a layout.json records, validated again (the app or its venv may have changed).
    Format 1 recorded ``protocol: http`` for uWSGI layouts too (then gunicorn's option only): it
    meant the uwsgi protocol."""
    options = {k: data[k] for k in OPTION_FIELDS if k in data}
    strategy = STRATEGIES.get(data.get("strategy"))
    if data.get("format_version", 1) < 2 and strategy is not None and strategy.server == "uwsgi":
        options.pop("protocol", None)
    return Layout(**options)


def parse_variant(text: str, **defaults) -> Layout:
    """``PxT-STRATEGY@option=value,option=value``: a layout plus options under one label, so
    a benchmark can compare e.g. ``2x4-mapped@aio=threads`` with ``2x4-mapped@aio=off``.
    Options after ``@`` override ``defaults``."""
    spec, sep, extra = str(text).partition("@")
    options = dict(defaults)
    if sep:
        for item in extra.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or not key:
                raise LayoutError("layout", f"expected OPTION=VALUE after '@' in {text!r}, got {item!r}")
            if key in ("run_dir", "listen", "base_port", "stats_port"):
                raise LayoutError(key, "is chosen by the benchmark, not by a variant")
            options[key] = value.strip()
    return parse_layout(spec, **options)
