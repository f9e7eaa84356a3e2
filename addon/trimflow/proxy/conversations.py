"""The conversations addon: where this process shares each conversation's last turn with the other trimflow processes
(trimflow._last_turns), so that behind a balancer they cut a conversation as one. trimflow_conversations names the
SQLite file of one host; trimflow_state a Redis or Valkey server instances on many hosts share
(trimflow._state_store), used instead of the file, and instead of the learned-limits file too (Recover)."""

from __future__ import annotations

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .._human import parse_duration
from .._last_turns import FILE_NAME, LastTurns, TurnStore
from .._state_store import DEADLINE, PASSWORD_VARIABLE, LearnedInStore, StateRefused, checked_url, password_from
from .options import confdir_path, exits_at_startup
from .recover import Recover
from .state import SharedState

DEFAULT_CONVERSATIONS = "{confdir}/" + FILE_NAME
OPTIONS = ("trimflow_conversations", "trimflow_state", "trimflow_state_password_file", "trimflow_state_deadline", "confdir")


class ShareConversations:
    name = "trimflow_conversations"

    def __init__(self, flows: SharedState, recover: Recover | None = None) -> None:
        self.flows, self.recover = flows, recover
        self._state: tuple[str, str | None] | None = None  # the store's URL and password in effect

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_conversations",
            str,
            DEFAULT_CONVERSATIONS,
            "SQLite file where each conversation's last turn (where its cut ended, when it went; digests only) is "
            "shared by the trimflow instances that name it, so that several behind a balancer cut as one "
            "(docs/caching.md); {confdir} is mitmproxy's confdir. Empty: this process remembers its own only.",
        )
        loader.add_option(
            "trimflow_state",
            str,
            "",
            "redis://HOST:PORT/DB, rediss://HOST:PORT/DB (TLS) or unix://PATH: a Redis or Valkey server where instances "
            "on many hosts share each conversation's last turn (digests and counts only) and the learned limits, used "
            "instead of trimflow_conversations and trimflow_learned (docs/deployment.md). No password in it: see trimflow_state_password_file.",
        )
        loader.add_option(
            "trimflow_state_password_file",
            str,
            "",
            f"File whose first line is trimflow_state's password (AUTH); empty: {PASSWORD_VARIABLE} if set, else none.",
        )
        loader.add_option(
            "trimflow_state_deadline",
            str,
            str(DEADLINE),
            "Seconds a request may wait for trimflow_state, its read as a whole (0.005: 5 ms); past it the request goes on "
            "with this instance's own memory.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if not updated & set(OPTIONS):
            return
        before = self._state
        store = self._store()
        conversations = self.flows.conversations
        if conversations.shared is not None:
            conversations.shared.close()
        conversations.shared = store
        state = self._state
        if self.recover is not None and state != before:
            # The learned limits too, in place of their file (read and written by their own thread).
            self.recover.share_learned((lambda ttl: LearnedInStore(state[0], state[1], ttl)) if state is not None else None)

    def _store(self) -> TurnStore | None:
        """The store the options name: opened on first use (the file) or connected by a thread of its own (Redis); one
        that cannot be used says why in one line, and the process goes on with its own memory."""
        url = ctx.options.trimflow_state
        if url:
            try:
                checked_url(url)
                password = password_from(ctx.options.trimflow_state_password_file)
                deadline = _deadline(ctx.options.trimflow_state_deadline)
                from .._state_store import RedisState

                shared = RedisState(url, password, deadline)
                self._state = (url, password)
                return shared
            except StateRefused as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
            except ImportError:
                raise exceptions.OptionsError("trimflow: trimflow_state needs the redis client: pip install 'trimflow[team]'") from None
        self._state = None
        path = confdir_path(ctx.options.trimflow_conversations, ctx.options.confdir)
        return LastTurns(path) if path is not None else None

    def done(self) -> None:
        if self.flows.conversations.shared is not None:
            self.flows.conversations.shared.close()
            self.flows.conversations.shared = None


def _deadline(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= 10:
        raise StateRefused(f"trimflow_state_deadline: {text!r} is not seconds between 0 and 10 (0.005: 5 ms)")
    return seconds
