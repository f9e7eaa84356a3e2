"""trimflow's options: a value mitmproxy would refuse or a misspelt trimflow_* name is found before mitmproxy
applies the deferred `--set` values; while mitmproxy starts, any option error ends it with its one line;
once it runs, `configure` raises OptionsError for mitmproxy to show and roll back.

The real mitmdump runs of the same are in tests/e2e/test_startup.py."""

from __future__ import annotations

import logging

import pytest
from mitmproxy import exceptions
from mitmproxy.addons.errorcheck import ErrorCheck
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow.proxy.options import bad_value, deferred_problems, starting, unknown_option

from .flows import write_rules

OURS = sorted(["trimflow_rules", "trimflow_mode", "trimflow_metrics", "trimflow_keep_memory"])


class Declared:
    """Stands in for mitmproxy's option object: only its typespec is read."""

    def __init__(self, typespec: type) -> None:
        self.typespec = typespec


class Script:
    """A loaded script as mitmproxy sees it: a module whose `addons` it registers in one go."""

    name = "script"

    def __init__(self, addons: list[object]) -> None:
        self.addons = addons


class Strings:
    """A `--set` value as mitmproxy defers it (its _UnconvertedStrings): the strings given."""

    def __init__(self, *val: str) -> None:
        self.val = list(val)


@pytest.mark.parametrize("given", ["maybe", "False", "0", "no", "yes", "TRUE"])
def test_a_bool_option_takes_only_what_mitmproxy_parses(given: str) -> None:
    problem = bad_value("trimflow_keep_memory", bool, Strings(given))
    assert problem == (
        f"trimflow_keep_memory must be true or false, not {given!r} (--set trimflow_keep_memory=false; --set trimflow_keep_memory alone means true)"
    )


@pytest.mark.parametrize("given", [Strings("true"), Strings("false"), Strings("toggle"), Strings(), True, False])
def test_the_bool_values_mitmproxy_takes_pass(given: object) -> None:
    assert bad_value("trimflow_keep_memory", bool, given) is None


def test_a_config_yaml_value_of_the_wrong_type_and_a_value_given_twice_are_problems() -> None:
    assert bad_value("trimflow_keep_memory", bool, "maybe") is not None  # config.yaml: trimflow_keep_memory: maybe
    assert bad_value("trimflow_mode", str, 3) == "trimflow_mode must be text, not 3"
    assert bad_value("trimflow_mode", str, Strings("enforce", "observe")) == ("trimflow_mode is given 2 times ('enforce', 'observe'): give it once")


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("trimflow_metrik", "trimflow_metrics"),
        ("trimflow-rules", "trimflow_rules"),
        ("trimflow_keep_mem", "trimflow_keep_memory"),
        ("TRIMFLOW_MODE", "trimflow_mode"),
    ],
)
def test_a_misspelt_name_gets_the_closest_option(name: str, suggestion: str) -> None:
    assert unknown_option(name, OURS) == f"unknown option {name}; did you mean {suggestion}?"


def test_a_name_close_to_none_lists_the_options() -> None:
    assert unknown_option("trimflow_speed", OURS) == f"unknown option trimflow_speed (trimflow's options: {', '.join(OURS)})"


def test_only_trimflow_names_are_checked_other_scripts_options_may_come_later() -> None:
    declared = {name: Declared(str) for name in OURS} | {"trimflow_keep_memory": Declared(bool)}
    deferred = {
        "my_script_option": Strings("1"),
        "trimflow_metrik": Strings("x.jsonl"),
        "trimflow_keep_memory": Strings("maybe"),
        "trimflow_mode": Strings("observe"),
    }
    assert [name for name, _ in deferred_problems(deferred, declared)] == ["trimflow_metrik", "trimflow_keep_memory"]


