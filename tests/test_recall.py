"""trimflow._recall: the images kept for recall, written by the proxy's side and read by the MCP server's, byte for byte;
private files in private folders, never a key or a text of the request; bounds per conversation and in all (the
least recently used first), the lifetime and its expiry answer; one run's reader never reads another's; the run
bound to one owner; a folder that is not what the store makes refused (links, someone else's, huge files, garbage,
bytes that are not their id's); a folder that cannot be written turns recall off with one line. The placeholders
that name the ids: tests/test_placeholder.py; the addon: tests/proxy/test_recall.py; the server: tests/cli/test_mcp.py."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trimflow import DEFAULT_RULES_PATH, load_rules
from trimflow._engine import prune
from trimflow._recall import (
    MAX_IMAGE_BYTES,
    RECALLS_FILE,
    IdMemo,
    Kept,
    RecallError,
    RecallReader,
    RecallStore,
    image_id,
    owner_of,
    parse_token,
    run_folder,
)
from trimflow.formats import Media
from trimflow.testing import image

from .helpers import encode, url_for
from .images import chat_with_images

TOKEN = bytes(range(32))
OTHER_TOKEN = bytes(range(1, 33))
KEY = "sk-test-recall-key-0123456789"
HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def kept(raw: bytes, mime: str = "image/png") -> Kept:
    return Kept(image_id(raw), Media("image", ("messages", 0), base64.b64encode(raw).decode()), mime)


def shot(seed: int, side: int = 64) -> bytes:
    return image(side, side, "PNG", seed=seed)


def store_at(path: Path, token: bytes = TOKEN, **bounds: float) -> RecallStore:
    store = RecallStore(str(path), token, **bounds)  # type: ignore[arg-type]
    assert store.accepts(owner_of(token, HEADERS))
    return store


def written(store: RecallStore, conversation: str, *raws: bytes) -> None:
    store.offer(conversation, [kept(raw) for raw in raws])
    assert store.flush()


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_an_image_written_is_read_back_byte_for_byte_from_private_files(tmp_path: Path) -> None:
    folder = tmp_path / "confdir" / "trimflow-recall"
    store = store_at(folder)
    raws = [shot(1), image(80, 60, "JPEG", seed=2)]
    store.offer("c0ffee00", [kept(raws[0]), kept(raws[1], "image/jpeg")])
    assert store.flush()
    reader = RecallReader(str(folder), TOKEN)
    for raw, mime in zip(raws, ("image/png", "image/jpeg"), strict=True):
        got = reader.read(image_id(raw))
        assert (got.data, got.mime) == (raw, mime)
    assert reader.read(image_id(raws[0]).upper()).data == raws[0]  # as a model may write it
    for path in (folder, folder / run_folder(TOKEN)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    entries = files_of(folder)
    assert {p.name for p in entries} == {image_id(raws[0]), image_id(raws[1]), RECALLS_FILE}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in entries)
    store.close()


def test_no_key_token_or_request_text_reaches_the_folder(tmp_path: Path) -> None:
    rules = load_rules(DEFAULT_RULES_PATH)
    body = chat_with_images(12)
    body["messages"][0]["content"][0]["text"] = "a prompt text that is nobody's business"
    store = store_at(tmp_path)
    owner = owner_of(TOKEN, HEADERS)
    outcome = prune(rules.target_for_url(url_for("openai-chat"), HEADERS), HEADERS, encode(body), rules, recall=store.ids(owner))
    assert len(outcome.kept) == outcome.record.pruned > 0  # type: ignore[union-attr]
    store.offer("c0ffee00", outcome.kept)
    assert store.flush()
    assert store.stored == len(outcome.kept)
    names = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")]
    everything = b"".join(p.read_bytes() for p in files_of(tmp_path)) + "".join(names).encode()
    for secret in (KEY.encode(), TOKEN.hex().encode(), TOKEN, b"nobody's business", owner, owner.hex().encode()):
        assert secret not in everything
    store.close()


def test_a_token_is_hex_of_16_bytes_or_more() -> None:
    assert parse_token(TOKEN.hex()) == TOKEN
    assert parse_token(" " + TOKEN.hex() + "\n") == TOKEN
    assert parse_token("abcd") is None
    assert parse_token("not hex at all, not even close!!") is None


def test_another_runs_reader_never_reads_this_runs_images(tmp_path: Path) -> None:
    mine, theirs = shot(1), shot(2)
    a, b = store_at(tmp_path, TOKEN), store_at(tmp_path, OTHER_TOKEN)
    written(a, "aaaaaaaa", mine)
    written(b, "bbbbbbbb", theirs)
    assert RecallReader(str(tmp_path), TOKEN).read(image_id(mine)).data == mine
    assert RecallReader(str(tmp_path), OTHER_TOKEN).read(image_id(theirs)).data == theirs
    for token, other in ((TOKEN, theirs), (OTHER_TOKEN, mine)):
        with pytest.raises(RecallError) as refused:
            RecallReader(str(tmp_path), token).read(image_id(other))
        assert refused.value.kind == "unknown"
    a.close()
    b.close()


def test_a_run_serves_the_first_credentials_it_sees_and_no_others(tmp_path: Path) -> None:
    store = RecallStore(str(tmp_path), TOKEN)
    first = owner_of(TOKEN, {"x-api-key": "key-one"})
    assert store.accepts(first)
    assert store.accepts(owner_of(TOKEN, {"x-api-key": "key-one", "content-type": "x"}))
    assert not store.accepts(owner_of(TOKEN, {"x-api-key": "key-two"}))
    assert not store.accepts(owner_of(TOKEN, {"authorization": "Bearer key-one"}))
    # The digest is keyed: the same key under another run's token is another owner.
    assert owner_of(OTHER_TOKEN, {"x-api-key": "key-one"}) != first


def test_past_a_conversations_bound_its_least_recently_used_go(tmp_path: Path) -> None:
    raws = [shot(seed, 96) for seed in range(6)]
    size = len(raws[0]) + 200
    store = store_at(tmp_path, conversation_bytes=3 * size, max_bytes=100 * size)
    written(store, "aaaaaaaa", *raws[:3])
    written(store, "bbbbbbbb", raws[5])
    written(store, "aaaaaaaa", raws[0])  # sent again: the most recently used of its conversation
    written(store, "aaaaaaaa", raws[3])
    reader = RecallReader(str(tmp_path), TOKEN)
    present = {raw for raw in raws if _readable(reader, raw)}
    assert present == {raws[0], raws[2], raws[3], raws[5]}  # raws[1] went; the other conversation's stays
    store.close()


def test_past_the_bound_in_all_the_least_recently_used_go_whatever_their_conversation(tmp_path: Path) -> None:
    raws = [shot(seed, 96) for seed in range(8)]
    size = max(len(r) for r in raws) + 200
    store = store_at(tmp_path, conversation_bytes=100 * size, max_bytes=4 * size)
    for i, raw in enumerate(raws):
        written(store, f"{i:08x}", raw)
    files, total = store.usage()
    assert files == 4 and total <= 4 * size
    on_disk = sum(p.stat().st_size for p in files_of(tmp_path))
    assert on_disk == total
    reader = RecallReader(str(tmp_path), TOKEN)
    assert [_readable(reader, raw) for raw in raws] == [False] * 4 + [True] * 4
    store.close()


def test_an_image_past_its_lifetime_is_expired_to_the_reader_and_then_removed(tmp_path: Path) -> None:
    clock = Clock()
    store = RecallStore(str(tmp_path), TOKEN, lifetime=3600.0, clock=clock)
    assert store.accepts(owner_of(TOKEN, HEADERS))
    old, used, new = shot(1), shot(2), shot(3)
    written(store, "aaaaaaaa", old, used)
    clock.now += 3000
    written(store, "aaaaaaaa", used)  # a use: its mtime moves on
    clock.now += 1000  # old: 4000 s since its last use; used: 1000 s
    reader = RecallReader(str(tmp_path), TOKEN, clock)
    with pytest.raises(RecallError) as expired:
        reader.read(image_id(old))
    assert expired.value.kind == "expired" and "expired" in str(expired.value) and "1 h" in str(expired.value)
    assert reader.read(image_id(used)).data == used
    written(store, "aaaaaaaa", new)  # the writer removes what is past its lifetime
    assert not (tmp_path / run_folder(TOKEN) / image_id(old)).exists()
    with pytest.raises(RecallError) as gone:
        reader.read(image_id(old))
    assert gone.value.kind == "unknown"
    assert store.take_recalls() == (1, 2)  # the reader's answers, for the record
    assert store.take_recalls() == (0, 0)
    store.close()


def test_an_id_that_is_no_id_is_refused_without_a_look_at_the_folder(tmp_path: Path) -> None:
    reader = RecallReader(str(tmp_path / "none"), TOKEN)
    for wanted in ("../../etc/passwd", "short", "k3x9q2m7t0", "k3x7q2m5ta/..", ""):
        with pytest.raises(RecallError) as refused:
            reader.read(wanted)
        assert refused.value.kind == "unknown"
        assert wanted not in str(refused.value) or not wanted


# -- a folder that is not what the store makes


def _readable(reader: RecallReader, raw: bytes) -> bool:
    try:
        return reader.read(image_id(raw)).data == raw
    except RecallError:
        return False


def _entry(folder: Path, raw: bytes) -> Path:
    return folder / run_folder(TOKEN) / image_id(raw)


def test_a_link_in_place_of_an_image_is_never_followed(tmp_path: Path) -> None:
    raw = shot(1)
    elsewhere = store_at(tmp_path / "elsewhere", OTHER_TOKEN)  # a real entry of the image, in another run's folder
    written(elsewhere, "aaaaaaaa", raw)
    elsewhere.close()
    store = store_at(tmp_path / "store")
    written(store, "aaaaaaaa", shot(2))
    _entry(tmp_path / "store", raw).symlink_to(tmp_path / "elsewhere" / run_folder(OTHER_TOKEN) / image_id(raw))
    assert not _readable(RecallReader(str(tmp_path / "store"), TOKEN), raw)
    store.close()


def test_a_linked_or_shared_folder_is_not_read_and_not_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raw = shot(1)
    real = tmp_path / "real"
    store = store_at(real)
    written(store, "aaaaaaaa", raw)
    store.close()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(RecallError) as refused:
        RecallReader(str(tmp_path / "link"), TOKEN).read(image_id(raw))
    assert refused.value.kind == "unavailable"
    os.chmod(real, 0o755)  # others may look in: not the store's folder
    with pytest.raises(RecallError):
        RecallReader(str(real), TOKEN).read(image_id(raw))
    linked = store_at(tmp_path / "link")
    written(linked, "aaaaaaaa", shot(2))
    assert linked.failed is not None and not linked.in_use
    assert not linked.accepts(owner_of(TOKEN, HEADERS))  # placeholders stop naming ids
    assert [r.getMessage() for r in caplog.records if "recall off" in r.getMessage()] == [
        f"trimflow: recall off: NotADirectoryError in {tmp_path / 'link'}; placeholders no longer offer recall_image"
    ]
    assert not (real / run_folder(TOKEN) / image_id(shot(2))).exists()


def test_a_full_disk_turns_recall_off_with_one_line(tmp_path: Path) -> None:
    """A write the file system refuses for want of room: a process whose files may not grow past 4 KiB (RLIMIT_FSIZE,
    as a full disk refuses a write) offers images; recall goes off with one line, and offering more does nothing."""
    script = textwrap.dedent(
        f"""
        import base64, logging, os, resource, signal, sys
        from trimflow._recall import Kept, RecallStore, image_id, owner_of
        from trimflow.formats import Media
        from trimflow.testing import image
        logging.basicConfig(stream=sys.stdout, format="%(message)s")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of ending the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        store = RecallStore({str(tmp_path)!r}, bytes(32))
        assert store.accepts(owner_of(bytes(32), {{}}))
        for seed in range(3):
            raw = image(200, 200, "PNG", seed=seed)
            store.offer("aaaaaaaa", [Kept(image_id(raw), Media("image", ("x",), base64.b64encode(raw).decode()), "image/png")])
            store.flush()
        print("stored", store.stored, "in use", store.in_use, "accepts", store.accepts(owner_of(bytes(32), {{}})))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        f"trimflow: recall off: File too large in {tmp_path}; placeholders no longer offer recall_image",
        "stored 0 in use False accepts False",
    ]
    assert [p.name for p in (tmp_path / run_folder(bytes(32))).iterdir()] == []  # no half-written file left


