"""Apache Beam pipelines over ledgers (see :mod:`ledger.pipelines.rollouts`).

:func:`export_run` writes a run's rollout rows and version statistics as JSON lines; the
transforms compose into other pipelines (``ReadLedger | RolloutRows | …``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

from ledger.errors import LedgerError
from ledger.pipelines.rollouts import DEFAULT_RANGE, ReadLedger, RolloutRows, StepRows, VersionStats

OUTPUTS = ("rollouts", "versions", "steps")


def _refuse_existing(out: str) -> None:
    """A local output directory must not already hold an export (its shards would mix)."""
    if "://" in out:
        return
    found = sorted(f for name in OUTPUTS for f in glob.glob(os.path.join(out, f"{name}-*.jsonl")))
    if found:
        raise LedgerError(f"{out!r} already holds an export ({os.path.basename(found[0])}, …); "
                          "choose another directory or remove those files")


def _pipeline(options):
    """A Beam pipeline on ``options``; unknown options and runners are errors, not warnings."""
    import apache_beam as beam

    known = options.get_all_options()
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        raise LedgerError(f"unknown Beam pipeline options: {', '.join('--' + u for u in unknown)}")
    try:
        return beam.Pipeline(options=options)
    except ValueError as e:
        raise LedgerError(f"Beam pipeline options: {e}") from None


def export_run(target: str, run_id: str, out: str, *, range_events: int = DEFAULT_RANGE,
               pipeline_args: Sequence[str] = (), annotate=None) -> dict:
    """Write ``out/rollouts-*.jsonl`` (one row per rollout), ``out/versions-*.jsonl`` (one row
    per policy version) and ``out/steps-*.jsonl`` (one row per train step) for run ``run_id``
    of the ledger at ``target``.

    ``pipeline_args`` are Beam pipeline options (``--runner=…`` and the runner's own); the
    default is the in-process ``DirectRunner``. ``annotate``, a transform of rollout rows to
    rollout rows, runs before they are written (e.g. to add text). Returns the number of events read and of rows
    written. Checks the target, the run and ``out`` before anything is written.
    """
    import apache_beam as beam
    from apache_beam.metrics.metric import Metrics, MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    read = ReadLedger(target, run_id, range_events)
    pipeline = _pipeline(PipelineOptions(list(pipeline_args)))
    _refuse_existing(out)
    if "://" not in out:
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"cannot create the output directory {out!r}: {e.strerror or e}") from None

    def write(rows, name: str):
        counter = Metrics.counter("rlx", name)

        def encode(row: dict) -> str:
            counter.inc()
            return json.dumps(row, sort_keys=True)

        return (rows
                | f"Json{name.title()}" >> beam.Map(encode)
                | f"Write{name.title()}" >> beam.io.WriteToText(os.path.join(out, name), file_name_suffix=".jsonl"))

    events = pipeline | "ReadLedger" >> read
    rows = events | "RolloutRows" >> RolloutRows(run_id)
    write(rows if annotate is None else rows | "Annotate" >> annotate, "rollouts")
    write(rows | "VersionStats" >> VersionStats(run_id), "versions")
    write(events | "StepRows" >> StepRows(run_id), "steps")
    result = pipeline.run()
    result.wait_until_finish()
    counts = {"events": read.head}
    for name in OUTPUTS:
        found = result.metrics().query(MetricsFilter().with_namespace("rlx").with_name(name))["counters"]
        counts[name] = sum(c.committed or 0 for c in found)
    return counts


__all__ = ["DEFAULT_RANGE", "ReadLedger", "RolloutRows", "StepRows", "VersionStats", "export_run"]
