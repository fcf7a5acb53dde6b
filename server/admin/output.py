"""What an admin command prints: tables with the Kafka tool's column names, or the same rows as JSON with ``--json``.

A command returns a :class:`Report`: tables (each a header row and rows of plain values; ``None``
prints as ``-``) and notes for people, or for an action a sentence plus the data it acted on.
``--json`` prints the report's data (by default each table as a list of objects whose keys are
the column names in snake_case: ``CURRENT-OFFSET`` → ``current_offset``,
``TransactionalId`` → ``transactional_id``) and no notes.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any, Sequence

from trireme.wire.schema import snake_case


@dataclasses.dataclass
class Table:
    headers: Sequence[str]
    rows: list[Sequence[Any]]

    def records(self) -> list[dict[str, Any]]:
        keys = [json_key(h) for h in self.headers]
        return [dict(zip(keys, row)) for row in self.rows]

    def text(self) -> str:
        cells = [list(self.headers)] + [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


@dataclasses.dataclass
class Report:
    tables: list[Table] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)       # for people: printed before the tables
    warnings: list[str] = dataclasses.field(default_factory=list)    # on stderr, also with --json
    data: Any = None                                                  # the --json document, if not the tables

    def json_document(self) -> Any:
        if self.data is not None:
            return self.data
        if len(self.tables) == 1:
            return self.tables[0].records()
        return [t.records() for t in self.tables]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def json_key(header: str) -> str:
    return snake_case(re.sub(r"[^A-Za-z0-9]+", "_", header).strip("_")).replace("__", "_")


def render(report: Report, as_json: bool, prefix: str) -> None:
    for warning in report.warnings:
        print(f"{prefix}: warning: {warning}", file=sys.stderr)
    out = sys.stdout
    if as_json:
        json.dump(report.json_document(), out, indent=2)
        out.write("\n")
        return
    parts = (["\n".join(report.notes)] if report.notes else []) + [t.text() for t in report.tables]
    out.write("\n\n".join(parts) + ("\n" if parts else ""))
