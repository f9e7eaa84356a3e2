"""The memory addon: trimflow_keep_memory keeps freed body memory in the process, and worker threads share malloc
arenas, so the memory image decoding frees can go back to the system (glibc; see trimflow._malloc)."""

from __future__ import annotations

import logging

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from .._human import format_size
from .._malloc import TRIM_THRESHOLD, keep_freed_memory, share_arenas

log = logging.getLogger("trimflow")


class KeepMemory:
    name = "trimflow_memory"

    def __init__(self) -> None:
        self.kept = False  # trimflow_keep_memory took effect (it cannot be undone)
        self.shared = False  # worker threads share arenas

    def load(self, loader: Loader) -> None:
        # At load, before the first worker thread: an arena made before it would stay (not glibc: nothing to do).
        self.shared = share_arenas() is None
        loader.add_option(
            "trimflow_keep_memory",
            bool,
            True,
            f"On Linux with glibc, keep up to {format_size(TRIM_THRESHOLD)} of freed memory in this process instead of "
            "returning it after each request: a pruned body otherwise makes glibc give the heap back and fault it in "
            "again while the next body is read (docs/options.md). Affects the whole process; turning it off takes a restart.",
        )

    def configure(self, updated: set[str]) -> None:
        if "trimflow_keep_memory" in updated and ctx.options.trimflow_keep_memory and not self.kept:
            why_not = keep_freed_memory()
            self.kept = why_not is None
            if why_not is not None:
                log.info("trimflow: trimflow_keep_memory has no effect here: %s", why_not)
