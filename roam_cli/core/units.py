"""Byte quantities as people write them."""

import re

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def format_beside(n: int, reference: int) -> str:
    """n in words, and how far it is from `reference` where the two read the same at two decimals
    (a batch that needs 80.00 GiB beside a budget of 80.00 GiB: by how much it is over or under)."""
    text = format_bytes(n)
    if n != reference and text == format_bytes(reference):
        text += f" ({'+' if n > reference else '-'}{format_bytes(abs(n - reference))})"
    return text


def parse_bytes(text: str) -> int:
    """'16GiB', '1.5 GB', '4096' -> bytes. Raises ValueError on anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"not a byte size: {text!r} (examples: 16GiB, 512MB, 4096)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])
