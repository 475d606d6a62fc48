"""The equivalence margin of paired comparisons, checked apart from ``bench.paired`` (which
imports scipy): the options every tool parses (``bench.options``) check it too, and a tool that
compares nothing (``watch``, which runs for months, in a pod's 96Mi) must not load scipy and
numpy (about 90 MB resident) to parse its command line."""

from __future__ import annotations


class MarginError(ValueError):
    pass


def check_margin(margin: float) -> float:
    """The equivalence margin must lie in (0, 0.5): 0 would make equivalence impossible, 0.5
    would call a layout with half the throughput equivalent."""
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 < margin < 0.5):
        raise MarginError(f"margin: must be a share in (0, 0.5), e.g. 0.05 for ±5%, got {margin!r}")
    return float(margin)
