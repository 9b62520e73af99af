"""The ``NAME:key=value,...`` grammar of the command line's specifications.

One parser for every specification of that shape: placement policies (``--policy
retainz-noisy:error=0.25,seed=1``, :func:`retainz.placement.make_allocator`), retention rules
(``--retention torchtitan:interval=500,keep_latest_k=10``, :func:`retainz.retention.parse_rule`)
and in-memory devices (``mem:zones=64,zone_size=1MiB``, :func:`retainz.zoned.spec.open_device`).
It splits the text only; each caller checks the name and converts the values, because only it
knows the keys and their types.
"""

from __future__ import annotations

__all__ = ["parse_spec"]


def parse_spec(text: str, what: str) -> tuple[str, list[tuple[str, str]]]:
    """Split ``NAME[:key=value,...]`` into the name and the ``(key, value)`` pairs.

    Whitespace around the name, each key and each value is dropped; empty items (``a=1,,b=2``,
    a trailing comma) are skipped.  The name may be empty (``:k=v``, or ``""``): the caller decides
    whether that is an error.

    Args:
        text: the specification.
        what: what it specifies, for the error message (``"policy"``, ``"retention rule"``...).

    Returns:
        ``(name, [(key, raw value), ...])`` in the order given.

    Raises:
        ValueError: an item without ``=`` or with an empty key: ``"{what} {NAME}: expected key=value,
            got '{item}'"``; a key given twice: ``"{what} {NAME}: key {key} given twice"`` (one line).
    """
    name, _, rest = text.strip().partition(":")
    name = name.strip()
    pairs = []
    for item in rest.split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{what} {name or repr(text)}: expected key=value, got {item!r}")
        key = key.strip()
        if any(k == key for k, _ in pairs):
            raise ValueError(f"{what} {name or repr(text)}: key {key} given twice")
        pairs.append((key, value.strip()))
    return name, pairs
