"""Human units in flags and resources: sizes (4MiB, 10GB) and durations (200ms, 7d)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
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
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_size(text: str) -> int:
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4MiB, 10GB)")
    return int(float(m.group(1)) * _SIZE_FACTORS[(m.group(2) or "").lower()])


def parse_duration_ms(text: str) -> int:
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (examples: 200ms, 30s, 7d)")
    return int(float(m.group(1)) * _DURATION_MS[m.group(2) or "s"])
