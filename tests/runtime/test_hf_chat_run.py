"""RL on a user's Hugging Face checkpoint with its chat template, end to end: a tiny Qwen2
checkpoint (random weights, a byte-level BPE tokenizer trained on the task's text, a chat
template, two end-of-sequence ids) runs ``rlx run --model DIR --data X.jsonl --set
data.chat_template=true``; the replay is bit-exact, the audit clean, and the exported final
version loads in Transformers with the same logits and template. ``rlx pretrain --model``
warm-starts the same checkpoint into a new one that keeps its tokenizer files."""

from __future__ import annotations

import hashlib
import json

import pytest

from ledger import open_store
from runtime.cli import main
from runtime.errors import UsageError
from tests.runtime import small_run
from tests.runtime.model.tiny_checkpoint import CHAT_TEMPLATE, write_checkpoint

TINY = ['workers.mode="threads"', *small_run.TINY, "sampling.max_tokens=4"]


def _rows() -> list[dict]:
    rows: list[dict] = []
    for a in range(5):
        for b in range(5):
            question = f"What is {a} plus {b}?"
            if (a + b) % 3:
                rows.append({"prompt": question, "answer": str(a + b)})
            else:
                rows.append({"messages": [{"role": "system", "content": "Answer with a number."},
                                          {"role": "user", "content": question}], "answer": str(a + b)})
    return rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_chat")
    rows = _rows()
    texts = [r.get("prompt") or r["messages"][-1]["content"] for r in rows] + [r["answer"] for r in rows]
    write_checkpoint(root / "ckpt", [*texts, "Answer with a number."])
    (root / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "ckpt", root / "sums.jsonl"


def _sets(*overrides: str) -> list[str]:
    return [x for o in [*TINY, *overrides] for x in ("--set", o)]


@pytest.mark.slow
def test_rl_with_a_chat_template_replays_bit_exact_and_audits_clean(checkpoint, tmp_path):
    from runtime.replay import replay_run

    ckpt, data = checkpoint
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), "--no-progress", "--steps", "2", "--model", str(ckpt), "--data", str(data),
                 *_sets("data.chat_template=true")])
    assert code == 0
    with open_store(out) as store:
        events = [s.event for s in store.read("run")]
    started = events[0]
    finished = next(e for e in events if type(e).__name__ == "RunFinished")  # the final evaluation follows it
    assert [e.version for e in events if type(e).__name__ == "VersionEvaluated"] == [0, 2]
    assert started.config["data"]["chat_template"] is True
    assert started.config["data"]["chat_template_digest"] == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    assert type(finished).__name__ == "RunFinished"
    report = replay_run(str(out), regenerate=True)  # the prompts rebuilt: every rollout sampled again, same tokens
    assert report.match and report.final_digest == finished.final_digest
    assert report.rollouts_regenerated == 2 * 4 * 4  # steps x groups x group size
    assert main(["audit", str(out), "check"]) == 0
    # The final version exported as a checkpoint that Transformers loads, with the run's template.
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import numpy as np

    from runtime.model import load_hf

    exported = tmp_path / "exported"
    assert main(["export", str(out), "--version", "2", "--out", str(exported)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, torch_dtype=torch.float32).eval()
    tokens = np.array([[1, 5, 9, 14, 3, 7]], np.int64)
    with torch.no_grad():
        theirs = hf(input_ids=torch.from_numpy(tokens)).logits.float().numpy()
    ours = np.asarray(load_hf(exported).logits(tokens.astype(np.int32)))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    chat = transformers.AutoTokenizer.from_pretrained(exported)
    assert chat.chat_template == CHAT_TEMPLATE
    # Another template would render other prompts: the replay is refused before anything runs.
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    edited = tmp_path / "edited"
    import shutil

    shutil.copytree(ckpt, edited)
    (edited / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE + " "}))
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    with open_store(moved) as store:
        logged = next(store.read("run")).event.config
    assert logged["model"]["path"] == str(ckpt)
    shutil.move(str(ckpt), str(tmp_path / "original"))
    shutil.move(str(edited), str(ckpt))
    try:
        # The run recorded the checkpoint's files by digest: the edited template file is named
        # (data.chat_template_digest would refuse it too, for a ledger that records no inputs).
        with pytest.raises(UsageError, match=r"cannot replay: input file '.*/tokenizer_config\.json' has changed"):
            replay_run(str(moved))
    finally:
        shutil.rmtree(ckpt)
        shutil.move(str(tmp_path / "original"), str(ckpt))


@pytest.mark.slow
def test_pretrain_warm_starts_a_checkpoint_and_keeps_its_tokenizer_files(checkpoint, tmp_path, capsys):
    from runtime.model import load_hf

    ckpt, data = checkpoint
    warm = tmp_path / "warm"
    argv = ["pretrain", "--model", str(ckpt), "--data", str(data), "--steps", "5", "--out", str(warm),
            *_sets(f'pretrain.cache_dir="{tmp_path / "cache"}"', "pretrain.batch_size=8",
                   "data.chat_template=true")]
    assert main(argv) == 0
    assert "held-out greedy pass rate" in capsys.readouterr().out
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (warm / name).read_bytes() == (ckpt / name).read_bytes()
    before, after = load_hf(ckpt), load_hf(warm)
    assert after.config == before.config
    assert (after.params["embed_tokens"]["embedding"] != before.params["embed_tokens"]["embedding"]).any()
    out = tmp_path / "run"  # and RL starts from it
    assert main(["run", "--out", str(out), "--no-progress", "--steps", "1", "--model", str(warm), "--data", str(data),
                 *_sets("data.chat_template=true")]) == 0
