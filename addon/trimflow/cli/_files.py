"""`python -m trimflow files`: list the files send-once uploaded to a provider's Files API, and delete them
(docs/how-it-works.md#send-once). The key comes from the environment, as the provider's SDK reads it.

    files [--provider anthropic|openai|gemini] [--base-url URL] [list]
    files [--provider anthropic|openai|gemini] [--base-url URL] delete (--all | [--older-than 1d] | FILE_ID...)

Only the files trimflow uploaded (named trimflow-<digest>.<type>) are listed, and `--all`/`--older-than` delete only
those; a file id given by name is deleted whatever it is. Nothing here prints a key or a file's content.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.error
import urllib.request
from urllib.parse import quote, urlencode

from .._human import format_duration, format_size, parse_duration
from .._send_once import (
    ANTHROPIC,
    ANTHROPIC_FILES_BETA,
    FILENAME_PREFIX,
    GEMINI,
    GEMINI_KEY_HEADER,
    OPENAI,
    ListedFile,
    file_path,
    is_file_id,
    listed_files,
)
from .._text import for_text
from ._status import FAILED, SUCCESS, fail, say

COMMAND = "files"
# Per provider: the variable holding its key, the one holding a base URL, and its default.
_ENVIRONMENT = {
    ANTHROPIC: ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
    OPENAI: ("OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1"),
    GEMINI: ("GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com"),
}
_FALLBACK_KEYS = {GEMINI: "GOOGLE_API_KEY"}  # google-genai reads it when GEMINI_API_KEY is not set
ANTHROPIC_VERSION = "2023-06-01"
TIMEOUT = 60.0
MAX_PAGES = 1000  # pages of a listing read at most (a hundred files each): a provider that never stops paging is cut off
ANSWER_MAX = 16 << 20


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trimflow files", description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=sorted(_ENVIRONMENT), default=ANTHROPIC, help="whose Files API (default %(default)s)")
    parser.add_argument(
        "--base-url", help="the API's base URL (default: $ANTHROPIC_BASE_URL, $OPENAI_BASE_URL or $GOOGLE_GEMINI_BASE_URL, else the provider's)"
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("list", help="the files trimflow uploaded under the key (the default)")
    delete = commands.add_parser("delete", help="delete files: every one trimflow uploaded, those older than a duration, or those named")
    delete.add_argument("--all", action="store_true", help="every file trimflow uploaded under the key")
    delete.add_argument("--older-than", help="only those uploaded longer ago than this (e.g. 1d, 12h)")
    delete.add_argument("file_ids", nargs="*", metavar="FILE_ID")
    args = parser.parse_args(argv)
    key_variable, url_variable, default_url = _ENVIRONMENT[args.provider]
    key = (os.environ.get(key_variable, "") or os.environ.get(_FALLBACK_KEYS.get(args.provider, ""), "")).strip()
    if not key:
        return fail(COMMAND, f"no key: set {key_variable}")
    api = _Api(args.provider, _files_url(args.provider, args.base_url or os.environ.get(url_variable) or default_url), key)
    if args.command == "delete":
        older = None
        if args.older_than is not None:
            try:
                older = parse_duration(args.older_than)
            except ValueError as exc:
                parser.error(str(exc))
        if not (args.all or older is not None or args.file_ids):
            parser.error("delete needs --all, --older-than or file ids")
        bad = [file_id for file_id in args.file_ids if not is_file_id(file_id)]
        if bad:
            parser.error(f"not a file id: {for_text(bad[0])}")
        return _delete(api, args.file_ids, older if older is not None else (0.0 if args.all else None))
    return _list(api)


def _files_url(provider: str, base: str) -> str:
    """The Files API's URL under a base URL as each SDK takes it (OpenAI's ends in /v1, Anthropic's and Gemini's do not)."""
    base = base.rstrip("/")
    if provider == GEMINI:
        return f"{base.removesuffix('/v1beta')}/v1beta/files"
    if provider == OPENAI:
        base = base.removesuffix("/v1")
    return f"{base}/v1/files"


class _Api:
    def __init__(self, provider: str, url: str, key: str) -> None:
        self.provider, self.url = provider, url
        if provider == ANTHROPIC:
            self.headers = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION, "anthropic-beta": ANTHROPIC_FILES_BETA}
        elif provider == GEMINI:
            self.headers = {GEMINI_KEY_HEADER: key}
        else:
            self.headers = {"authorization": f"Bearer {key}"}

    def call(self, method: str, url: str) -> bytes:
        request = urllib.request.Request(url, method=method, headers=self.headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return bytes(answer.read(ANSWER_MAX))

    def files(self) -> list[ListedFile]:
        """Every file trimflow uploaded under the key, newest first."""
        found: list[ListedFile] = []
        after: str | None = None
        for _ in range(MAX_PAGES):
            query = {"pageSize" if self.provider == GEMINI else "limit": "100"}
            if after is not None:
                query[{ANTHROPIC: "after_id", GEMINI: "pageToken"}.get(self.provider, "after")] = after
            page, after = listed_files(self.call("GET", f"{self.url}?{urlencode(query)}"), self.provider)
            found += [f for f in page if f.filename.startswith(FILENAME_PREFIX)]
            if after is None:
                break
        return found


def _list(api: _Api) -> int:
    try:
        files = api.files()
    except (OSError, ValueError) as exc:
        return fail(COMMAND, f"cannot list the files at {api.url}: {_why(exc)}", FAILED)
    now = time.time()
    for f in files:
        age = format_duration(now - f.created_at) if f.created_at is not None else "-"
        print(for_text(f"{f.file_id}  {format_size(f.size)}  uploaded {age} ago  {f.filename}"))
    say(COMMAND, f"{len(files)} files trimflow uploaded at {api.url}")
    return SUCCESS


def _delete(api: _Api, named: list[str], older_than: float | None) -> int:
    targets = list(named)
    if older_than is not None:
        try:
            files = api.files()
        except (OSError, ValueError) as exc:
            return fail(COMMAND, f"cannot list the files at {api.url}: {_why(exc)}", FAILED)
        now = time.time()
        targets += [f.file_id for f in files if f.created_at is None or now - f.created_at >= older_than]
    unique = list(dict.fromkeys(targets))
    failed = 0
    for file_id in unique:
        try:
            api.call("DELETE", file_path(api.url, quote(file_id)))
        except (OSError, ValueError) as exc:
            failed += 1
            say(COMMAND, f"{file_id} not deleted: {_why(exc)}")
    say(COMMAND, f"deleted {len(unique) - failed} of {len(unique)} files at {api.url}")
    return FAILED if failed else SUCCESS


def _why(exc: BaseException) -> str:
    """An error's short reason: the status of an HTTP error, never its body (which may quote the request)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"status {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return type(exc).__name__


__all__ = ["main"]
