"""Human units, one grammar everywhere: node flags, CLI options, the PChannel CRD and the
chart's values (their `pattern`s are `SIZE_PATTERN` and `DURATION_PATTERN`, checked by
tests/kube/test_pchannel_kubectl.py).

- a size is a number and an optional unit: K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti
  (powers of 1024), optionally followed by B, any case (4096, 512Mi, 10GB, 1.5GiB);
  `unlimited` (or 0, where a bound is meant) is no bound;
- a duration is a number and an optional unit: ms, s (the default), m, h or d (200ms, 30,
  168h, 7d); `forever` (or 0, where a bound is meant) is no bound.
"""

from __future__ import annotations

import re

UNLIMITED = "unlimited"
FOREVER = "forever"
SIZE_PATTERN = r"^(unlimited|[0-9]+(\.[0-9]+)?([KkMmGgTt][Ii]?[Bb]?|[Bb])?)$"
DURATION_PATTERN = r"^(forever|[0-9]+(\.[0-9]+)?(ms|s|m|h|d)?)$"

_SIZE = re.compile(SIZE_PATTERN)
_DURATION = re.compile(DURATION_PATTERN)
_SIZE_FACTORS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 1024,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 1024**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 1024**4,
    "tib": 1024**4,
}
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_size(text: str) -> int:
    """Bytes (0 for `unlimited`)."""
    m = _SIZE.match(str(text).strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4MiB, 10GB, unlimited)")
    if m.group(1) == UNLIMITED:
        return 0
    number = m.group(1)[: len(m.group(1)) - len(m.group(3) or "")]
    return int(float(number) * _SIZE_FACTORS[(m.group(3) or "").lower()])


def parse_duration_ms(text: str) -> int:
    """Milliseconds (0 for `forever`)."""
    m = _DURATION.match(str(text).strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (examples: 200ms, 30s, 7d, forever)")
    if m.group(1) == FOREVER:
        return 0
    number = m.group(1)[: len(m.group(1)) - len(m.group(3) or "")]
    return int(float(number) * _DURATION_MS[m.group(3) or "s"])


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling of `ms` in the grammar (0: `forever`)."""
    if ms <= 0:
        return FOREVER
    for unit in ("d", "h", "m", "s"):
        if ms % _DURATION_MS[unit] == 0:
            return f"{ms // _DURATION_MS[unit]}{unit}"
    return f"{ms}ms"


def format_size(size: int) -> str:
    """The shortest exact spelling of `size` bytes in the grammar (0: `unlimited`)."""
    if size <= 0:
        return UNLIMITED
    spellings = [str(size)] + [
        f"{size // _SIZE_FACTORS[unit.lower()]}{unit}"
        for unit in ("Ti", "Gi", "Mi", "Ki", "TB", "GB", "MB", "KB")
        if size % _SIZE_FACTORS[unit.lower()] == 0
    ]
    return min(spellings, key=len)  # the first of the shortest: binary units first
