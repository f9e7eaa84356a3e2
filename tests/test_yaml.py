"""_yaml, the line-aware YAML reader behind the rules and profiles files, tested through a reader of its own:
every error names the file and line, merge keys and anchors work, a key written twice is an error, top-level
"x-" keys are a place for anchors, unknown names get a did-you-mean hint, and files are read as UTF-8 or refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from yaml.nodes import Node

from trimflow._yaml import NodeReader, closest, did_you_mean, line_of, read_text, shipped_file, show

REPO = Path(__file__).resolve().parents[1]


class ShelfError(Exception):
    """Built as _yaml builds every error: (source, line, problem)."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        self.source, self.line, self.problem = source, line, problem
        super().__init__(f"{source}:{line}: {problem}")


class ShelfReader(NodeReader[dict[str, Any]]):
    """A small file format: `name`, and `items`, a list of mappings of `id` and `size`."""

    error_class = ShelfError

    def top(self, root: Node | None) -> dict[str, Any]:
        top = self.top_mapping(root, "the shelf file", ("name", "items"), "empty shelf file")
        out: dict[str, Any] = {"name": self.scalar(top["name"][1]) if "name" in top else None, "items": [], "lines": []}
        for node in self.sequence(top["items"][1], "items") if "items" in top else []:
            fields = self.mapping(node, "an item")
            self.reject_unknown(fields, ("id", "size"), "an item")
            out["items"].append({key: self.scalar(value) for key, (_, value) in fields.items()})
            out["lines"].append(line_of(node))
        return out


def parse(text: str) -> dict[str, Any]:
    return ShelfReader("shelf.yaml").parse(text)


def error(text: str) -> ShelfError:
    with pytest.raises(ShelfError) as caught:
        parse(text)
    assert caught.value.source == "shelf.yaml"
    assert str(caught.value) == f"shelf.yaml:{caught.value.line}: {caught.value.problem}"
    return caught.value


# --- reading -------------------------------------------------------------------------------------------------


def test_a_file_reads_into_plain_values_with_the_line_of_each_entry() -> None:
    shelf = parse("name: top\nitems:\n  - {id: a, size: 3}\n  - id: b\n    size: 2.5\n  -\n    id: c\n")
    assert shelf["name"] == "top"
    assert shelf["items"] == [{"id": "a", "size": 3}, {"id": "b", "size": 2.5}, {"id": "c"}]
    assert shelf["lines"] == [3, 4, 7]  # where each mapping starts, not where its dash is


def test_null_items_are_an_empty_list() -> None:
    assert parse("items:\n")["items"] == []
    assert parse("items: null\nname: ~\n") == {"name": None, "items": [], "lines": []}


def test_merge_keys_bring_an_anchors_fields_and_explicit_keys_win_wherever_they_are_written() -> None:
    text = """\
x-small: &small {id: small, size: 1}
x-named: &named {id: named}
items:
  - <<: *small
  - <<: *small
    size: 9
  - size: 7
    <<: *small
  - <<: [*named, *small]
"""
    assert parse(text)["items"] == [
        {"id": "small", "size": 1},
        {"id": "small", "size": 9},
        {"id": "small", "size": 7},  # written before the merge key, still the explicit one
        {"id": "named", "size": 1},  # of several anchors merged, the first one named wins
    ]


def test_a_merge_key_takes_mappings_only_and_a_key_written_twice_is_still_an_error() -> None:
    err = error("items:\n  - <<: 3\n    id: a\n")
    assert err.line == 2 and "a merge key (<<) in an item takes an anchored mapping or a list of them, got 3" in err.problem
    err = error("x-small: &small {id: small}\nitems:\n  - <<: *small\n    size: 1\n    size: 2\n")
    assert (err.line, err.problem) == (5, "duplicate key 'size' in an item (first on line 4)")


def test_an_alias_to_the_same_mapping_reads_the_same() -> None:
    assert parse("x-one: &one {id: a, size: 1}\nitems: [*one, *one]\n")["items"] == [{"id": "a", "size": 1}] * 2


def test_top_level_x_keys_are_ignored_but_only_at_the_top() -> None:
    assert parse("x-anything: [1, 2]\nx-: 3\nname: n\n")["name"] == "n"
    err = error("items:\n  - id: a\n    x-note: here\n")
    assert (err.line, err.problem) == (3, "unknown field 'x-note' in an item (known: id, size)")


# --- errors, each with its line -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "~\n", "null\n"])
def test_an_empty_file_is_the_readers_own_error_on_line_1(text: str) -> None:
    err = error(text)
    assert (err.line, err.problem) == (1, "empty shelf file")


@pytest.mark.parametrize(
    ("text", "got"),
    [("- a\n- b\n", "a list"), ("just text\n", "'just text'"), ("3\n", "3"), ("true\n", "true"), ("1.5\n", "1.5")],
)
def test_a_root_that_is_not_a_mapping_says_what_it_is(text: str, got: str) -> None:
    err = error(text)
    assert (err.line, err.problem) == (1, f"the shelf file must be a mapping, got {got}")


def test_a_key_written_twice_is_an_error_on_its_second_line() -> None:
    err = error("items:\n  - id: a\n    size: 1\n    id: b\n")
    assert (err.line, err.problem) == (4, "duplicate key 'id' in an item (first on line 2)")
    err = error("name: a\n\nname: b\n")
    assert (err.line, err.problem) == (3, "duplicate key 'name' in the shelf file (first on line 1)")


