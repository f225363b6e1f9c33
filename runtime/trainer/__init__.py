"""The trainer: a pure jitted step and the shell that runs it against the ledger and parameter store."""

from runtime.trainer.batch import Sample, TrainBatch, pack, pack_bins
from runtime.trainer.step import StepConfig, make_optimizer, score, train_step

__all__ = ["Sample", "StepConfig", "TrainBatch", "make_optimizer", "pack", "pack_bins", "score", "train_step"]
