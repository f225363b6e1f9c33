"""``rlx curate``'s data rows: a run's prompt index back to a row the next run takes as ``--data``.

The ledger logs a prompt as an index into the training split of the run's task; the run's logged
config (``RunStarted``) names the task. For a task that read a data file (``data.path``) the row
is the file's own row, copied verbatim (its answer, tests or calls, its target), found through
the same seeded train/eval split the run used. For a generated task it is the task's
:meth:`~runtime.tasks.Task.data_row`, a row the same task reads back as the same problem, judged
the same way: ``{"prompt", "answer"}`` for arithmetic (the math verifier), ``{"prompt",
"calls", "target"}`` function tests for ``codefn`` (the code sandbox; the next run names the
task, :attr:`DataSource.run_args`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import apache_beam as beam

from runtime.errors import UsageError


class DataSource:
    """Prompt index → data row for the run whose resolved config is ``config``.

    Refuses (one line) a config that cannot be rebuilt, a data file that is gone, and a data
    file whose training split no longer has the size the run logged (it was edited since; an
    edit that keeps the row count is not detected: the ledger holds no digest of the file).
    """

    def __init__(self, config: dict) -> None:
        from runtime.config import Config
        from runtime.session import make_task
        from runtime.tasks.jsonl import read_rows

        if not config:
            raise UsageError("the run's first event is not RunStarted: its config (and so its data) is unknown")
        cfg = Config.from_dict(config)
        self.task = make_task(cfg)
        self.rows = None
        if getattr(self.task, "path", None) is not None:
            logged = cfg.data.size
            if logged is not None and logged != self.task.train_size:
                raise UsageError(f"data file {self.task.path!r} now has {self.task.train_size} training rows; the run "
                                 f"logged {logged} (it changed since the run, so the run's prompt indices name other rows)")
            self.rows = read_rows(self.task.path)

    def row(self, index: int) -> object:
        if self.rows is not None:
            return self.rows[self.task.train_row(index)]
        return self.task.data_row(index)

    def run_args(self, out: str) -> str:
        """The ``rlx run`` arguments that train on the curated file ``out`` with this task."""
        if self.task.name == "jsonl" or not self.task.reads_path:
            return f"--data {shlex.quote(out)}"
        return f"--data {shlex.quote(out)} --set data.task={self.task.name}"


class DataRows(beam.DoFn):
    """Kept prompt statistics rows → ``(prompt_index, data row)``; each worker rebuilds the
    run's task once from the logged config."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.source: DataSource | None = None

    def setup(self) -> None:
        self.source = DataSource(self.config)

    def process(self, stats: dict) -> Iterator[tuple[int, object]]:
        assert self.source is not None  # Beam calls setup before process
        yield stats["prompt_index"], self.source.row(stats["prompt_index"])
