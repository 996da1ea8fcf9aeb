"""Plain-text tables for the ledger's commands."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, max_cell: int = 90) -> str:
    """Left-aligned columns as wide as their widest cell, a rule under the headers; one line a row."""
    cells = [[_cut(str(cell), max_cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    lines = [list(headers), ["-" * w for w in widths], *cells]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
