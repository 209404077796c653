"""A routine's answer as JSON-safe ``data``: the shape a routine's result takes, values as JSON, and
the bounds on rows, bytes and nesting."""

from __future__ import annotations

import base64
import json
import math
from datetime import date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any, Literal

from producers.formats import value_depth

Shape = Literal["call", "rows", "scalar", "record", "void"]


def result_data(cursor: Any, shape: Shape, *, max_rows: int, max_bytes: int, max_depth: int) -> Any:
    """The routine's answer (a DB-API cursor) as JSON-safe ``data``, bounded in rows, size and nesting."""
    names = [column[0] for column in cursor.description or []]
    omitted: str | None = None
    if shape == "rows":
        rows: list[dict[str, Any]] = []
        size = 0
        for row in cursor.fetchmany(max_rows + 1):
            if len(rows) == max_rows:
                omitted = f"the function returned more than {max_rows} rows; these are the first {max_rows}"
                break
            item = {name: jsonable(value) for name, value in zip(names, row, strict=True)}
            size += len(json.dumps(item, ensure_ascii=False))
            if size > max_bytes:
                omitted = f"the rows are larger than {max_bytes} bytes; these are the first {len(rows)}"
                break
            rows.append(item)
        data: dict[str, Any] = {"rows": rows}
        if omitted:
            data["_reach_omitted"] = omitted
    else:
        row = cursor.fetchone() if names else None
        record = {n: jsonable(v) for n, v in zip(names, row, strict=True)} if row is not None else None
        if shape == "call":
            data = record or {}
        elif shape == "record":
            data = {"result": record}
        else:
            data = {"result": record[names[0]] if record and shape == "scalar" else None}
        size = len(json.dumps(data, ensure_ascii=False))
        if size > max_bytes:
            return {
                "_reach_omitted": f"the result is larger than {max_bytes} bytes, the limit",
                "bytes": size,
            }
    depth = value_depth(data)
    if depth > max_depth:
        return {"_reach_omitted": f"the result nests {depth} levels; the limit is {max_depth}"}
    return data


def jsonable(value: Any) -> Any:
    """A value psycopg loaded, as JSON: numerics stay numbers when that is exact (else a string),
    times ISO 8601, intervals seconds, bytea base64, anything else (uuid, inet, ranges) its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE[str(value)]
    if isinstance(value, Decimal):
        return _decimal(value)
    if isinstance(value, (datetime, date, time_of_day)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _decimal(value: Decimal) -> int | float | str:
    if not value.is_finite():
        return "NaN" if value.is_nan() else ("Infinity" if value > 0 else "-Infinity")
    if value == value.to_integral_value() and abs(value) < 10**18:
        return int(value)
    number = float(value)
    return number if math.isfinite(number) and Decimal(repr(number)) == value else str(value)
