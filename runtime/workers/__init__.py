"""In-process implementations of the worker interfaces of ``runtime.controller.workers``."""

from runtime.workers.inference import EngineWorker
from runtime.workers.trainer import StepTrainer
from runtime.workers.verifier import TaskVerifier

__all__ = ["EngineWorker", "StepTrainer", "TaskVerifier"]
