"""The conversations addon: trimflow_conversations names the file of last turns this process shares with the other
trimflow processes that name it (trimflow._last_turns), so that behind a balancer they cut a conversation as one."""

from __future__ import annotations

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from .._last_turns import FILE_NAME, LastTurns
from .options import confdir_path
from .state import SharedState

DEFAULT_CONVERSATIONS = "{confdir}/" + FILE_NAME


class ShareConversations:
    name = "trimflow_conversations"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_conversations",
            str,
            DEFAULT_CONVERSATIONS,
            "SQLite file where each conversation's last turn (where its cut ended, when it went; digests only) is "
            "shared by the trimflow instances that name it, so that several behind a balancer cut as one "
            "(docs/caching.md); {confdir} is mitmproxy's confdir. Empty: this process remembers its own only.",
        )

    def configure(self, updated: set[str]) -> None:
        if "trimflow_conversations" not in updated and "confdir" not in updated:
            return
        path = confdir_path(ctx.options.trimflow_conversations, ctx.options.confdir)
        conversations = self.flows.conversations
        if conversations.shared is not None:
            conversations.shared.close()
        # Opened on first use; a file that cannot be used says why in one line, and the process goes on with its own memory.
        conversations.shared = LastTurns(path) if path is not None else None

    def done(self) -> None:
        if self.flows.conversations.shared is not None:
            self.flows.conversations.shared.close()
            self.flows.conversations.shared = None
