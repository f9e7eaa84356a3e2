"""trimflow.proxy.memory: trimflow_keep_memory sets glibc's thresholds once, and the arenas are shared from load
(trimflow._malloc itself: tests/test_malloc.py)."""

from __future__ import annotations

import logging

from mitmproxy.test import taddons

from trimflow import proxy
from trimflow.proxy import memory


async def test_keep_memory_is_set_once_at_start_unless_turned_off(monkeypatch, caplog) -> None:
    calls: list[str] = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: calls.append("set"))  # the real one: tests/test_malloc.py
    monkeypatch.setattr(memory, "share_arenas", lambda: None)
    instance = proxy.KeepMemory()
    with taddons.context(instance) as tctx:
        assert tctx.options.trimflow_keep_memory is True and tctx.options._options["trimflow_keep_memory"].help
        instance.configure(set(tctx.options.keys()))  # as mitmdump configures a script it has loaded
        assert calls == ["set"] and instance.kept
        tctx.configure(instance, trimflow_keep_memory=False)
        tctx.configure(instance, trimflow_keep_memory=True)
        assert calls == ["set"]  # process-wide and for good: set once
    off = proxy.KeepMemory()
    with taddons.context(off) as tctx:
        tctx.options.trimflow_keep_memory = False  # --set trimflow_keep_memory=false
        off.configure(set(tctx.options.keys()))
        assert calls == ["set"] and not off.kept

    monkeypatch.setattr(memory, "keep_freed_memory", lambda: "not glibc")
    elsewhere = proxy.KeepMemory()
    with taddons.context(elsewhere) as tctx, caplog.at_level(logging.INFO, logger="trimflow"):
        elsewhere.configure(set(tctx.options.keys()))
    assert [r.getMessage() for r in caplog.records if "keep_memory" in r.getMessage()] == [
        "trimflow: trimflow_keep_memory has no effect here: not glibc"
    ]
    assert not elsewhere.kept


async def test_worker_threads_share_arenas_from_load_whatever_keep_memory_says(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: calls.append("kept"))
    monkeypatch.setattr(memory, "share_arenas", lambda: calls.append("shared"))  # the real one: tests/test_malloc.py
    off = proxy.KeepMemory()
    with taddons.context(off) as tctx:  # loading the addon: before any worker thread
        assert calls == ["shared"] and off.shared
        tctx.options.trimflow_keep_memory = False
        off.configure(set(tctx.options.keys()))
    assert calls == ["shared"]
