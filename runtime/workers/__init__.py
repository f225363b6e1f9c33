"""In-process implementations of the worker interfaces of ``runtime.controller.workers``."""

from runtime.workers.inference import EngineWorker, last_version_loader
from runtime.workers.trainer import StepTrainer
from runtime.workers.verifier import TaskVerifier

__all__ = ["EngineWorker", "last_version_loader", "StepTrainer", "TaskVerifier"]
