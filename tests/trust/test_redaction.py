"""Secret values, and their base64 and URL-encoded forms, are masked in what the reconciler writes
and found in the files the status page would send."""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from desired.parse import parse_desired
from reconciler.trust import redaction
from reconciler.trust.redaction import RedactingFilter, secret_values
from status.redact import MASK, Redactor, redact_data

SECRET = "s3cr3t-Canary/value+42"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("form", [
    SECRET,
    b64(SECRET.encode()),
    b64(SECRET.encode()).rstrip("="),
    base64.urlsafe_b64encode(SECRET.encode()).decode(),
    base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("="),
    quote(SECRET),
    quote(SECRET, safe=""),
    quote_plus(SECRET),
])
def test_each_form_of_a_secret_is_masked(form: str) -> None:
    out = Redactor([SECRET]).redact(f"log: {form} end")
    assert out == f"log: {MASK} end"


@pytest.mark.parametrize("prefix", [b"", b"a", b"ab", b"Authorization: Basic user:"])
@pytest.mark.parametrize("suffix", [b"", b"x", b"xy", b"\n more data"])
def test_secret_base64_encoded_inside_longer_data_is_masked_at_every_alignment(prefix: bytes, suffix: bytes) -> None:
    blob = b64(prefix + SECRET.encode() + suffix)
    out = Redactor([SECRET]).redact(blob)
    assert MASK in out
    # What survives is at most the few characters that mix the secret's bits with its neighbours'.
    assert len(out) - len(MASK) <= len(blob) - len(b64(SECRET.encode())) + 4


def test_secret_escaped_as_in_json_or_yaml_is_masked() -> None:
    value = 'pa"ss\\word'
    assert Redactor([value]).redact('msg: "pa\\"ss\\\\word"') == f'msg: "{MASK}"'


# Characters that each encoding changes: URL-encoding (@ / + = & space, non-ASCII), HTML (& < > " '),
# JSON (" and non-ASCII; \u escapes of astral characters as surrogate pairs), base64 (all of it).
HARD = "p@ss/w+rd=&<>\"' é€😀"


def _lower_hex(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), text)


