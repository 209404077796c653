"""The tables the ``reach`` commands and the demo print, drawn by rich.

On a terminal: a bold header, columns fitted to its width. Anywhere else (a pipe, a file, a
test): plain text with an ASCII rule, one line per row, no trailing spaces, so ``grep``,
``awk`` and ``split()`` work.
Cells are never read as rich markup (a dead letter's preview may contain ``[bold]``).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Sequence
from typing import IO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# a header, a rule of dashes under it, nothing else
_PLAIN = box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)


def print_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], *, max_width: int = 48, file: IO[str] | None = None
) -> None:
    """Print ``rows`` under ``header``; a cell longer than ``max_width`` is cut with an ellipsis."""
    out = file or sys.stdout
    terminal = Console(file=out, highlight=False)
    # plain: no left padding, so each dash of the rule starts under its column's first character
    table = Table(
        box=box.SIMPLE_HEAD if terminal.is_terminal else _PLAIN,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1) if terminal.is_terminal else (0, 1, 0, 0),
        header_style="bold" if terminal.is_terminal else None,
    )
    for name in header:
        table.add_column(Text(name), no_wrap=True, overflow="ellipsis", max_width=max_width)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    if terminal.is_terminal:
        terminal.print(table)
        return
    # wide enough that no column is squeezed: a row stays one line
    buffer = Console(file=io.StringIO(), width=10_000, no_color=True, highlight=False)
    buffer.print(table)
    assert isinstance(buffer.file, io.StringIO)
    out.write("".join(line.rstrip() + "\n" for line in buffer.file.getvalue().splitlines()))
