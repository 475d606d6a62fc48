"""Read-only containers: what every record of this package (``Results``, ``Cell``, ``Step``,
``FaultRecord``, ``Diagnosis``) hands out, so that no reader can change a record after it was
validated (a change makes a new record: ``dataclasses.replace``)."""

from __future__ import annotations

READ_ONLY = "a results record is read-only after creation: make a new one (dataclasses.replace)"


class ReadOnlyDict(dict):
    """A dict that refuses every change: what a record hands out. Still a dict
    (``isinstance`` checks, ``json``, ``{**d}`` and ``d | other`` work as before); copies (``dict(d)``,
    ``d | other``) are ordinary dicts."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return (ReadOnlyDict, (dict(self),))


class ReadOnlyList(list):
    """A list that refuses every change (see ``ReadOnlyDict``)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = remove = pop = clear = sort = \
        reverse = _refuse

    def __reduce__(self):
        return (ReadOnlyList, (list(self),))


def read_only(value):
    """``value`` with every dict and list in it, at any depth, made read-only (copied: the
    caller's own dict stays the caller's). A plain tuple stays a tuple, its items made read-only
    (a tuple of dicts, such as a diagnosis's findings, would otherwise hand out changeable dicts);
    a named tuple is left as it is (its type says what it holds)."""
    if isinstance(value, dict):
        return ReadOnlyDict((k, read_only(v)) for k, v in value.items())
    if isinstance(value, list):
        return ReadOnlyList(read_only(v) for v in value)
    if type(value) is tuple:
        return tuple(read_only(v) for v in value)
    return value
