"""Why the launcher cannot start: LaunchError (one line to print, and the exit status) and the statuses it uses."""

from __future__ import annotations

from ._status import NOT_FOUND as EXIT_NOT_FOUND
from ._status import USAGE_ERROR as EXIT_CANNOT_START

__all__ = ["EXIT_CANNOT_START", "EXIT_NOT_FOUND", "LaunchError"]


class LaunchError(Exception):
    """Why the launcher cannot start: one line, and the exit status."""

    def __init__(self, message: str, status: int = EXIT_CANNOT_START) -> None:
        super().__init__(message)
        self.status = status
