"""The one table printer (``workers.ops.table``) outside a terminal: what scripts and tests parse."""

from __future__ import annotations

import io

from workers.ops.table import print_table


def render(header: tuple[str, ...], rows: list[tuple[object, ...]], **kwargs: int) -> list[str]:
    out = io.StringIO()  # not a terminal
    print_table(header, rows, file=out, **kwargs)
    return out.getvalue().splitlines()


def test_plain_output_is_a_header_a_rule_of_dashes_and_one_line_per_row() -> None:
    lines = render(
        ("connector", "queued", "last error"), [("tickets", 0, "-"), ("crm", None, "DOWNSTREAM_TIMEOUT 3s ago")]
    )
    assert lines[0].split() == ["connector", "queued", "last", "error"]
    assert set(lines[1]) == {"-", " "} and lines[1].startswith("-")
    assert [line.split()[:2] for line in lines[2:]] == [["tickets", "0"], ["crm", "None"]]
    assert all(line == line.rstrip() for line in lines)
    assert all(line.isascii() for line in lines)


def test_columns_line_up_under_their_header() -> None:
    lines = render(("a", "second"), [("longer value", "x")])
    assert lines[0].index("second") == lines[2].index("x") == lines[1].index(" -") + 1


def test_cells_are_never_read_as_markup() -> None:
    lines = render(("preview",), [("[bold]not bold[/bold] [link=x]y",)])
    assert lines[2] == "[bold]not bold[/bold] [link=x]y"


def test_a_long_cell_is_cut_with_an_ellipsis_and_a_wide_table_is_not_wrapped() -> None:
    lines = render(("id", "reason", "preview"), [("m-1", "r" * 200, "p" * 200)], max_width=48)
    assert len(lines) == 3
    assert lines[2].split()[1] == "r" * 47 + "…"


def test_no_rows_still_prints_the_header() -> None:
    assert render(("message id", "reason"), [])[0].split() == ["message", "id", "reason"]
