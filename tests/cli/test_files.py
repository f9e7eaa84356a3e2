"""`python -m trimflow files` against the fake provider's Files APIs: lists the files trimflow uploaded under the key
(not another key's, not the user's own), deletes them (all, by age, by id), and never prints the key."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from trimflow._send_once import FILENAME_PREFIX
from trimflow.cli._files import main
from trimflow.testing import FakeProvider, image

KEY, OTHER_KEY = "sk-ant-test-SECRET-files-cli-1", "sk-ant-test-SECRET-files-cli-2"
OPENAI_KEY = "sk-test-SECRET-files-cli-openai"


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # the fake is on loopback: no proxy between
    with FakeProvider() as fake:
        yield fake


def upload(provider: FakeProvider, name: str, key: str, anthropic: bool = True) -> str:
    boundary = "b0undary"
    fields = b"" if anthropic else f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nvision\r\n'.encode()
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\nContent-Type: image/png\r\n\r\n'.encode()
    body = fields + head + image(8, 8) + f"\r\n--{boundary}--\r\n".encode()
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    if anthropic:
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": "files-api-2025-04-14"}
    else:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{provider.url}/v1/files", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return str(orjson.loads(answer.read())["id"])


def test_list_shows_only_the_files_trimflow_uploaded_under_the_key(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = upload(provider, f"{FILENAME_PREFIX}abc.png", KEY)
    upload(provider, "holiday.png", KEY)  # the user's own
    upload(provider, f"{FILENAME_PREFIX}def.png", OTHER_KEY)  # another key's
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert main(["--base-url", provider.url, "list"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [line for line in out.splitlines() if line.startswith(ours)] and len(out.splitlines()) == 1
    assert "1 files trimflow uploaded" in err
    assert KEY not in out + err


def test_delete_all_removes_trimflows_files_and_leaves_the_others(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    upload(provider, f"{FILENAME_PREFIX}1.png", KEY)
    upload(provider, f"{FILENAME_PREFIX}2.png", KEY)
    upload(provider, "mine.png", KEY)
    theirs = upload(provider, f"{FILENAME_PREFIX}3.png", OTHER_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert main(["--base-url", provider.url, "delete", "--older-than", "1h"]) == 0
    assert len(provider.files.files(KEY)) == 3  # none is an hour old
    assert main(["--base-url", provider.url, "delete", "--all"]) == 0
    assert [f.filename for f in provider.files.files(KEY)] == ["mine.png"]
    assert [f.file_id for f in provider.files.files(OTHER_KEY)] == [theirs]


def test_openai_files_by_id_and_an_unknown_id_fails(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file_id = upload(provider, f"{FILENAME_PREFIX}x.png", OPENAI_KEY, anthropic=False)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.url}/v1")
    assert main(["--provider", "openai", "list"]) == 0
    assert file_id in capsys.readouterr().out
    assert main(["--provider", "openai", "delete", file_id]) == 0
    assert provider.files.files(OPENAI_KEY) == []
    assert main(["--provider", "openai", "delete", file_id]) == 1  # gone: the provider's 404
    assert "status 404" in capsys.readouterr().err


def test_no_key_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["list"]) == 2
    assert "no key: set ANTHROPIC_API_KEY" in capsys.readouterr().err


GEMINI_KEY, GEMINI_OTHER = "AIzaSECRET-files-cli-gemini-1", "AIzaSECRET-files-cli-gemini-2"


def gemini_upload(provider: FakeProvider, name: str, key: str) -> str:
    data = image(8, 8)
    start = {
        "x-goog-api-key": key,
        "x-goog-upload-protocol": "resumable",
        "x-goog-upload-command": "start",
        "x-goog-upload-header-content-length": str(len(data)),
        "x-goog-upload-header-content-type": "image/png",
        "content-type": "application/json",
    }
    metadata = orjson.dumps({"file": {"display_name": name}})
    with urllib.request.urlopen(urllib.request.Request(f"{provider.url}/upload/v1beta/files", data=metadata, headers=start), timeout=30) as answer:
        url = answer.headers["x-goog-upload-url"]
    finish = {"x-goog-upload-command": "upload, finalize", "x-goog-upload-offset": "0"}
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=finish), timeout=30) as answer:
        return str(orjson.loads(answer.read())["file"]["name"])


def test_gemini_files_are_listed_over_pages_and_deleted_by_name(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = [gemini_upload(provider, f"{FILENAME_PREFIX}{n}.png", GEMINI_KEY) for n in range(105)]  # two pages of a hundred
    gemini_upload(provider, "holiday.png", GEMINI_KEY)
    theirs = gemini_upload(provider, f"{FILENAME_PREFIX}t.png", GEMINI_OTHER)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", GEMINI_KEY)  # google-genai's other variable
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", provider.url)
    assert main(["--provider", "gemini", "list"]) == 0
    out, err = capsys.readouterr()
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted(ours) and "105 files trimflow uploaded" in err
    assert GEMINI_KEY not in out + err
    assert main(["--provider", "gemini", "delete", ours[0], ours[1].removeprefix("files/")]) == 0  # its name, or its id
    assert main(["--provider", "gemini", "delete", "--all"]) == 0
    assert [f.filename for f in provider.files.files(GEMINI_KEY)] == ["holiday.png"]
    assert [f.file_id for f in provider.files.files(GEMINI_OTHER)] == [theirs]
    assert main(["--provider", "gemini", "delete", ours[0]]) == 1  # gone: Gemini's 403
    assert "status 403" in capsys.readouterr().err
