"""Numbers as a person reads them: bytes in KiB/MiB/GiB, seconds in µs/ms/s."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(seconds: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= size:
            return f"{seconds / size:.2f} {unit}"
    return f"{seconds * 1e9:.1f} ns"
