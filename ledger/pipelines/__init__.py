"""Apache Beam pipelines over ledgers (see :mod:`ledger.pipelines.rollouts` and
:mod:`ledger.pipelines.prompts`).

:func:`export_run` writes a run's rollout rows and version statistics as JSON lines (strict
JSON: a non-finite float is null, see :mod:`ledger.pipelines.jsonl`);
:func:`curate_run` writes the prompts whose pass rate lies in a band, as data for the next run,
with per-prompt statistics. The transforms compose into other pipelines
(``ReadLedger | RolloutRows | …``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

from ledger.errors import LedgerError
from ledger.pipelines import jsonl
from ledger.pipelines.prompts import PassBand, PromptStats, VersionRange
from ledger.pipelines.rollouts import DEFAULT_RANGE, ReadLedger, RolloutRows, StepRows, VersionStats

OUTPUTS = ("rollouts", "versions", "steps")


FORMATS = ("json", "parquet")


def _refuse_existing(out: str) -> None:
    """A local output directory must not already hold an export (its shards would mix)."""
    if "://" in out:
        return
    found = sorted(f for name in OUTPUTS for ext in ("jsonl", "parquet")
                   for f in glob.glob(os.path.join(out, f"{name}-*.{ext}")))
    if found:
        raise LedgerError(f"{out!r} already holds an export ({os.path.basename(found[0])}, …); "
                          "choose another directory or remove those files")


OPEN_PORTS_ENV = "RLX_ALLOW_BEAM_GRPC"
"""Set to ``1`` to let a pipeline run in a mode that starts Beam's own gRPC servers, which listen
on every network interface and take no token."""


def _open_ports(known: dict) -> str | None:
    """The option that makes Beam start its own gRPC servers on every interface, if any: the
    direct runner's multi-threading and multi-processing modes (workers over gRPC), and a portable
    runner with no job endpoint of its own (a local job service)."""
    mode = known.get("direct_running_mode")
    if mode in ("multi_threading", "multi_processing"):
        return f"--direct_running_mode={mode}"
    runner = known.get("runner") or ""
    if runner.rsplit(".", 1)[-1] == "PortableRunner" and known.get("job_endpoint") in (None, "embed"):
        return f"--runner={runner} without --job_endpoint"
    return None


def _pipeline(options):
    """A Beam pipeline on ``options``; unknown options and runners are errors, not warnings, and so
    is a mode that opens Beam's unauthenticated gRPC ports on every interface, unless
    ``$RLX_ALLOW_BEAM_GRPC`` is ``1``."""
    import apache_beam as beam

    known = options.get_all_options()
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        raise LedgerError(f"unknown Beam pipeline options: {', '.join('--' + u for u in unknown)}")
    wide = _open_ports(known)
    if wide is not None and os.environ.get(OPEN_PORTS_ENV) != "1":
        raise LedgerError(f"{wide} starts Beam's gRPC servers on every network interface with no token; run "
                          f"in-process (the default), or set {OPEN_PORTS_ENV}=1 on a host whose network you trust")
    try:
        return beam.Pipeline(options=options)
    except ValueError as e:
        raise LedgerError(f"Beam pipeline options: {e}") from None


def export_run(target: str, run_id: str, out: str, *, range_events: int = DEFAULT_RANGE,
               pipeline_args: Sequence[str] = (), annotate=None, format: str = "json") -> dict:
    """Write ``out/rollouts-*.jsonl`` (one row per rollout), ``out/versions-*.jsonl`` (one row
    per policy version) and ``out/steps-*.jsonl`` (one row per train step) for run ``run_id``
    of the ledger at ``target``.

    ``pipeline_args`` are Beam pipeline options (``--runner=…`` and the runner's own); the
    default is the in-process ``DirectRunner``. ``annotate``, a transform of rollout rows to
    rollout rows, runs before they are written (e.g. to add text). ``format="parquet"`` writes
    ``*.parquet`` files instead, through Beam's Parquet sink, with the explicit schemas of
    :mod:`ledger.pipelines.columnar`. Returns the number of events read and of rows
    written. Checks the target, the run and ``out`` before anything is written.
    """
    import apache_beam as beam
    from apache_beam.metrics.metric import Metrics, MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    if format not in FORMATS:
        raise LedgerError(f"export format {format!r} is not accepted; accepted: {', '.join(FORMATS)}")
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

        if format == "parquet":
            from ledger.pipelines.columnar import SCHEMAS, to_record

            schema = SCHEMAS[name]

            def record(row: dict) -> dict:
                counter.inc()
                return to_record(row, schema)

            return (rows
                    | f"Record{name.title()}" >> beam.Map(record)
                    | f"Write{name.title()}" >> beam.io.WriteToParquet(os.path.join(out, name), schema,
                                                                       file_name_suffix=".parquet"))

        def encode(row: dict) -> str:
            counter.inc()
            return jsonl.dumps(row)

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


def _write_lines(rows: list, path: str) -> None:
    """Write ``(key, row)`` pairs as JSON lines in key order, through Beam's file systems (so
    ``path`` may be any URL the runner can write)."""
    from apache_beam.io.filesystems import FileSystems

    body = "".join(jsonl.dumps(row) + "\n" for _, row in sorted(rows, key=lambda kv: kv[0]))
    with FileSystems.create(path) as f:
        f.write(body.encode("utf-8"))


def curate_run(target: str, run_id: str, out: str, stats: str, *, data_row, versions: VersionRange | None = None,
               band: PassBand | None = None, range_events: int = DEFAULT_RANGE,
               pipeline_args: Sequence[str] = ()) -> dict:
    """Write to ``out`` the data rows of the prompts of run ``run_id`` whose pass rate over the
    rollouts sampled from ``versions`` lies in ``band``, and to ``stats`` one statistics row per
    sampled prompt (:class:`PromptStats`, with ``kept``). Both files are JSON lines in prompt
    index order, each written whole by one worker.

    ``data_row`` is a ``beam.DoFn`` from a kept statistics row to ``(prompt_index, data row)``:
    the caller knows how the run's task maps a prompt index to a row of data. Returns counts:
    events read, prompts sampled, prompts kept, rollouts scored.
    """
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    read = ReadLedger(target, run_id, range_events)
    pipeline = _pipeline(PipelineOptions(list(pipeline_args)))
    events = pipeline | "ReadLedger" >> read
    prompts = (events
               | "RolloutRows" >> RolloutRows(run_id)
               | "PromptStats" >> PromptStats(run_id, versions or VersionRange(), band or PassBand()))
    (prompts
     | "StatsKeyed" >> beam.Map(lambda r: (r["prompt_index"], r))
     | "StatsList" >> beam.combiners.ToList()
     | "WriteStats" >> beam.Map(_write_lines, stats))
    (prompts
     | "Kept" >> beam.Filter(lambda r: r["kept"])
     | "DataRow" >> beam.ParDo(data_row)
     | "DataList" >> beam.combiners.ToList()
     | "WriteData" >> beam.Map(_write_lines, out))
    pipeline.run().wait_until_finish()
    with FileSystems.open(stats) as f:
        rows = [json.loads(line) for line in f.read().decode("utf-8").splitlines()]
    return {"events": read.head, "prompts": len(rows), "kept": sum(r["kept"] for r in rows),
            "rollouts": sum(r["rollouts"] for r in rows)}


__all__ = ["DEFAULT_RANGE", "PassBand", "PromptStats", "ReadLedger", "RolloutRows", "StepRows", "VersionRange",
           "VersionStats", "curate_run", "export_run"]
