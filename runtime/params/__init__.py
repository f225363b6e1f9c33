"""The parameter server: versioned weights and optimizer state in TensorStore.

``ParamStore`` is the I/O shell; ``params_digest`` is the pure content digest that the trainer,
replay and audit use to compare weights without a store.
"""

from runtime.params.digest import SUPPORTED_DTYPES, params_digest
from runtime.params.errors import DigestMismatch, ParamStoreError
from runtime.params.manifest import Manifest, TreeManifest
from runtime.params.store import ParamStore

__all__ = [
    "SUPPORTED_DTYPES",
    "DigestMismatch",
    "Manifest",
    "ParamStore",
    "ParamStoreError",
    "TreeManifest",
    "params_digest",
]
