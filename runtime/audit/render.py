"""Readable tables (rich) of the audit documents built by ``runtime.audit.provenance``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def _pairs(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    for k, v in rows:
        t.add_row(k, _fmt(v))
    return t


def _rollouts(rows: list[dict[str, Any]]) -> Table:
    fold: dict[str, Any] = {"overflow": "fold"}
    t = Table("id", "group", Column("prompt", **fold), Column("seed", **fold), "from v", "stale",
              Column("worker", **fold), "leases", "reward", Column("verdict", **fold),
              title="rollouts of the batch", title_justify="left")
    for r in rows:
        prompt = f"{r['prompt_index']}" + (f" {r['prompt']!r}" if r["prompt"] is not None else "")
        t.add_row(str(r["rollout_id"]), str(r["group_id"]), prompt, str(r["seed"]), str(r["policy_version"]),
                  _fmt(r["staleness"]), _fmt(r["worker"]), str(r["attempts"]), _fmt(r["reward"]), _fmt(r["verdict"]))
    return t


def _shared(rows: list[dict[str, Any]], show) -> str | None:
    """``show(row)`` when every row gives the same text, else None."""
    values = {show(r) for r in rows}
    return values.pop() if len(values) == 1 else None


def step(console: Console, doc: dict[str, Any], *, rollouts: bool = True) -> None:
    """A step: batch, parent and produced versions, metrics."""
    produced = doc["produced"]
    console.print(_pairs(f"step {doc['step']}", [
        ("batch", (f"seq {doc['batch_seq']}: {len(doc['group_ids'])} groups {doc['group_ids']}, "
                   f"{len(doc['rollout_ids'])} rollouts")),
        ("sampled from", (f"versions {doc['policy_versions']}, staleness max {doc['staleness_max']}, "
                          f"mean {doc['staleness_mean']:.3g}")),
        ("parent", None if doc["parent"] is None else f"version {doc['parent']['version']} {doc['parent']['digest']}"),
        ("trained", None if doc["trained_seq"] is None else f"seq {doc['trained_seq']}, batch digest {doc['batch_digest']}"),
        ("produced", None if produced is None else f"version {produced['version']} {produced['digest']} (seq {produced['seq']})"),
    ]))
    if doc["metrics"]:
        t = Table("metric", "value", title="metrics", title_justify="left")
        for k, v in doc["metrics"].items():
            t.add_row(k, _fmt(v))
        console.print(t)


def _evaluation(e: dict[str, Any] | None) -> str | None:
    if e is None:
        return None
    return (f"greedy {e['greedy_pass_rate']:.1%}, pass@{e['k']} {e['pass_at_k']:.1%} ({e['samples']} samples, "
            f"{e['sampled_pass_rate']:.1%} passed) on {e['problems']} problems (seq {e['seq']})")


def _more(count: int, what: str) -> str:
    return f"… {count} more {what} (--all lists every one)"


def _chain(links: list[dict[str, Any]], shown: int | None) -> Table:
    """The parent chain: the newest ``shown - 1`` links and version 0 when it is longer."""
    t = Table("version", "digest", "published at seq", title="parent chain", title_justify="left")
    cut = shown is not None and len(links) > shown
    head, tail = (links[: shown - 1], links[-1:]) if cut and shown else (links, [])
    for link in head:
        t.add_row(str(link["version"]), link["digest"], str(link["seq"]))
    if tail:
        t.add_row("…", _more(len(links) - len(head) - 1, "versions"), "")
        for link in tail:
            t.add_row(str(link["version"]), link["digest"], str(link["seq"]))
    return t


def _batch_summary(rows: list[dict[str, Any]]) -> str:
    """One line over every rollout of a batch: outcomes, rewards, staleness, workers."""
    scored = [r for r in rows if r["reward"] is not None]
    passed = sum(1 for r in scored if r["passed"])
    stale = sorted({r["staleness"] for r in rows if r["staleness"] is not None})
    workers = {r["worker"] for r in rows if r["worker"] is not None}
    parts = [f"{len(rows)} rollouts", f"{passed} of {len(scored)} scored passed"]
    if scored:
        parts.append(f"mean reward {_fmt(sum(r['reward'] for r in scored) / len(scored))}")
    if stale:
        parts.append(f"staleness {stale[0]}" + (f"–{stale[-1]}" if len(stale) > 1 else ""))
    parts.append(f"{len(workers)} worker{'' if len(workers) == 1 else 's'}")
    return ", ".join(parts)


def version(console: Console, doc: dict[str, Any], *, shown: int | None = None) -> None:
    """A version's lineage: parent chain, producing step, batch rollouts.

    ``shown``: how many links of the parent chain and rollouts of the batch to list (None: all);
    a longer list ends with a row saying how many more there are.
    """
    console.print(_pairs(f"version {doc['version']}", [
        ("digest", doc["digest"]),
        ("published", f"seq {doc['seq']}"),
        ("retired", None if doc["retired_seq"] is None else f"seq {doc['retired_seq']}"),
        ("origin", doc["origin"]),
        ("held-out", _evaluation(doc.get("evaluation"))),
    ]))
    console.print(_chain(doc["parent_chain"], shown))
    if doc["step"] is not None:
        step(console, doc["step"])
    rows = doc["rollouts"]
    if rows:
        console.print(_rollouts(rows if shown is None else rows[:shown]))
        if shown is not None and len(rows) > shown:
            console.print(_more(len(rows) - shown, "rollouts"), highlight=False)
        console.print(f"batch: {_batch_summary(rows)}", highlight=False)
        sampling = _shared(rows, lambda r: _fmt(r["sampling"]))
        verifier = _shared(rows, lambda r: f"{_fmt(r['verifier'])} {_fmt(r['verifier_version'])}")
        if sampling is not None:
            console.print(f"sampling: {sampling}", highlight=False)
        if verifier is not None:
            console.print(f"verifier: {verifier}", highlight=False)
        else:
            t = Table("id", "verifier", title="verifiers", title_justify="left")
            for r in rows if shown is None else rows[:shown]:
                t.add_row(str(r["rollout_id"]), f"{_fmt(r['verifier'])} {_fmt(r['verifier_version'])}")
            console.print(t)


def rollout(console: Console, doc: dict[str, Any]) -> None:
    """A rollout: what it was and its history."""
    console.print(_pairs(f"rollout {doc['rollout_id']}", [
        ("group / batch", f"group {doc['group_id']} of batch {doc['batch']}"),
        ("prompt", f"{doc['prompt_index']}" + (f" {doc['prompt']!r}" if doc["prompt"] is not None else "")),
        ("seed", doc["seed"]),
        ("sampling", doc["sampling"]),
        ("policy version", doc["policy_version"]),
        ("staleness", doc["staleness"]),
        ("worker", f"{_fmt(doc['worker'])} ({doc['attempts']} lease{'' if doc['attempts'] == 1 else 's'})"),
        ("outcome", None if doc["reward"] is None else
         f"reward {_fmt(doc['reward'])}, {doc['verdict']} by {doc['verifier']} {doc['verifier_version']}"),
        ("consumed by step", doc["consumed_by_step"]),
        ("produced version", None if doc["produced_version"] is None else
         f"{doc['produced_version']['version']} {doc['produced_version']['digest']}"),
        ("discarded", doc["discarded"]),
    ]))
    t = Table("seq", "event", "detail", title="history", title_justify="left")
    for h in doc["history"]:
        t.add_row(str(h["seq"]), h["event"], h["detail"])
    console.print(t)
    if doc.get("turns"):
        console.print(_turns(doc["turns"]))


def _escaped(text: str | None) -> str:
    """A model's or an environment's text on one line: its line breaks shown as ``\\n``."""
    return "-" if text is None else text.replace("\n", "\\n")


def _turns(turns: list[dict[str, Any]]) -> Table:
    """A multi-turn episode turn by turn: the model's ids, its tool call and the ids appended."""
    t = Table("turn", "model sampled", "tool call", "environment appended", title="episode", title_justify="left")
    for turn in turns:
        call = turn["call"]
        called = "-" if call is None else (
            f"{call['tool'] or '(malformed)'}: {call['arguments'][:80]!r}\n{call['status']}"
            + (f", exit {call['exit_status']}" if call["exit_status"] is not None else "")
            + f", {call['wall_s'] * 1000:.2f} ms" + (", output cut" if call["truncated"] else "")
            + (f"\n{call['detail']}" if call["detail"] else ""))
        # Text cells: a model's or a tool's text is shown as it is, never read as markup
        t.add_row(str(turn["turn"]), Text(f"{turn['sampled']} ids\n{_escaped(turn['sampled_text'])}"), Text(called),
                  Text(f"{turn['appended']} ids\n{_escaped(turn['appended_text'])}"))
    return t


