"""The recall addon: trimflow_recall names the folder where the images trimflow cuts are kept for the run's MCP
server (trimflow._recall), with its bounds. Recall is on for a proxy given a run's token (TRIMFLOW_RECALL_TOKEN in
its environment: the launcher's, or one given by hand, docs/agents.md#recall); without one, or with the folder
empty, placeholders never offer recall and nothing is kept."""

from __future__ import annotations

import logging
import os

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .._human import format_size, parse_duration, parse_size
from .._recall import DEFAULT_CONVERSATION_BYTES, DEFAULT_MAX_BYTES, FOLDER_NAME, MAX_LIFETIME, TOKEN_VARIABLE, RecallStore, parse_token
from .options import confdir_path, exits_at_startup
from .state import SharedState

log = logging.getLogger("trimflow")

DEFAULT_RECALL = "{confdir}/" + FOLDER_NAME
OPTIONS = ("trimflow_recall", "trimflow_recall_size", "trimflow_recall_conversation_size", "trimflow_recall_lifetime", "confdir")


class Recall:
    name = "trimflow_recall"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_recall",
            str,
            DEFAULT_RECALL,
            "Folder where the images trimflow cuts are kept (0700, one 0600 file each) for `python -m trimflow mcp`, the "
            f"run's recall_image tool; on with a run's token in {TOKEN_VARIABLE} (the launcher's). {{confdir}} is "
            "mitmproxy's confdir. Empty: off, and placeholders never offer recall (docs/how-it-works.md#recall).",
        )
        loader.add_option(
            "trimflow_recall_size",
            str,
            format_size(DEFAULT_MAX_BYTES),
            "Most bytes the recall folder holds in all; the least recently used images go first. Bytes or k/m/g.",
        )
        loader.add_option(
            "trimflow_recall_conversation_size",
            str,
            format_size(DEFAULT_CONVERSATION_BYTES),
            "Most bytes of kept images per conversation; its least recently used go first. Bytes or k/m/g.",
        )
        loader.add_option(
            "trimflow_recall_lifetime",
            str,
            "24h",
            "How long a kept image stays after the last request that carried it (or the last recall): 90m, 24h, 7d.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if not updated & set(OPTIONS):
            return
        options = ctx.options
        try:
            sizes = [parse_size(options.trimflow_recall_size), parse_size(options.trimflow_recall_conversation_size)]
            lifetime = parse_duration(options.trimflow_recall_lifetime)
        except ValueError as exc:
            raise exceptions.OptionsError(f"trimflow: recall: {exc}") from None
        if None in sizes or not lifetime or not all(sizes):
            raise exceptions.OptionsError("trimflow: recall: its sizes and lifetime need a value above 0 (trimflow_recall empty turns it off)")
        if lifetime > MAX_LIFETIME:
            raise exceptions.OptionsError(f"trimflow: trimflow_recall_lifetime is at most {MAX_LIFETIME / 86400:g}d")
        max_bytes, conversation_bytes = sizes
        assert max_bytes is not None and conversation_bytes is not None
        folder = confdir_path(options.trimflow_recall, options.confdir)
        self.close()
        given = os.environ.get(TOKEN_VARIABLE)
        token = parse_token(given) if given else None
        if given and token is None:
            log.warning("trimflow: recall off: %s is not a run's token (hex, 16 bytes or more)", TOKEN_VARIABLE)
        if folder is None or token is None:
            return
        self.flows.recall = RecallStore(folder, token, max_bytes=max_bytes, conversation_bytes=conversation_bytes, lifetime=lifetime)

    def close(self) -> None:
        store, self.flows.recall = self.flows.recall, None
        if store is not None:
            store.flush(5.0)
            store.close()

    def done(self) -> None:
        self.close()
