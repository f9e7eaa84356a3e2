"""trimflow.errors: one hierarchy, still caught where callers always caught it."""

from __future__ import annotations

import pytest

import trimflow
from trimflow import _decode, _jsoncodec, _limit_profiles, _rules_file, errors, repair
from trimflow.audit import _gate, _read


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_a_trimflow_error_exported_by_the_package(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.TrimflowError)
    assert getattr(trimflow, name) is cls


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (_rules_file, "RulesError"),
        (_limit_profiles, "ProfilesError"),
        (_limit_profiles, "UnknownProfile"),
        (_jsoncodec, "BodyError"),
        (_decode, "DecodeError"),
        (_gate, "ExpressionError"),
        (_read, "InputError"),
        (repair, "SessionError"),
    ],
)
def test_the_modules_that_raise_an_error_still_name_it(module, name: str) -> None:
    assert getattr(module, name) is getattr(errors, name)


def test_value_errors_stay_value_errors() -> None:
    for cls in (
        errors.RulesError,
        errors.ProfilesError,
        errors.UnknownProfile,
        errors.BodyError,
        errors.DecodeError,
        errors.ExpressionError,
        _decode.UnsupportedEncoding,
        _decode.BodyTooLarge,
    ):
        assert issubclass(cls, ValueError), cls
    assert issubclass(errors.ProfilesError, errors.RulesError)  # one `except RulesError` refuses either bad file


def test_a_bad_rules_file_is_caught_as_a_trimflow_error() -> None:
    with pytest.raises(errors.TrimflowError) as caught:
        trimflow.parse_rules("defaults:\n  max_images: -1\n", "mine.yaml")
    assert str(caught.value).startswith("mine.yaml:2: max_images must be")
    with pytest.raises(errors.TrimflowError):
        _decode.decode_body(b"not gzip", "gzip")


def test_needs_worker_is_control_flow_not_a_user_error() -> None:
    assert not issubclass(trimflow.NeedsWorker, errors.TrimflowError)
