"""trimflow.proxy.upstream_auth: mitmproxy's upstream_auth read once from a pipe (trimflow_upstream_auth_fd), which
is left empty and closed; anything else refused in a message that never holds what the pipe held. The launcher's
side, a real mitmdump through a proxy that wants the credentials and its core size limit: tests/e2e/test_launch_hostile.py
(here, this process's soft limit is put back after each test)."""

from __future__ import annotations

import base64
import os
import resource
import tempfile
from collections.abc import Iterator

import pytest
from mitmproxy import exceptions
from mitmproxy.addons.upstream_auth import UpstreamAuth
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow.proxy.upstream_auth import NO_PIPE, OPTION

AUTH = "corp-user:p@ss: w/rd-7Q2x"


def pipe_holding(data: bytes, close_writer: bool = True) -> tuple[int, int | None]:
    """A pipe with `data` in it, as the launcher hands it over: (reading end, writing end or None once closed)."""
    read, write = os.pipe()
    os.write(write, data)
    if close_writer:
        os.close(write)
        return read, None
    return read, write


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def context() -> Iterator[tuple[taddons.context, proxy.UpstreamAuthPipe, UpstreamAuth]]:
    """The addon beside mitmproxy's own UpstreamAuth, which declares upstream_auth and sends it."""
    ours, theirs = proxy.UpstreamAuthPipe(), UpstreamAuth()
    core = resource.getrlimit(resource.RLIMIT_CORE)
    try:
        with taddons.context(ours, theirs) as tctx:
            yield tctx, ours, theirs
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, core)  # a soft limit goes back up to the hard one


def test_the_pipe_is_read_to_its_end_once_closed_and_its_number_forgotten(context) -> None:
    tctx, ours, theirs = context
    assert tctx.options.trimflow_upstream_auth_fd == NO_PIPE and tctx.options.upstream_auth is None
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))  # as for a user whose shell allows core files
    read, _ = pipe_holding(AUTH.encode())
    tctx.configure(ours, trimflow_upstream_auth_fd=read)  # as the launcher's --set, applied while mitmdump starts
    assert tctx.options.upstream_auth == AUTH
    assert theirs.auth == b"Basic " + base64.b64encode(AUTH.encode())  # what goes out as Proxy-Authorization
    assert not is_open(read)
    assert resource.getrlimit(resource.RLIMIT_CORE) == (0, hard)  # a core file would hold the credentials
    assert tctx.options.trimflow_upstream_auth_fd == NO_PIPE  # a reloaded script reads nothing opened under it later
    ours.configure(set(tctx.options.keys()))  # as mitmdump configures a script it has loaded: nothing read again
    assert tctx.options.upstream_auth == AUTH


def test_a_second_pipe_is_refused_and_left_alone(context) -> None:
    tctx, ours, _ = context
    first, _ = pipe_holding(AUTH.encode())
    tctx.configure(ours, trimflow_upstream_auth_fd=first)
    second, _ = pipe_holding(b"other-user:other-password")
    try:
        with pytest.raises(exceptions.OptionsError, match=f"^trimflow: {OPTION} is read once, at start$"):
            tctx.configure(ours, trimflow_upstream_auth_fd=second)
        assert tctx.options.upstream_auth == AUTH
        assert os.read(second, 100) == b"other-user:other-password"
    finally:
        os.close(second)


def test_a_pipe_whose_writer_is_still_open_is_refused_at_once(context) -> None:
    tctx, ours, _ = context
    read, write = pipe_holding(AUTH.encode()[:9], close_writer=False)  # a read to the end would wait for ever
    assert write is not None
    try:
        with pytest.raises(exceptions.OptionsError) as caught:
            tctx.configure(ours, trimflow_upstream_auth_fd=read)
    finally:
        os.close(write)
    assert str(caught.value) == f"trimflow: {OPTION}={read}: the pipe's writer has not closed it"
    assert tctx.options.upstream_auth is None and not is_open(read)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b":s3cr3t-without-a-user", "the pipe holds no user:password"),  # mitmproxy's own error would print it
        (b"s3cr3t-without-a-colon", "the pipe holds no user:password"),
        (b"", "the pipe holds no user:password"),
        (b"user:s3cr3t\xff", "the pipe holds no UTF-8 text"),
    ],
)
def test_what_is_no_user_and_password_is_refused_without_showing_it(context, data: bytes, why: str) -> None:
    tctx, ours, _ = context
    read, _ = pipe_holding(data)
    with pytest.raises(exceptions.OptionsError) as caught:
        tctx.configure(ours, trimflow_upstream_auth_fd=read)
    assert str(caught.value) == f"trimflow: {OPTION}={read}: {why}"
    assert "s3cr3t" not in str(caught.value) and tctx.options.upstream_auth is None and not is_open(read)


def test_a_descriptor_that_is_no_pipe_is_neither_read_nor_closed(context) -> None:
    tctx, ours, _ = context
    with tempfile.TemporaryFile() as file:
        file.write(AUTH.encode())
        file.seek(0)
        with pytest.raises(exceptions.OptionsError, match=f"^trimflow: {OPTION}={file.fileno()} is not a pipe$"):
            tctx.configure(ours, trimflow_upstream_auth_fd=file.fileno())
        assert file.read() == AUTH.encode()
        with pytest.raises(exceptions.OptionsError, match=f"^trimflow: {OPTION} is read once, at start$"):  # tried once, whatever came of it
            tctx.configure(ours, trimflow_upstream_auth_fd=file.fileno())


def test_a_closed_descriptor_is_named(context) -> None:
    tctx, ours, _ = context
    read, _ = pipe_holding(b"")
    os.close(read)
    with pytest.raises(exceptions.OptionsError, match=f"^trimflow: {OPTION}={read}: Bad file descriptor$"):
        tctx.configure(ours, trimflow_upstream_auth_fd=read)
