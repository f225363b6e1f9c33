"""``rlx run`` and ``rlx pretrain``: run RL end to end, or only the supervised warm start."""

from __future__ import annotations

import argparse
import os


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The config of a new run: a TOML file, shortcuts for common fields and ``--set`` overrides
    (read back by :func:`_config`)."""
    p.add_argument("config", nargs="?", help="TOML config file (default: the built-in demo)")
    p.add_argument("--steps", type=int, help="training steps (run.steps)")
    p.add_argument("--seed", type=int, help="run seed (run.seed)")
    p.add_argument("--model", help="local Hugging Face checkpoint directory (model.path)")
    p.add_argument("--data", help="JSONL file of {prompt, answer} or {prompt, tests} rows (data.path; "
                                  "{prompt, calls} rows with --set data.task=codefn)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config value, e.g. --set algorithm.name=rloo (repeatable)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run RL end to end (no arguments: the built-in arithmetic demo)")
    add_config_arguments(p)
    p.add_argument("--out", help="run directory for ledger.db, params/, summary.json, report.png (default: a new "
                                 "runs/NAME, runs/NAME-2, … where NAME is the config file's name, or demo)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=cmd_run, steps_field="run.steps")

    p = subparsers.add_parser("pretrain", help="only the supervised warm start: train it (or load it from the cache), "
                                               "evaluate it, optionally save it")
    p.add_argument("config", nargs="?", help="TOML config file (default: the built-in demo)")
    p.add_argument("--steps", type=int, help="supervised steps (pretrain.steps)")
    p.add_argument("--seed", type=int, help="run seed (run.seed)")
    p.add_argument("--model", help="local Hugging Face checkpoint directory to warm-start (model.path; default: "
                                   "the built-in model)")
    p.add_argument("--data", help="JSONL file of {prompt, answer} or {prompt, tests} rows (data.path; "
                                  "{prompt, calls} rows with --set data.task=codefn)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config value, e.g. --set pretrain.learning_rate=3e-3 (repeatable)")
    p.add_argument("--out", help="also save the warm-started model here, a Hugging Face checkpoint for --model")
    p.set_defaults(func=cmd_pretrain, steps_field="pretrain.steps")

    p = subparsers.add_parser("resume", help="continue a run that was killed or crashed")
    p.add_argument("out", metavar="DIR", help="the run directory")
    p.add_argument("--run", dest="run_id", help="the run id (default: the only run in DIR)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=cmd_resume)


def config_from_args(args: argparse.Namespace):
    from runtime.config import load_config

    overrides = []
    if args.data is not None:  # before --set, so that a task reading data files itself can be named
        overrides += [f"data.path={_toml_string(args.data)}", "data.task=\"jsonl\""]
    overrides += args.overrides
    if args.steps is not None:
        overrides.append(f"{args.steps_field}={args.steps}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    if args.model is not None:
        overrides.append(f"model.path={_toml_string(args.model)}")
    return load_config(args.config, overrides)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


RUNS_DIR = "runs"


def default_out(config_file: str | None, runs_dir: str = RUNS_DIR) -> str:
    """The first of ``runs/NAME``, ``runs/NAME-2``, ``runs/NAME-3``, … that does not exist, where NAME
    is the config file's name without its suffix (``demo`` without one): each run started without
    ``--out`` gets a directory of its own, so the README's commands run one after another."""
    name = "demo"
    if config_file is not None:
        name = os.path.splitext(os.path.basename(config_file))[0] or name
    candidate, number = os.path.join(runs_dir, name), 1
    while os.path.lexists(candidate):
        number += 1
        candidate = os.path.join(runs_dir, f"{name}-{number}")
    return candidate


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runtime import compile_cache
    from runtime.run import run

    config = config_from_args(args)
    if config.trainer.exact_logprobs:  # compiled without fused multiply-adds, the workers it starts too
        from runtime.numerics import ensure_exact_process

        ensure_exact_process()
    compile_cache.enable()  # the model, engine and train step this machine compiled before
    console = Console()
    out = args.out
    if out is None:
        out = default_out(args.config)
        console.print(f"run directory: {out} (--out names another)")
    summary = run(config, out, progress=not args.no_progress, log=lambda m: console.print(m))
    print_summary(console, summary, out)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    """The warm start ``rlx run`` would begin from, through the same cache, and its pass rate. With
    ``--model`` the checkpoint itself is warm-started (``rlx run`` uses a checkpoint as it is), and
    the saved copy keeps its tokenizer, chat template and generation files."""
    from rich.console import Console

    from runtime import compile_cache
    from runtime.errors import UsageError
    from runtime.evaluation import greedy_pass_rate
    from runtime.session import build_session

    config = config_from_args(args)
    compile_cache.enable()
    if config.pretrain.steps < 1:
        raise UsageError(f"pretrain.steps must be >= 1 for rlx pretrain, got {config.pretrain.steps}")
    if args.out is not None:
        from runtime.rundir import RunDir

        RunDir(args.out).check_creatable()
        if os.path.exists(os.path.join(args.out, "config.json")):
            raise UsageError(f"{args.out!r} already holds a checkpoint (config.json); choose another --out")
    console = Console()
    session = build_session(config, log=lambda m: console.print(m), warm_checkpoint=True, progress=True)
    rate = greedy_pass_rate(session.engine, session.task, session.codec, session.model.params,
                            size=config.eval.size, max_tokens=config.max_tokens)
    warm = session.warm_start
    console.print(f"checkpoint ({'loaded from the cache' if warm['cached'] else 'trained now'}): {warm['checkpoint']}")
    console.print(f"held-out greedy pass rate: {rate:.1%} ({min(config.eval.size, session.task.eval_size)} problems)")
    if args.out is not None:
        from runtime.model import save_hf

        save_hf(args.out, session.model)
        if config.model.path is not None:
            from runtime.model.hf_text import copy_text_files

            copy_text_files(config.model.path, args.out)
        console.print(f"saved to {args.out}: `rlx run --model {args.out}` starts RL from it")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runtime import compile_cache
    from runtime.run import resume

    compile_cache.enable()  # a resume goes back to work without compiling again what the run compiled
    console = Console()
    summary = resume(args.out, run_id=args.run_id, progress=not args.no_progress, log=lambda m: console.print(m))
    if summary is not None:
        print_summary(console, summary, args.out)
    return 0


