"""The metrics JSONL file: one JSON line appended per record; a write error is logged once and never stops forwarding."""

from __future__ import annotations

import logging
import os
from typing import IO

import orjson

from ._record import Record

log = logging.getLogger("trimflow")


class MetricsFile:
    """Appends one JSON line per record. A write error is logged once and never stops forwarding."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._failing = False

    def write(self, record: Record, error: str | None = None) -> None:
        """One line: the record's fields, and `error` (why the flow ended without an answer) when given."""
        line = record.to_json() if error is None else orjson.dumps({**record.to_dict(), "error": error})
        try:
            if self._file is None:
                directory = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(directory, exist_ok=True)
                self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across writes
            self._file.write(line + b"\n")
            self._file.flush()
            if self._failing:
                log.info("trimflow: metrics file %s is writable again", self.path)
                self._failing = False
        except OSError as exc:
            self._drop_file()
            if not self._failing:
                log.error("trimflow: cannot write metrics to %s (%s); forwarding continues", self.path, exc.strerror or type(exc).__name__)
                self._failing = True

    def _drop_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def close(self) -> None:
        self._drop_file()
