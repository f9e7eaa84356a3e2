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


def borrowed(who: Owner, digest: bytes, file_id: str, until: float, at: float = 1000.0) -> Entry:
    return Entry(owner=who, digest=digest, file_id=file_id, size=0, uploaded_at=at, borrowed_until=until)


def test_a_borrowed_entry_is_referenced_until_the_stores_time_and_never_returned_for_deletion() -> None:
    clock = Clock()
    refs = FileRefs(max_entries=2, lifetime=60, clock=clock)
    assert refs.put(borrowed(A, b"x", "file_x", until=clock.now + 30)) == []
    assert refs.put(borrowed(A, b"y", "file_y", until=clock.now + 90)) == []
    assert refs.put(entry(A, b"z", "file_z")) == []  # x pushed out: another instance's file, not deleted from here
    assert refs.get(A.tenant, b"x") is None and len(refs) == 2
    clock.now += 31
    assert refs.get(A.tenant, b"y") is not None
    clock.now += 30  # past this instance's own lifetime: never referenced longer than a file of its own
    assert refs.get(A.tenant, b"y") is None
    assert [e.file_id for e in refs.expired()] == ["file_z"]
    refs.put(borrowed(A, b"w", "file_w", until=clock.now + 30))
    assert refs.take_all() == []


def test_a_refused_file_is_remembered_for_its_tenant_within_the_entries_bound() -> None:
    refs = FileRefs(max_entries=2, clock=Clock())
    refs.put(borrowed(A, b"x", "file_x", until=2000.0))
    assert [e.file_id for e in refs.drop(A.tenant, frozenset({"file_x"}))] == ["file_x"]
    assert refs.refused(A.tenant, "file_x") and not refs.refused(B.tenant, "file_x")
    refs.drop(A.tenant, frozenset({"file_1"}))
    refs.drop(A.tenant, frozenset({"file_2"}))
    assert not refs.refused(A.tenant, "file_x") and refs.refused(A.tenant, "file_2")  # the oldest forgotten first


def test_a_file_is_offered_to_other_instances_until_before_its_deletion_here() -> None:
    assert FileRefs(lifetime=86400).shared_until(1000.0) == 1000.0 + 86400 - 600
    assert FileRefs(lifetime=60).shared_until(1000.0) == 1000.0 + 45  # a short lifetime: its last quarter


def test_an_entry_whose_provider_keeps_it_less_than_the_lifetime_goes_with_the_providers_limit() -> None:
    clock = Clock()
    refs = FileRefs(lifetime=86400 * 2, clock=clock)  # two days: longer than Gemini keeps a file
    gemini = Owner(tenant=A.tenant, provider="gemini", scheme="https", host="g", port=443, files_path="/v1beta/files", sni=None, headers=())
    capped = Entry(owner=gemini, digest=b"g", file_id="files/g", size=10, uploaded_at=clock.now)
    refs.put(capped)
    refs.put(entry(A, b"a", "file_a", at=clock.now))
    assert refs.shared_until(clock.now, 47 * 3600) == clock.now + 47 * 3600 - 600
    clock.now += 47 * 3600 - 1
    assert refs.get(A.tenant, b"g") is not None
    clock.now += 1
    assert refs.get(A.tenant, b"g") is None and refs.get(A.tenant, b"a") is not None  # never referenced past 47 h
    assert [e.file_id for e in refs.expired()] == ["files/g"]
    short = FileRefs(lifetime=3600, clock=clock)  # the option's lifetime, when shorter, holds
    assert short.lifetime_of(47 * 3600) == 3600 and short.shared_until(0, 47 * 3600) == 3600 - 600
