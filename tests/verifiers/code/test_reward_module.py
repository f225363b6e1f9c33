"""A user's reward function (verifiers.reward): read and checked without running it, then called in
the sandbox, one outcome per completion whose credit is the number it returned."""

from __future__ import annotations

import hashlib

import pytest

from verifiers.errors import ConfigError
from verifiers.outcome import Verdict
from verifiers.reward import RewardModule, RewardVerifier

EXACT = '''
def reward(prompt, completion, answer):
    if answer is None:
        return -1
    return 1.0 if completion.strip() == answer else 0.25 * (answer in completion)
'''


def module(tmp_path, source: str, spec: str = "r.py") -> RewardModule:
    (tmp_path / "r.py").write_text(source, encoding="utf-8")
    return RewardModule.load(str(tmp_path / spec))


def test_a_module_is_read_with_its_digest(tmp_path):
    m = module(tmp_path, EXACT)
    assert (m.function, m.digest) == ("reward", hashlib.sha256(EXACT.encode()).hexdigest())
    assert m.path == str(tmp_path / "r.py") and m.version == f"sha256:{m.digest}"
    other = module(tmp_path, EXACT + "\ndef score(p, c, a=None, *rest):\n    return 0\n", "r.py:score")
    assert other.function == "score" and other.digest != m.digest


@pytest.mark.parametrize("source, spec, message", [
    (EXACT, "missing.py", "missing.py does not exist"),
    (EXACT, "r.txt", "give a Python file, FILE.py"),
    (EXACT, "r.py:not-a-name", "give a Python file, FILE.py"),
    ("def reward(p, c, a):\n  return (\n", "r.py", "r.py is not valid Python: line 2"),
    ("def score(p, c, a):\n    return 1\n", "r.py", "defines no function 'reward' at its top level"),
    ("def reward(p, c):\n    return 1\n", "r.py", "reward must be a plain function taking three arguments"),
    ("async def reward(p, c, a):\n    return 1\n", "r.py", "reward must be a plain function"),
    ("def reward(p, c, a, d):\n    return 1\n", "r.py", "reward must be a plain function taking three"),
])
def test_bad_modules_are_refused_in_one_line_naming_the_file(tmp_path, source, spec, message):
    with pytest.raises(ConfigError) as info:
        module(tmp_path, source, spec)
    text = str(info.value)
    assert text.startswith("verifier.reward ") and message in text and "\n" not in text


def test_rewards_come_back_in_order_as_credits(tmp_path, namespaces_sandbox):
    m = module(tmp_path, EXACT)
    items = [("1+1=", "2", "2"), ("1+2=", "x3", "3"), ("1+3=", "5", "4"), ("?", "a", None)] * 3
    outcomes = RewardVerifier(m, namespaces_sandbox).score(items)
    assert [o.reward for o in outcomes] == [1.0, 0.25, 0.0, -1.0] * 3
    assert [o.verdict for o in outcomes] == [Verdict.AC, Verdict.WA, Verdict.WA, Verdict.WA] * 3
    assert {(o.verifier, o.version, o.isolation) for o in outcomes} == {("reward", m.version, "namespaces")}
    assert outcomes[1].detail == "reward 0.25"


def test_failed_calls_are_typed_outcomes_and_the_rest_still_scores(tmp_path, namespaces_sandbox):
    m = module(tmp_path, '''
def reward(prompt, completion, answer):
    if completion == "raise":
        raise ValueError("no number in it")
    if completion == "text":
        return "yes"
    if completion == "object":
        return object()
    if completion == "loop":
        while True:
            pass
    return 0.5
''')
    items = [("p", c, "a") for c in ("raise", "ok", "text", "object", "loop", "ok")]
    outcomes = RewardVerifier(m, namespaces_sandbox, call_wall_s=1.0).score(items)
    assert [o.verdict for o in outcomes] == [Verdict.RE, Verdict.WA, Verdict.INTERNAL_ERROR,
                                              Verdict.INTERNAL_ERROR, Verdict.TLE, Verdict.WA]
    assert [o.reward for o in outcomes] == [0.0, 0.5, 0.0, 0.0, 0.0, 0.5]
    assert "reward raised ValueError: no number in it" in outcomes[0].detail
    assert "reward returned 'yes' (str); it must return a finite number" in outcomes[2].detail


def test_the_probe_call_refuses_a_module_that_does_not_work(tmp_path, namespaces_sandbox):
    ok = module(tmp_path, EXACT)
    RewardVerifier(ok, namespaces_sandbox).check(("1+1=", "2", "2"))
    for source, message in [("def reward(p, c, a):\n    return [1]\n", "reward returned [1] (list)"),
                            ("import numpy\ndef reward(p, c, a):\n    return 1\n", "No module named 'numpy'"),
                            ("def reward(p, c, a):\n    return float('nan')\n", "reward returned nan")]:
        with pytest.raises(ConfigError) as info:
            RewardVerifier(module(tmp_path, source), namespaces_sandbox).check(("1+1=", "2", "2"))
        text = str(info.value)
        assert str(tmp_path / "r.py") in text and message in text and "\n" not in text, text
