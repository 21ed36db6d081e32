"""`ExactSum`: SUM of a money column, computed by the database and exact on PostgreSQL and SQLite.

PostgreSQL sums `NUMERIC` exactly, so there the sum is `SUM(column)`. SQLite keeps an
`ExactDecimal` as text (`catalog.tables`), and its `SUM` over text goes through floats — a report
summed that way would be off in the last digits. Reading every row into Python to add `Decimal`s
would be exact but would make a report's time and memory grow with the ledger. So on SQLite the
database sums integers instead, which it does exactly: the stored text always has the column's
full scale of fraction digits and never an exponent (`ExactDecimal.sqlite_text`), so it splits
into its integer part and 9-digit pieces of its fraction, each cast to an integer and signed;
SQLite returns one integer sum per piece and `read` recombines them into one `Decimal`.

Every piece stays far inside SQLite's 64-bit integers (a 9-digit piece is below 1e9, so billions
of rows fit), and SQLite raises "integer overflow" rather than wrapping: a sum is exact or an
error, never quietly wrong.
"""

from __future__ import annotations

from decimal import Context, Decimal
from typing import Any

from sqlalchemy import Integer, case, cast, func
from sqlalchemy.sql.elements import ColumnElement

from catalog.tables import COST_SCALE

_PIECE = 9  # fraction digits per integer piece
_EXACT = Context(prec=80)  # wide enough that no sum a NUMERIC(30, 18) column can hold is rounded


class ExactSum:
    """`SUM(column)` as an exact `Decimal`: put `columns` in the SELECT, then `read(row)`.

    `read` gives None when every summed value was NULL (or there were no rows), like SQL's SUM."""

    def __init__(self, column: Any, label: str, dialect_name: str, scale: int = COST_SCALE) -> None:
        self.label = label
        self.scale = scale
        self.sqlite = dialect_name == "sqlite"
        self.columns: list[ColumnElement[Any]] = (
            self._sqlite_pieces(column) if self.sqlite else [func.sum(column).label(label)]
        )

    def _sqlite_pieces(self, column: Any) -> list[ColumnElement[Any]]:
        text = func.ltrim(column, "-")
        point = func.instr(text, ".")
        sign = case((func.substr(column, 1, 1) == "-", -1), else_=1)
        integer = cast(func.substr(text, 1, point - 1), Integer)
        pieces: list[ColumnElement[Any]] = [func.sum(sign * integer).label(f"{self.label}_0")]
        for index, start in enumerate(range(0, self.scale, _PIECE), start=1):
            digits = cast(func.substr(text, point + 1 + start, _PIECE), Integer)
            pieces.append(func.sum(sign * digits).label(f"{self.label}_{index}"))
        return pieces

    def read(self, row: Any) -> Decimal | None:
        """The sum in `row` (a result row with this sum's columns), exact, at the column's scale."""
        mapping = row._mapping
        if not self.sqlite:
            value = mapping[self.label]
            return None if value is None else self._exact(Decimal(value))
        integer = mapping[f"{self.label}_0"]
        if integer is None:
            return None
        total = Decimal(integer)
        for index, start in enumerate(range(0, self.scale, _PIECE), start=1):
            width = min(_PIECE, self.scale - start)
            total = _EXACT.add(total, Decimal(f"{mapping[f'{self.label}_{index}']}E-{start + width}"))
        return self._exact(total)

    def _exact(self, value: Decimal) -> Decimal:
        return value.quantize(Decimal(f"1E-{self.scale}"), context=_EXACT)


def decimal_text(value: Decimal) -> str:
    """A decimal as reports print it: exact, no exponent, no trailing zeros (`0.000246`, `12`)."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text
