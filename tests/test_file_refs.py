"""trimflow._file_refs: the send-once mapping never answers one tenant with another's file, stays within its bounds
(entries and bytes, the least recently used going first, returned for deletion), and lets entries expire."""

from __future__ import annotations

from trimflow._file_refs import Entry, FileRefs, Owner


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def owner(tenant: bytes) -> Owner:
    return Owner(
        tenant=tenant,
        provider="anthropic",
        scheme="https",
        host="api.example",
        port=443,
        files_path="/v1/files",
        sni=None,
        headers=(("x-api-key", "sk-SECRET"),),
    )


A, B = owner(b"a" * 16), owner(b"b" * 16)


def entry(who: Owner, digest: bytes, file_id: str | None, size: int = 10, at: float = 1000.0) -> Entry:
    return Entry(owner=who, digest=digest, file_id=file_id, size=size, uploaded_at=at)


def test_a_tenant_never_gets_anothers_file() -> None:
    refs = FileRefs(clock=Clock())
    refs.put(entry(A, b"img", "file_a"))
    assert refs.get(A.tenant, b"img") is not None
    assert refs.get(B.tenant, b"img") is None
    refs.put(entry(B, b"img", "file_b"))
    a, b = refs.get(A.tenant, b"img"), refs.get(B.tenant, b"img")
    assert a is not None and b is not None and (a.file_id, b.file_id) == ("file_a", "file_b")
    assert [e.file_id for e in refs.drop(B.tenant, frozenset({"file_a", "file_b"}))] == ["file_b"]  # only its own
    assert refs.get(A.tenant, b"img") is not None


def test_entries_and_bytes_are_bounded_the_least_recently_used_going_first() -> None:
    refs = FileRefs(max_entries=3, max_bytes=100, clock=Clock())
    for n in range(3):
        assert refs.put(entry(A, bytes([n]), f"file_{n}")) == []
    refs.get(A.tenant, bytes([0]))  # used: the oldest is now 1
    gone = refs.put(entry(A, b"\x03", "file_3"))
    assert [e.file_id for e in gone] == ["file_1"] and len(refs) == 3
    gone = refs.put(entry(A, b"\x04", "file_4", size=85))
    assert [e.file_id for e in gone] == ["file_2", "file_0"] and refs.size <= 100
    assert [e.file_id for e in refs.put(entry(A, b"\x05", "file_huge", size=101))] == ["file_huge"]  # never fits: not kept
    assert refs.get(A.tenant, b"\x05") is None


def test_an_inline_mark_takes_no_bytes_and_is_never_returned_for_deletion() -> None:
    refs = FileRefs(max_entries=1, clock=Clock())
    refs.put(entry(A, b"x", None, size=0))
    assert refs.put(entry(A, b"y", "file_y")) == []  # the mark went; nothing to delete
    refs.put(entry(A, b"y", "file_other"))  # a new file for the same image: the old one is returned
    assert refs.take_all()[0].file_id == "file_other"


def test_entries_expire_after_the_lifetime_from_their_upload() -> None:
    clock = Clock()
    refs = FileRefs(lifetime=60, clock=clock)
    refs.put(entry(A, b"old", "file_old", at=clock.now))
    clock.now += 30
    refs.put(entry(A, b"new", "file_new", at=clock.now))
    clock.now += 31
    assert refs.get(A.tenant, b"old") is None and refs.get(A.tenant, b"new") is not None
    assert [e.file_id for e in refs.expired()] == ["file_old"] and len(refs) == 1


def test_the_owners_repr_holds_no_credential() -> None:
    assert "SECRET" not in repr(A) and "SECRET" not in repr(entry(A, b"x", "file_x"))