def check(console: Console, run_id: str, chain, rows: list[dict[str, Any]], *, params_checked: bool) -> None:
    """The invariant check: OK, or the violating events."""
    if not chain.ok:
        console.print(f"[bold red]run {run_id}: ledger CORRUPT at seq {chain.first_bad_seq}[/]: {chain.reason}",
                      highlight=False)
        return
    where = "ledger and parameter store" if params_checked else "ledger (no parameter store found)"
    if not rows:
        console.print(f"[bold green]run {run_id}: I1–I8 hold[/] over {chain.events} events ({where})", highlight=False)
        return
    t = Table("invariant", "seq", "event", "violation", title=f"run {run_id}: {len(rows)} violations ({where})",
              title_justify="left")
    for r in rows:
        t.add_row(r["invariant"], str(r["seq"]), r["kind"], r["message"])
    console.print(t)


def layout(console: Console, run_id: str, recorded: dict[str, Any] | None, workers: list[dict[str, Any]]) -> None:
    """The run's device layout (``RunStarted``) and what each worker that joined saw."""
    if recorded is None:
        console.print(f"run {run_id}: no device layout recorded (a run logged before layouts were)")
    elif recorded.get("inherit"):
        console.print(f"run {run_id}: every process saw the host's devices ({recorded.get('devices')} "
                      f"{recorded.get('backend')})")
    else:
        rows = [("backend", f"{recorded.get('devices')} {recorded.get('backend')}"),
                ("trainer", _ids(recorded.get("trainer"))),
                *((f"inference-{n}", _ids(ids)) for n, ids in enumerate(recorded.get("inference") or [])),
                ("evaluator", _ids(recorded.get("evaluator")) if recorded.get("evaluator") else "none (CPU)")]
        if recorded.get("memory_fractions"):
            rows.append(("memory fractions", recorded["memory_fractions"]))
        console.print(_pairs(f"device layout of run {run_id}", rows))
    t = Table("seq", Column("worker", overflow="fold"), "role", "devices", "backend", "kind", "local", "memory limit",
              title="workers as they joined", title_justify="left")
    for w in workers:
        limit = w.get("memory_limit_bytes")
        memory = "-" if limit is None else f"{limit / 2**30:.1f} GiB"
        if w.get("memory_fraction") is not None:
            memory += f" ({w['memory_fraction']:.0%})"
        t.add_row(str(w["seq"]), w["worker_id"], w["role"], "inherited" if w.get("devices") is None else _ids(w["devices"]),
                  _fmt(w.get("backend")), _fmt(w.get("kind")), _fmt(w.get("local")), memory)
    console.print(t)


def _ids(ids: Any) -> str:
    return ",".join(map(str, ids)) if ids else "-"