def print_summary(console, summary: dict, out: str) -> None:
    from rich.table import Table

    from runtime.rundir import RunDir

    t = Table(title=f"{out} (run {summary['run']!r})", show_header=False)
    before, after = summary["eval_before"], summary["eval_after"]
    rows = [
        ("steps", str(summary["steps"])),
        ("held-out pass rate", "not evaluated (eval.every_steps = 0)" if after is None else
         f"{'-' if before is None else f'{before:.1%}'} → {after:.1%} "
         f"({summary['eval_size']} problems, greedy, versions 0 and {summary['final_version']})"),
        ("train reward", f"{summary['reward_curve'][0]:.3f} → {summary['reward_curve'][-1]:.3f}"
         if summary["reward_curve"] else "-"),
        ("rollouts", f"{summary['rollouts']} ({summary['rollout_tokens_per_s']:,.0f} tokens/s)"),
        ("steps/min", _speed(summary)),
        ("final version", f"{summary['final_version']}  digest {summary['final_digest'][:16]}"),
        ("wall time", f"{summary['total_seconds']:.0f} s (RL {summary['rl_seconds']:.0f} s)"),
        ("machine", summary.get("machine") or "-"),
        ("files", f"{RunDir(out).ledger}, summary.json, report.png"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


def _speed(summary: dict) -> str:
    """Steps/min of the RL time this process saw; a resumed run says which steps those were."""
    speed = f"{summary['steps_per_minute']:.1f}"
    here = summary["steps_here"]
    if here != summary["steps"]:
        speed += f" (the {here} steps since the resume, in {summary['rl_seconds']:.0f} s)"
    return speed


def run_fork(out: str, no_run: bool, no_progress: bool, console, compile_cache) -> int:
    """Run the fork just created in ``out`` to its end (unless ``no_run``), as ``rlx resume`` would."""
    from runtime.run import resume

    if no_run:
        console.print(f"`rlx resume {out}` runs it")
        return 0
    compile_cache.enable()
    summary = resume(out, progress=not no_progress, log=lambda m: console.print(m, highlight=False))
    if summary is not None:
        print_summary(console, summary, out)
    return 0