def test_huge_garbage_and_tampered_files_are_refused_and_cleared(tmp_path: Path) -> None:
    good, huge, junk, tampered, fifo = (shot(seed) for seed in range(5))
    store = store_at(tmp_path)
    written(store, "aaaaaaaa", good, tampered)
    with open(_entry(tmp_path, huge), "wb") as f:  # sparse: costs no disk
        f.truncate(MAX_IMAGE_BYTES + 4096)
    _entry(tmp_path, junk).write_bytes(b"trimflow-recall 1\n{not json\n" + junk)
    entry = _entry(tmp_path, tampered)
    entry.write_bytes(entry.read_bytes()[:-1] + b"\x00")  # one byte changed: not its id's image
    os.mkfifo(_entry(tmp_path, fifo))  # opened, it would block a reader that waits for a writer
    reader = RecallReader(str(tmp_path), TOKEN)
    assert [_readable(reader, raw) for raw in (good, huge, junk, tampered, fifo)] == [True, False, False, False, False]
    store._scan()  # what the writer does as it starts, and now and then
    assert not _entry(tmp_path, huge).exists() and not _entry(tmp_path, fifo).exists()
    assert _readable(reader, good)
    store.close()


def test_an_earlier_process_s_files_count_towards_the_bound_and_other_users_folders_are_left_alone(tmp_path: Path) -> None:
    raws = [shot(seed, 96) for seed in range(6)]
    size = max(len(r) for r in raws) + 200
    earlier = store_at(tmp_path, OTHER_TOKEN)
    written(earlier, "aaaaaaaa", *raws[:4])
    earlier.close()
    for age, raw in enumerate(reversed(raws[:4]), start=1):  # last used a minute apart, the first longest ago
        os.utime(tmp_path / run_folder(OTHER_TOKEN) / image_id(raw), (os.path.getmtime(tmp_path) - 60 * age,) * 2)
    stray = tmp_path / "notes.txt"
    stray.write_text("the user's own file")
    store = store_at(tmp_path, max_bytes=3 * size)
    written(store, "bbbbbbbb", *raws[4:])
    assert store.usage()[0] == 3
    reader = RecallReader(str(tmp_path), OTHER_TOKEN)
    assert [_readable(reader, raw) for raw in raws[:4]] == [False, False, False, True]  # theirs went first: least recently used
    assert stray.read_text() == "the user's own file"
    store.close()