ENCODINGS: dict[str, Callable[[str], str]] = {
    "as-is": lambda s: s,
    "url": lambda s: quote(s, safe=""),
    "url-lowercase": lambda s: _lower_hex(quote(s, safe="")),
    "url-keeping-slashes": lambda s: quote(s),
    "url-plus": quote_plus,
    "url-plus-lowercase": lambda s: _lower_hex(quote_plus(s)),
    "html": html.escape,
    "html-no-quotes": lambda s: html.escape(s, quote=False),
    "html-decimal": lambda s: "".join(c if c.isalnum() and c.isascii() else f"&#{ord(c)};" for c in s),
    "html-hex-upper": lambda s: "".join(c if c.isalnum() and c.isascii() else f"&#x{ord(c):X};" for c in s),
    "html-markupsafe": lambda s: html.escape(s).replace("&#x27;", "&#39;").replace("&quot;", "&#34;"),
    "xml-ascii": lambda s: html.escape(s).encode("ascii", "xmlcharrefreplace").decode(),
    "json": lambda s: json.dumps(s)[1:-1],
    "json-utf8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "json-upper-hex": lambda s: re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), json.dumps(s)[1:-1]),
    "json-html-safe": lambda s: json.dumps(s)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e")
                                                   .replace("&", "\\u0026"),
    "json-escaped-slash": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "python-repr": lambda s: repr(s)[1:-1],
    "python-bytes-repr": lambda s: repr(s.encode())[2:-1],
    "yaml-single-quoted": lambda s: s.replace("'", "''"),
    "base64": lambda s: b64(s.encode()),
    "base64-unpadded": lambda s: b64(s.encode()).rstrip("="),
    "base64-urlsafe": lambda s: base64.urlsafe_b64encode(s.encode()).decode(),
    "base64-urlsafe-unpadded": lambda s: base64.urlsafe_b64encode(s.encode()).decode().rstrip("="),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_a_secret_with_characters_every_encoding_changes_is_masked_in_each_encoding(encoding: str) -> None:
    form = ENCODINGS[encoding](HARD)
    assert form != HARD or encoding == "as-is"
    assert Redactor([HARD]).redact(f"log: {form} end") == f"log: {MASK} end"


@pytest.mark.parametrize("encoding", sorted(e for e in ENCODINGS if e.startswith("base64")))
@pytest.mark.parametrize("prefix", [b"", b"a", b"ab"])
def test_a_secret_with_any_characters_is_masked_in_base64_at_every_alignment(encoding: str, prefix: bytes) -> None:
    urlsafe = "urlsafe" in encoding
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    blob = encode(prefix + HARD.encode() + b"tail").decode()
    out = Redactor([HARD]).redact(blob)
    assert MASK in out
    assert len(out) - len(MASK) <= len(blob) - len(b64(HARD.encode())) + 4


def test_the_lines_of_a_secret_of_several_lines_are_masked_one_by_one() -> None:
    key = "-----BEGIN KEY-----\nMIIEvQIBADANBgkq+hkiG9w0BAQ\n-----END KEY-----"
    out = Redactor([key]).redact("line 1: MIIEvQIBADANBgkq+hkiG9w0BAQ\njson: " + json.dumps(key))
    assert "MIIEvQ" not in out and "BEGIN" not in out


def test_values_shorter_than_six_characters_are_left_alone() -> None:
    redactor = Redactor(["admin", "1"])
    assert not redactor
    assert redactor.redact("admin 1") == "admin 1"


def test_redact_data_masks_nested_strings_only() -> None:
    data = {"a": [SECRET, 3, {"b": f"x{SECRET}y"}], "n": None}
    assert redact_data(Redactor([SECRET]), data) == {"a": [MASK, 3, {"b": f"x{MASK}y"}], "n": None}


def test_secret_values_come_from_job_and_provider_secrets_and_credential_names() -> None:
    desired = parse_desired({
        "desired/j.yaml": "kind: Job\nmetadata: {name: j}\nspec: {command: [x], secrets: [MY_DB]}\n",
        "desired/p.yaml": "kind: Provider\nmetadata: {name: p}\nspec: {settings: {type: local}, secrets: [CLOUD]}\n",
    })
    assert not desired.errors
    environ = {"MY_DB": "db-value-1", "CLOUD": "cloud-value", "AWS_SECRET_ACCESS_KEY": "aws-secret",
               "HF_TOKEN": "hf-token-1", "MY_SERVICE_PASSWORD": "pw-123456", "HOME": "/home/someone",
               "PATH": "/usr/bin", "GITHUB_TOKEN": ""}
    assert secret_values(desired, environ) == {"db-value-1", "cloud-value", "aws-secret", "hf-token-1",
                                               "pw-123456"}
    assert "db-value-1" not in secret_values(None, environ)


def test_log_filter_masks_message_arguments_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(lambda: Redactor([SECRET])))
    logger = logging.getLogger("test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("launch failed: %s", SECRET)
        try:
            raise RuntimeError(f"bad token {b64(SECRET.encode())}")
        except RuntimeError:
            logger.exception("tick failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "launch failed: ***" in text and "RuntimeError: bad token ***" in text
    assert SECRET not in text and b64(SECRET.encode()) not in text


def test_a_tick_masks_a_jobs_own_secret_from_its_first_log_line(state_repo) -> None:  # type: ignore[no-untyped-def]
    """The redactor learns the job's secret names when it reads the manifests, not only when it
    commits: anything logged earlier in the tick is masked too."""
    from reconciler.daemon.loop import Reconciler

    state_repo.write("desired/job.yaml", "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata: {name: train}\n"
                                         "spec: {command: [python, t.py], secrets: [DATASET_URL]}\n")
    state_repo.commit("job with a secret")
    rec = Reconciler(state_repo.path, environ={"DATASET_URL": SECRET})
    assert SECRET in rec.redactor.redact(f"url={SECRET}")  # a plain name: not known before reading
    rec.preview()
    assert rec.redactor.redact(f"url={SECRET}") == f"url={MASK}"


def _masked_stream(chunks: list[bytes], redactor: Redactor, limit: int | None = None) -> bytes:
    from adapters.bootstrap import OutputMasker

    out: list[bytes] = []
    masker = OutputMasker(redactor.pattern, redactor.longest, out.append)
    if limit is not None:  # write parts of an unended line once it is longer than the longest form + `limit`
        masker.limit = masker.keep + limit
    for chunk in chunks:
        masker.feed(chunk)
    masker.close()
    return b"".join(out)


def test_a_stream_is_masked_whatever_its_writes_split_even_inside_a_character() -> None:
    redactor = Redactor([HARD])
    data = f"a {HARD} b {quote(HARD).lower()} c\r{html.escape(HARD)}".encode() + b"\xff raw\n"
    one_by_one = _masked_stream([data[i:i + 1] for i in range(len(data))], redactor)
    assert one_by_one == b"a *** b *** c\r***\xff raw\n"
    unended = _masked_stream([data[i:i + 5] for i in range(0, len(data), 5)], redactor, limit=8)
    assert unended == one_by_one


def test_a_stream_writes_whole_lines_as_they_come_and_holds_only_an_unended_one() -> None:
    from adapters.bootstrap import OutputMasker

    out: list[bytes] = []
    masker = OutputMasker(Redactor([HARD]).pattern, Redactor([HARD]).longest, out.append)
    masker.feed(b"step 1\nstep 2\rpart")
    assert b"".join(out) == b"step 1\nstep 2\r"
    masker.close()
    assert b"".join(out) == b"step 1\nstep 2\rpart"


@pytest.mark.parametrize("form", ["plain", "base64", "url", "json"])
def test_a_file_holds_a_secret_in_any_form_even_across_the_chunks_it_is_read_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    secret = "pä ss/wörd+42"
    written = {"plain": secret, "base64": base64.b64encode(secret.encode()).decode(),
               "url": quote(secret), "json": json.dumps(secret)}[form].encode()
    redactor = Redactor([secret])
    monkeypatch.setattr(redaction, "SCAN_CHUNK_BYTES", 64)
    for offset in range(40, 80):  # the value starts before, at and after the first chunk's end
        path = tmp_path / f"out-{offset}.bin"
        path.write_bytes(bytes(range(256))[:offset] + written + b"\xff\x00" * 50)
        assert redaction.file_holds_secret(redactor, path), (form, offset)
    path.write_bytes(bytes(range(256)) * 8 + secret[:-1].encode())
    assert not redaction.file_holds_secret(redactor, path)
    assert not redaction.file_holds_secret(Redactor([]), path)
