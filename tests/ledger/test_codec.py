"""Canonical codec: same event, same bytes; arrays bit-exact; clear errors on bad input."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ledger import CodecError, RolloutCompleted, RunStarted, decode_body, encode_body, pack, unpack
from ledger.events import EVENTS


def _completion(tokens, logprobs) -> RolloutCompleted:
    return RolloutCompleted(7, "w-1", 0, 3, "ab" * 32, tokens, logprobs, "stop")


def test_dict_order_does_not_change_bytes():
    a = RunStarted("r", {"b": 1, "a": {"y": 2.5, "x": [1, 2]}}, "d", 1, {"jax": "0.10"})
    b = RunStarted("r", {"a": {"x": (1, 2), "y": 2.5}, "b": 1}, "d", 1, {"jax": "0.10"})
    assert encode_body(a) == encode_body(b)
    assert a == b and hash(a) == hash(b)


def test_bytes_are_stable_across_processes():
    code = (
        "import numpy as np; from ledger import RolloutCompleted, encode_body;"
        "e = RolloutCompleted(7, 'w-1', 0, 3, 'ab'*32, np.arange(5, dtype=np.int32),"
        " np.linspace(-1, 0, 5, dtype=np.float32), 'stop');"
        "print(encode_body(e).hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    here = _completion(np.arange(5, dtype=np.int32), np.linspace(-1, 0, 5, dtype=np.float32))
    assert bytes.fromhex(out) == encode_body(here)


@settings(max_examples=60)
@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.int32, np.int64, np.float32, np.float64, np.uint8, np.bool_, np.float16]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
        elements=None,
    )
)
def test_arrays_round_trip_bit_exactly(arr):
    ev = _completion(arr, arr)
    back = decode_body(ev.KIND, ev.VERSION, encode_body(ev))
    for got in (back.tokens, back.logprobs):
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert got.tobytes() == np.ascontiguousarray(arr).tobytes()  # NaN payloads included
    assert back == ev


def test_bfloat16_big_endian_and_non_contiguous_arrays():
    import ml_dtypes

    bf = np.array([1.5, -2.25, np.inf], dtype=ml_dtypes.bfloat16)
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(20, dtype=np.float32)[::3]
    for arr in (bf, big, strided):
        got = unpack(pack({"a": arr}))["a"]
        assert got.dtype.name == arr.dtype.name and got.shape == arr.shape
        np.testing.assert_array_equal(got.astype(np.float64), arr.astype(np.float64))
    assert unpack(pack(big)).dtype == np.dtype("<i4")  # canonical byte order


def test_decoded_arrays_are_read_only():
    back = unpack(pack(np.arange(3, dtype=np.int32)))
    with pytest.raises(ValueError):
        back[0] = 5


def test_floats_are_float64_and_nan_is_preserved():
    assert unpack(pack(0.1)) == 0.1
    assert pack(1.0)[0] == 0xCB  # msgpack float64 marker
    nan = unpack(pack(float("nan")))
    assert nan != nan


@pytest.mark.parametrize(
    "value, message",
    [
        ({1: "x"}, "keys must be str"),
        (object(), "cannot encode value of type object"),
        (np.array([object()]), "only numeric and bool arrays"),
        (2**70, "cannot encode"),
    ],
)
def test_unencodable_values_raise_codec_error(value, message):
    with pytest.raises(CodecError, match=message):
        pack(value)


def test_unknown_kind_is_a_codec_error_naming_known_kinds():
    with pytest.raises(CodecError, match=r"unknown event kind 'Nope'.*RunStarted"):
        decode_body("Nope", 1, pack({}))


@pytest.mark.parametrize(
    "body, message",
    [
        (b"\xc1", "malformed msgpack"),  # 0xc1 is never used by msgpack
        (b"\x01", "expected an array or a map of fields"),
        (b"\x93\x01\x02\x03", r"3 values for the 5 fields \['epoch', "),
        (pack({"epoch": 1}) + b"\x00", "malformed msgpack"),  # trailing bytes
        (pack({"epoch": 1}), "missing fields"),
        (pack({"epoch": 1, "head_seq": 0, "extra": 2}), "unknown fields"),
        (msgpack.packb({"epoch": msgpack.ExtType(9, b"")}), "unknown msgpack extension"),
        (msgpack.packb({"a": msgpack.ExtType(1, b"\x05int32\x01")}), "malformed array"),
        (msgpack.packb({"a": msgpack.ExtType(1, b"\x05int32\x01" + (3).to_bytes(8, "little") + b"\x00" * 5)}), "needs 12 bytes"),
    ],
)
def test_malformed_bodies_raise_codec_error(body, message):
    with pytest.raises(CodecError, match=message):
        decode_body("ControllerStarted", 1, body)


def test_newer_schema_version_is_refused():
    body = pack({"epoch": 1, "head_seq": 0, "fingerprint": {}})
    with pytest.raises(CodecError, match="newer than this software"):
        decode_body("ControllerStarted", 99, body)


def test_every_kind_of_the_design_is_registered():
    assert set(EVENTS.kinds()) >= {
        "RunStarted", "ControllerStarted", "PromptsSampled", "RolloutRequested", "RolloutAssigned",
        "RolloutCompleted", "RolloutAbandoned", "OutcomeRecorded", "BatchFormed", "TrainStepCompleted",
        "WeightsPublished", "WorkerJoined", "WorkerLost", "RunFinished",
    }


def test_events_are_frozen():
    ev = RunStarted("r", {}, "d", 1)
    with pytest.raises(AttributeError):
        ev.seed = 2  # type: ignore[misc]