def test_an_image_not_its_ids_or_too_big_is_not_stored(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    raw = shot(1)
    store.offer("aaaaaaaa", [Kept(image_id(shot(2)), Media("image", ("x",), base64.b64encode(raw).decode()), "image/png")])
    big = "A" * (MAX_IMAGE_BYTES * 4 // 3 + 8)
    store.offer("aaaaaaaa", [Kept("aaaaaaaaaa", Media("image", ("x",), big), "image/png")])
    assert store.flush()
    assert store.stored == 0 and store.skipped == 2
    store.close()


def test_the_memo_hashes_an_image_once_and_an_inline_run_leaves_before_hashing_much(tmp_path: Path) -> None:
    memo = IdMemo(capacity=4)
    raw = shot(1)
    media = Media("image", ("x",), base64.b64encode(raw).decode())
    calls: list[int] = []
    assert memo.ids(b"owner").of(media) == image_id(raw)

    def slow() -> None:
        calls.append(1)
        raise TimeoutError("to a worker")

    assert memo.ids(b"owner", slow).of(media) == image_id(raw)  # known: nothing hashed
    big = Media("image", ("y",), base64.b64encode(os.urandom(1 << 20) + raw).decode())
    with pytest.raises(TimeoutError):
        memo.ids(b"owner", slow).of(big)
    assert calls == [1]
    assert memo.ids(b"other").of(Media("image", ("z",), "!!not base64!!")) is None
