"""``report.png``: the curves of a run (reward, pass rate, KL, staleness, log-prob mismatch, loss)
and its held-out evaluations (``VersionEvaluated``) against steps and against wall time."""

from __future__ import annotations


def plot_report(summary: dict, path: str) -> None:
    """Draw the per-step metrics of ``summary`` (as ``rlx run`` writes it) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in summary["metrics"]]

    def series(name: str) -> list[float]:
        return [m.get(name, float("nan")) for m in summary["metrics"]]

    panels = [
        ("reward (train batch)", [("reward_mean", "mean reward")]),
        ("pass rate", [("pass_rate", "train batch")]),
        ("KL", [("kl_ref", "to reference (k3)"), ("approx_kl", "to sampling policy (k3)")]),
        ("staleness (versions)", [("staleness_max", "max"), ("staleness_mean", "mean")]),
        ("inference vs trainer log-prob |Δ|", [("logprob_mismatch_max", "max"), ("logprob_mismatch_mean", "mean")]),
        ("loss", [("loss", "loss"), ("entropy", "entropy")]),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for ax, (title, lines) in zip(axes.flat, panels, strict=False):
        for key, label in lines:
            ax.plot(steps, series(key), label=label, linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    before, after = summary["eval_before"], summary["eval_after"]
    if before is not None and after is not None:  # versions 0 and final, as the ledger records them
        axes.flat[1].axhline(before, color="gray", linestyle="--", linewidth=1, label="held-out before")
        axes.flat[1].axhline(after, color="green", linestyle="--", linewidth=1, label="held-out after")
        axes.flat[1].legend(fontsize=8)
    _evaluations(axes.flat[6], axes.flat[7], summary.get("evaluations") or [])
    held_out = ("no held-out evaluation" if before is None or after is None else
                f"held-out pass rate {before:.1%} → {after:.1%} ({summary['eval_size']} problems)")
    fig.suptitle(f"run {summary['run']!r}: {summary['steps']} steps, {held_out}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _evaluations(by_step, by_time, evaluations: list[dict]) -> None:
    """The held-out greedy pass rate and pass@k of each evaluated version, against the step that
    produced it and against the wall time its result was recorded at."""
    k = evaluations[0]["k"] if evaluations else None
    for ax, x_key, x_label in ((by_step, "step", "step"), (by_time, "wall_seconds", "wall time (min)")):
        xs = [m[x_key] / (60.0 if x_key == "wall_seconds" else 1.0) for m in evaluations]
        ax.plot(xs, [m["greedy_pass_rate"] for m in evaluations], marker="o", linewidth=1.2, label="greedy")
        ax.plot(xs, [m["pass_at_k"] for m in evaluations], marker="s", linewidth=1.2, label=f"pass@{k}")
        ax.set_title("held-out pass rate (periodic)" if x_key == "step" else "held-out pass rate vs wall time",
                     fontsize=10)
        ax.set_xlabel(x_label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if evaluations:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no evaluations (eval.every_steps = 0)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="gray")
