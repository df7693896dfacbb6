"""Compact JSON (iac/wire/jsonutil.py): what the accelerated paths give is what json gives."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iac.wire.jsonutil import dumps_compact, loads_text

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _outcome(fn: Any, arg: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(arg)
    except (TypeError, ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@given(_JSON)
@settings(max_examples=150, deadline=None)
def test_dumps_and_loads_agree_with_json(value: Any) -> None:
    text = dumps_compact(value)
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert dumps_compact(value, ensure_ascii=True) == json.dumps(value, separators=(",", ":"))
    assert loads_text(text) == json.loads(text)


@given(st.text(alphabet=' \t\n{}[]":,0123456789.eE+-truefalsnl\\\ufeffx', max_size=24))
@settings(max_examples=300, deadline=None)
def test_loads_gives_json_loads_value_or_its_error(text: str) -> None:
    got, expected = _outcome(loads_text, text), _outcome(json.loads, text)
    if got[0] == "ok" and expected[0] == "ok" and isinstance(got[1], float) and math.isnan(got[1]):
        assert math.isnan(expected[1])
    else:
        assert got == expected


def test_dumps_refuses_what_json_refuses_with_the_same_error() -> None:
    circular: list[Any] = []
    circular.append(circular)
    for bad in ({"a": {1, 2}}, circular, [b"bytes"]):
        assert _outcome(dumps_compact, bad) == _outcome(
            lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False), bad
        )
        assert _outcome(dumps_compact, bad)[0] != "ok"
    # a failed value leaves nothing behind: the next one (the same list object id again) encodes
    assert dumps_compact([[1]]) == "[[1]]"


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400", '"\\ud800"', "0.1", "-0"])
def test_loads_takes_what_json_takes(text: str) -> None:
    got, expected = loads_text(text), json.loads(text)
    assert repr(got) == repr(expected)
