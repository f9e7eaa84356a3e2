"""Why the launcher cannot start: LaunchError (one line to print, and the exit status) and the statuses it uses."""

from __future__ import annotations

EXIT_NOT_FOUND = 127
EXIT_CANNOT_START = 2


class LaunchError(Exception):
    """Why the launcher cannot start: one line, and the exit status."""

    def __init__(self, message: str, status: int = EXIT_CANNOT_START) -> None:
        super().__init__(message)
        self.status = status
