"""The time-bounded math pool: hard timeouts from any thread, recovery, concurrency."""

import concurrent.futures
import threading

import pytest

from verifiers.errors import ConfigError
from verifiers.math import MathVerifier, judge_math
from verifiers.outcome import Verdict

# within every size bound, but expanding and comparing it takes sympy seconds
SLOW_GOLD, SLOW = "(x-y-1)^{40}", r"\boxed{(x+y+1)^{40}}"


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=2, timeout_s=20.0) as v:
        yield v


def test_pool_matches_the_pure_judge(verifier):
    for gold, response in [("1/2", r"\boxed{0.5}"), ("1e-7", "2e-7"), ("x+1", "1+x"), ("7", "none")]:
        assert verifier.verify(gold, response) == judge_math(gold, response)


def test_timeout_from_a_worker_thread_then_recovers(verifier):
    box = {}

    def hostile():
        box["outcome"] = verifier.verify(SLOW_GOLD, SLOW, timeout_s=0.5)

    thread = threading.Thread(target=hostile)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    outcome = box["outcome"]
    assert outcome.verdict is Verdict.TLE
    assert outcome.detail == "judging took longer than 0.5 s"
    assert verifier.verify("2", r"\boxed{2}").verdict is Verdict.AC


def test_concurrent_calls(verifier):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda i: verifier.verify(str(i), f"the answer is {i}"), range(60)))
    assert [o.verdict for o in outcomes] == [Verdict.AC] * 60


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="workers 0"):
        MathVerifier(workers=0)
    with pytest.raises(ConfigError, match="timeout_s -1"):
        MathVerifier(timeout_s=-1)