def test_loaded_into_a_running_mitmproxy_bad_deferred_values_are_one_error_and_trimflow_still_loads(caplog) -> None:
    addons = proxy.make_addons()
    with taddons.context() as tctx:
        tctx.options.set("trimflow_keep_memory=maybe", "trimflow_metrik=x.jsonl", "trimflow_mode=observe", defer=True)
        with caplog.at_level(logging.ERROR, logger="trimflow"):
            tctx.master.addons.register(Script(addons))  # loads each, then applies the deferred values
        assert [r.getMessage() for r in caplog.records] == [
            "trimflow: trimflow_keep_memory must be true or false, not 'maybe' (--set trimflow_keep_memory=false; "
            "--set trimflow_keep_memory alone means true); unknown option trimflow_metrik; did you mean trimflow_metrics?"
        ]
        # Without the check mitmproxy's own parse of "maybe" would raise here and trimflow would not load at all.
        assert tctx.options.trimflow_mode == "observe" and tctx.options.trimflow_keep_memory is True
        assert all(tctx.master.addons.get(a.name) is a for a in addons)


def test_while_mitmproxy_starts_an_option_error_ends_it_with_its_line(tmp_path) -> None:
    checker = ErrorCheck()  # mitmdump's own: watches the log until the proxy runs
    instance = proxy.make_addons()
    prune = next(a for a in instance if isinstance(a, proxy.Prune))
    try:
        with taddons.context(checker, *instance) as tctx:
            assert starting()
            bad = tmp_path / "bad.yaml"
            bad.write_text("defaults:\n  max_images: lots\n")
            with pytest.raises(SystemExit) as stopped:
                tctx.configure(prune, trimflow_rules=str(bad))
            assert str(stopped.value) == f"trimflow: {bad}:2: max_images must be a whole number >= 0 or null, got 'lots'"
            checker.finish()  # the proxy runs: the same error goes back to mitmproxy, which keeps the last value
            assert not starting()
            with pytest.raises(exceptions.OptionsError, match=r"bad\.yaml:2: max_images"):
                tctx.configure(prune, trimflow_rules=str(bad))
    finally:
        checker.finish()


def test_a_metrics_file_that_cannot_be_written_stops_mitmproxy_at_start_only(tmp_path) -> None:
    checker = ErrorCheck()
    instance = proxy.make_addons()
    metrics = next(a for a in instance if isinstance(a, proxy.Metrics))
    (tmp_path / "file").write_text("")
    try:
        with taddons.context(checker, *instance) as tctx:
            with pytest.raises(SystemExit, match=r"^trimflow: trimflow_metrics: cannot write .*: Is a directory$"):
                tctx.configure(metrics, trimflow_metrics=str(tmp_path))
            with pytest.raises(SystemExit, match=r"^trimflow: trimflow_metrics: cannot write .*file/m\.jsonl: File exists$"):
                tctx.configure(metrics, trimflow_metrics=str(tmp_path / "file" / "m.jsonl"))
            tctx.configure(metrics, trimflow_metrics=str(tmp_path / "new" / "m.jsonl"))  # a new folder is made, as the writer would
            assert (tmp_path / "new" / "m.jsonl").exists()
            checker.finish()
            # Running, writing fails open: forwarding goes on and the first failed write logs one error (tests/hostile).
            tctx.configure(metrics, trimflow_metrics=str(tmp_path))
    finally:
        checker.finish()


def test_a_profiles_file_given_is_checked_while_simulation_is_off(tmp_path, addon) -> None:
    bad = tmp_path / "profiles.yaml"
    bad.write_text("profiles:\n  generic:\n    max_images: lots\n")
    with pytest.raises(exceptions.OptionsError, match=r"^trimflow: .*profiles\.yaml:3: "):
        addon.tctx.configure(addon, trimflow_profiles=str(bad))
    assert addon.simulated is None


def test_an_unknown_mode_names_the_option_and_the_modes(tmp_path) -> None:
    instance = proxy.make_addons()
    with taddons.context(*instance) as tctx:
        tctx.configure(instance[1], trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 2)))
        with pytest.raises(exceptions.OptionsError, match=r"^trimflow: trimflow_mode must be one of enforce, observe, not 'bogus'$"):
            tctx.configure(instance[1], trimflow_mode="bogus")
