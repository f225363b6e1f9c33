"""What a worker process builds when it starts: a verifier's task and codec without the model, and
the persistent compilation cache ``rlx worker`` turns on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.config import load_config
from runtime.session import build_codec, build_scoring, build_session

TINY = ["pretrain.steps=0", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=1", "model.num_kv_heads=1",
        "model.intermediate_size=16"]


def same_codec(a, b) -> bool:
    return (a.bos_id, a.eos_ids, a.tokenizer.to_str()) == (b.bos_id, b.eos_ids, b.tokenizer.to_str())


def test_the_verifiers_codec_is_the_sessions_without_building_the_model(tmp_path):
    import jax

    from runtime.model import Model, ModelConfig, char_tokenizer, save_hf

    config = load_config(None, TINY)
    session = build_session(config, log=lambda m: None)
    task, codec = build_scoring(config, log=lambda m: None)
    assert same_codec(codec, session.codec) and task.train_size == session.task.train_size
    # A Hugging Face checkpoint with its own special ids: read from config.json and tokenizer.json only.
    tok = char_tokenizer()
    mc = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                     intermediate_size=16, bos_token_id=3, eos_token_id=4, pad_token_id=0)
    save_hf(str(tmp_path / "ckpt"), Model.init(mc, key=jax.random.key(0), tokenizer=tok))
    config = load_config(None, [*TINY, f'model.path="{tmp_path / "ckpt"}"'])
    codec = build_codec(config)
    assert (codec.bos_id, codec.eos_ids) == (3, (4,))
    assert same_codec(codec, build_session(config, log=lambda m: None).codec)


@pytest.mark.slow
def test_worker_processes_keep_compiled_programs_on_disk(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["HOME"] = str(tmp_path)
    code = ("from runtime import compile_cache; import jax; print(compile_cache.enable()); "
            "print(jax.jit(lambda x: x * 3 + 1)(2.0))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    where, value = done.stdout.split()
    assert where == str(tmp_path / ".cache" / "rlx" / "jax") and value == "7.0"
    assert os.listdir(where)  # the program is in the cache
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "mine")  # a directory of the user's own is kept
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split()[0] == str(tmp_path / "mine") and os.listdir(tmp_path / "mine")


def test_calls_made_before_the_controller_exists_wait_for_it():
    """``rlx run`` starts its workers before its controller: their first call waits for it."""
    import threading
    import time

    from ledger import open_store
    from runtime.controller import ControllerLoop
    from runtime.host import Front
    from runtime.service.client import ControllerClient
    from runtime.service.server import ControllerService, PendingService, serve
    from verifiers.service.security import ListenAddress

    pending = PendingService()
    served = serve(pending, ListenAddress("127.0.0.1", 0))
    client = ControllerClient([f"127.0.0.1:{served.port}"])
    try:
        answers: list = []
        caller = threading.Thread(target=lambda: answers.append(client.describe()))
        caller.start()
        time.sleep(0.5)
        assert not answers  # still waiting
        config = load_config(None, ["run.steps=3", "sampling.group_size=2", "scheduling.groups_per_batch=2"],
                             data_size=8)
        ctrl = ControllerLoop.create(open_store("memory://"), run_id="r", config=config.to_dict(),
                                     config_digest=config.digest(), seed=1)
        pending.attach(ControllerService(Front(ctrl, config=config.to_dict(), params_url="memory://p")))
        caller.join(5.0)
        assert [(a.run_id, a.params_url) for a in answers] == [("r", "memory://p")]
        assert client.join("w", "verifier").worker_id == "w"  # later calls go straight through
    finally:
        client.close()
        served.stop(0)
