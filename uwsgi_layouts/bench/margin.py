"""The equivalence margin of paired comparisons, checked apart from ``bench.paired`` (which
imports scipy): the options every tool parses (``bench.options``) check it too, and a tool that
compares nothing (``watch``, which runs for months, in a pod's 96Mi) must not load scipy and
numpy (about 90 MB resident) to parse its command line."""

from __future__ import annotations

from uwsgi_layouts.arguments import Numbers

# The margin's range, written once: --margin parses with it, stored runs are checked against it.
MARGIN = Numbers(0, 0.5, open_low=True, open_high=True, noun="a share", example="0.05 for ±5%")


class MarginError(ValueError):
    pass


def check_margin(margin: float) -> float:
    """The equivalence margin must lie in (0, 0.5): 0 would make equivalence impossible, 0.5
    would call a layout with half the throughput equivalent."""
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin in MARGIN):
        raise MarginError(f"margin: must be {MARGIN.allowed}, got {margin!r}")
    return float(margin)