def test_a_key_from_two_merges_and_written_too_is_no_duplicate() -> None:
    text = "x-a: &a {id: a}\nx-b: &b {id: b}\nitems:\n  - <<: [*a, *b]\n    id: c\n"
    assert parse(text)["items"] == [{"id": "c"}]


@pytest.mark.parametrize(("key", "shown"), [("1", "1"), ("null", "null"), ("true", "true"), ("[a]", "a list"), ("{a: 1}", "a mapping")])
def test_a_key_that_is_not_a_name_is_an_error(key: str, shown: str) -> None:
    err = error(f"name: n\n? {key}\n: value\n")
    assert (err.line, err.problem) == (2, f"keys in the shelf file must be names, got {shown}")


def test_an_unknown_name_gets_the_closest_known_one() -> None:
    err = error("# a comment\nitmes: []\n")
    assert (err.line, err.problem) == (2, "unknown top-level key 'itmes' in the shelf file; did you mean 'items'?")
    err = error("items:\n  - id: a\n    SIZE: 1\n")  # case aside
    assert (err.line, err.problem) == (3, "unknown field 'SIZE' in an item; did you mean 'size'?")


def test_an_unknown_name_far_from_any_lists_the_known_ones() -> None:
    err = error("colour: red\n")
    assert err.problem == "unknown top-level key 'colour' in the shelf file (known: name, items)"


def test_an_error_in_merged_content_names_the_line_where_it_is_written() -> None:
    err = error("x-base: &base\n  id: a\n  weight: 3\nitems:\n  - <<: *base\n")
    assert (err.line, err.problem) == (3, "unknown field 'weight' in an item (known: id, size)")


def test_a_list_where_a_mapping_belongs_and_a_mapping_where_a_list_belongs() -> None:
    err = error("items:\n  - [1, 2]\n")
    assert (err.line, err.problem) == (2, "an item must be a mapping, got a list")
    err = error("name: n\nitems:\n  id: a\n")
    assert (err.line, err.problem) == (3, "items must be a list, got a mapping")
    err = error("items: 12\n")
    assert (err.line, err.problem) == (1, "items must be a list, got 12")


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("name: n\nitems: [a, b\n", 3, "YAML syntax error: expected ',' or ']', but got '<stream end>'"),
        ("name: n\n  bad: indent\n", 2, "YAML syntax error: mapping values are not allowed here"),
        ("name: a\n---\nname: b\n", 2, "YAML syntax error: but found another document"),
        ("name: a\nitems: *nowhere\n", 2, "YAML syntax error: found undefined alias 'nowhere'"),
        ('\n\nname: "a\x07"\n', 3, "YAML syntax error: special characters are not allowed"),
        (
            "name: !!python/object:os.system x\n",
            1,
            "YAML error: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object:os.system'",
        ),
    ],
)
def test_yaml_errors_name_the_line_yaml_reports(text: str, line: int, problem: str) -> None:
    err = error(text)
    assert (err.line, err.problem) == (line, problem)


def test_a_value_yaml_cannot_build_is_an_error_quoting_the_value() -> None:
    err = error("name: 2024-13-01\n")  # a timestamp by its shape, with month 13
    assert err.line == 1
    assert err.problem.startswith("cannot read value '2024-13-01': ")


# --- read_text ------------------------------------------------------------------------------------------------


def test_read_text_drops_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfname: n\n")
    text = read_text(path, ShelfError)
    assert text == "name: n\n"
    assert parse(text)["name"] == "n"


def test_read_text_refuses_what_is_not_utf8_saying_where(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ShelfError) as caught:
        read_text(path, ShelfError)
    err = caught.value
    assert (err.source, err.line) == (str(path), None)
    assert err.problem == "cannot read: not UTF-8 text (invalid continuation byte at byte 9)"
    assert "caf" not in err.problem  # the file's content is not quoted


def test_read_text_of_a_missing_file_or_a_folder_says_why(tmp_path: Path) -> None:
    with pytest.raises(ShelfError) as caught:
        read_text(tmp_path / "missing.yaml", ShelfError)
    assert (caught.value.line, caught.value.problem) == (None, "cannot read: No such file or directory")
    with pytest.raises(ShelfError) as caught:
        read_text(str(tmp_path), ShelfError)
    assert caught.value.source == str(tmp_path) and caught.value.problem == "cannot read: Is a directory"


def test_shipped_file_is_the_repositorys_rules_file() -> None:
    assert shipped_file("default.yaml") == (REPO / "rules" / "default.yaml").resolve()
    assert shipped_file("profiles.yaml").is_file()


# --- hints and values in messages --------------------------------------------------------------------------


def test_closest_ignores_case_and_gives_up_when_nothing_is_close() -> None:
    choices = ("max_images", "max_body_bytes", "keep_recent")
    assert closest("MAX_IMAGE", choices) == "max_images"
    assert closest("keep_recnet", choices) == "keep_recent"
    assert closest("zzz", choices) is None
    assert closest("anything", ()) is None
    assert did_you_mean("max_imgs", choices) == "; did you mean 'max_images'?"
    assert did_you_mean("zzz", choices) == ""


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "null"), (True, "true"), (False, "false"), (0, "0"), (2.5, "2.5"), ("a'b", '"a\'b"'), ([1], "list"), ({}, "dict")],
)
def test_show_writes_values_in_yaml_terms(value: object, shown: str) -> None:
    assert show(value) == shown
