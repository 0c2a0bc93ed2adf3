"""The gradebook as the instructor reads it: whatever a notebook wrote (a file name, an error's message) reaches
the terminal, scores.csv and scores.json as text only.

Printed text and every CSV cell have their control characters escaped (an escape sequence would otherwise move
the terminal's cursor, recolour or retitle it, or hide a line; a bidirectional override would reorder what is
read); a CSV cell that a spreadsheet would take for a formula (=, +, -, @, tab, carriage return first) is kept as
text by a leading apostrophe. scores.json is JSON, which escapes control characters itself.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

# C0 and C1 controls, DEL, and the invisible characters that reorder or hide text (bidirectional controls,
# line and paragraph separators, zero-width characters)
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def printable(text: Any) -> str:
    """`text` with each control character written as its escape (\\x1b, \\u202e), on one line."""
    return CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs: text printable, and never starting as a formula does."""
    if not isinstance(value, str):
        return value
    return "'" + printable(value) if value.startswith(FORMULA_STARTS) else printable(value)


def write(rows: list[dict], out: Path, fields: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: cell(v) for k, v in row.items()} for row in rows)
    (out / "scores.json").write_text(json.dumps(rows, indent=1))
