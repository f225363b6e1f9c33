"""The durable, append-only ledger of a run: events, canonical codec, stores, verification."""

from ledger.backends import open_store
from ledger.canonical import pack, unpack
from ledger.codec import decode_body, encode_body, encode_event
from ledger.errors import (
    AppendConflict,
    Busy,
    CodecError,
    CorruptLedger,
    Fenced,
    LedgerError,
    RunExists,
    RunNotFound,
    StoreUnavailable,
)
from ledger.events import (
    EVENTS,
    BatchFormed,
    ControllerStarted,
    Event,
    GroupDiscarded,
    OutcomeRecorded,
    PromptsSampled,
    Registry,
    RolloutAbandoned,
    RolloutAssigned,
    RolloutCompleted,
    RolloutRequested,
    RunFinished,
    RunStarted,
    SampleRequest,
    SnapshotTaken,
    TrainStepCompleted,
    VersionEvaluated,
    VersionsRetired,
    WeightsPublished,
    WorkerJoined,
    WorkerLost,
    event,
    upcaster,
)
from ledger.memory import MemoryStore
from ledger.store import (
    EventStore,
    Head,
    RawRecord,
    RepairReport,
    StoredEvent,
    StoredSnapshot,
    VerifyReport,
)

__all__ = [name for name in dir() if not name.startswith("_")]
