"""Numbers as a person reads them, one convention for the whole course: memory and message sizes in binary
units (KiB/MiB/GiB, as allocators and HBM capacities count), bandwidth in decimal GB/s (as NVLink, InfiniBand
and nccl-tests quote it), seconds in µs/ms/s."""

from __future__ import annotations

BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_unit(n: float) -> tuple[str, float]:
    """The binary unit a figure's axis uses for values up to `n`: (name, bytes in one)."""
    return next(((unit, size) for unit, size in BYTE_UNITS if abs(n) >= size), ("B", 1))


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, 21st."""
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def fmt_bytes(n: float) -> str:
    unit, size = byte_unit(n)
    return f"{n:.0f} B" if size == 1 else f"{n / size:,.2f} {unit}"


def fmt_rate(bytes_per_s: float) -> str:
    """Bandwidth in decimal GB/s, as NVLink specs and nccl-tests report it."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def fmt_time(seconds: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= size:
            return f"{seconds / size:.2f} {unit}"
    return f"{seconds * 1e9:.1f} ns"
