"""adapters.wire: the strict readers every wire format goes through."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adapters.storage import LEASE_LOG, RunFolder
from adapters.wire import MAX_DEPTH, Numbers, WireError, decimal_int, depth, load_json
from reconciler.daemon.loop import read_run

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_decimal_int_takes_ascii_digits_only() -> None:
    assert decimal_int("0") == 0 and decimal_int("1024") == 1024
    for bad in ("1_0", "+10", "-1", " 10", "10 ", "1.0", "0x10", "١٠", "²", "", "1" * 19):
        with pytest.raises(WireError, match="is not a decimal number"):
            decimal_int(bad)


@pytest.mark.parametrize("text, why", [
    (DEEP, "nested deeper than 64 levels"),
    (b'{"a": 1, "a": 2}', "key 'a' appears twice"),
    (b'{"price": NaN}', "NaN is not a JSON number"),
    (b'[Infinity]', "Infinity is not a JSON number"),
    (b'[-Infinity]', "-Infinity is not a JSON number"),
    (b'[1e999]', "too large for a number"),
    (b'\xff{}', "not JSON"),
    (b'{"a": ', "not JSON"),
], ids=["deep", "duplicate", "nan", "inf", "-inf", "overflow", "not-utf8", "cut"])
def test_load_json_refuses_what_rfc_8259_does_not_allow(text: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        load_json(text)


def test_load_json_reads_sound_json_and_counts_depth_outside_strings() -> None:
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load_json(nested) is not None
    assert load_json('{"s": "[[[[{{{{\\"]]"}') == {"s": '[[[[{{{{"]]'}
    assert depth(b'{"a": ["[", {"b": "}"}]}') == 3
    with pytest.raises(WireError, match="over the 10-byte limit"):
        load_json(json.dumps({"a": "0123456789"}), limit=10)


def test_numbers_are_finite_and_in_range_and_each_bad_field_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    numbers = Numbers("vast provider 'v'")
    assert numbers.number(0.4, "price") == 0.4 and numbers.number("0.40", "price") == 0.4
    assert numbers.number(None, "price") is None and numbers.number("", "price") is None
    with caplog.at_level("WARNING", logger="reconciler"):
        for bad in (math.nan, math.inf, -0.1, "nan", "1_0", True, [1], 2e4):
            assert numbers.number(bad, "price", high=1e4) is None
        assert numbers.count(2.5, "restarts") is None and numbers.count(3.0, "restarts") == 3
    assert [r.getMessage() for r in caplog.records] == [
        "vast provider 'v' answered a bad price: nan is not a number from 0 to 10000; what carried it is refused",
        "vast provider 'v' answered a bad restarts: 2.5 is not a whole number; what carried it is refused"]


def test_a_heartbeat_nested_too_deep_is_a_storage_error_not_a_crash(tmp_path: Path) -> None:
    """A worker's progress.json once raised RecursionError out of the tick."""
    store = f"file://{tmp_path}"
    RunFolder.for_run(store, "job", "r1").store.write("progress.json", DEEP)
    seen = read_run(store, "job", "r1", {})
    assert seen.error is not None and "nested deeper than 64 levels" in seen.error


@pytest.mark.parametrize("digits", ["²", "٣", "３"], ids=["superscript", "arabic-indic", "fullwidth"])
def test_labels_and_lease_names_read_ascii_digits_only(tmp_path: Path, digits: str) -> None:
    """str.isdigit() says yes to these: int() then raised on "²" (the whole provider's listing with
    it) and read the others as a number that no label of ours was written with."""
    from adapters.runpod import parse_labels
    from adapters.vast import parse_label

    assert parse_label(f"reconciler:o:j:r:{digits}") is None and parse_label("reconciler:o:j:r:3") == ("o", "j", "r", 3)
    assert parse_labels(f"o/j/r/e{digits}") is None and parse_labels("o/j/r/e3") == ("o", "j", "r", 3)
    folder = RunFolder.for_run(f"file://{tmp_path}", "job", "r1")
    folder.bump_lease()
    folder.store.write(f"{LEASE_LOG}/{digits}.json", b"{}")
    assert folder.lease_epoch() == 1
