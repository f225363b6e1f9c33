"""``report.png``: the curves of a run (reward, pass rate, KL, staleness, log-prob mismatch, loss)."""

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
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for ax, (title, lines) in zip(axes.flat, panels, strict=False):
        for key, label in lines:
            ax.plot(steps, series(key), label=label, linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    axes.flat[1].axhline(summary["eval_before"], color="gray", linestyle="--", linewidth=1, label="held-out before")
    axes.flat[1].axhline(summary["eval_after"], color="green", linestyle="--", linewidth=1, label="held-out after")
    axes.flat[1].legend(fontsize=8)
    fig.suptitle(
        f"run {summary['run']}: {summary['steps']} steps, held-out pass rate "
        f"{summary['eval_before']:.1%} → {summary['eval_after']:.1%}", fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
