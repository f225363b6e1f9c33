from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Timings(_message.Message):
    __slots__ = ("wall_s",)
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    wall_s: float
    def __init__(self, wall_s: _Optional[float] = ...) -> None: ...

class TestResult(_message.Message):
    __slots__ = ("index", "verdict", "detail", "timings")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    index: int
    verdict: str
    detail: str
    timings: Timings
    def __init__(self, index: _Optional[int] = ..., verdict: _Optional[str] = ..., detail: _Optional[str] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("verdict", "detail", "verifier", "version", "isolation", "tests", "timings", "passed", "reward")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    verdict: str
    detail: str
    verifier: str
    version: str
    isolation: str
    tests: _containers.RepeatedCompositeFieldContainer[TestResult]
    timings: Timings
    passed: bool
    reward: float
    def __init__(self, verdict: _Optional[str] = ..., detail: _Optional[str] = ..., verifier: _Optional[str] = ..., version: _Optional[str] = ..., isolation: _Optional[str] = ..., tests: _Optional[_Iterable[_Union[TestResult, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., passed: _Optional[bool] = ..., reward: _Optional[float] = ...) -> None: ...

class MathRequest(_message.Message):
    __slots__ = ("gold", "response", "extract", "rel_tol", "abs_tol", "timeout_s")
    GOLD_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    EXTRACT_FIELD_NUMBER: _ClassVar[int]
    REL_TOL_FIELD_NUMBER: _ClassVar[int]
    ABS_TOL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    gold: str
    response: str
    extract: bool
    rel_tol: str
    abs_tol: str
    timeout_s: float
    def __init__(self, gold: _Optional[str] = ..., response: _Optional[str] = ..., extract: _Optional[bool] = ..., rel_tol: _Optional[str] = ..., abs_tol: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("wall_s", "cpu_s", "memory_bytes", "output_bytes", "processes", "file_bytes", "open_files", "disk_bytes")
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FILES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    wall_s: float
    cpu_s: float
    memory_bytes: int
    output_bytes: int
    processes: int
    file_bytes: int
    open_files: int
    disk_bytes: int
    def __init__(self, wall_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., output_bytes: _Optional[int] = ..., processes: _Optional[int] = ..., file_bytes: _Optional[int] = ..., open_files: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class IOTest(_message.Message):
    __slots__ = ("input", "output")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    input: str
    output: str
    def __init__(self, input: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class IOTests(_message.Message):
    __slots__ = ("tests",)
    TESTS_FIELD_NUMBER: _ClassVar[int]
    tests: _containers.RepeatedCompositeFieldContainer[IOTest]
    def __init__(self, tests: _Optional[_Iterable[_Union[IOTest, _Mapping]]] = ...) -> None: ...

class CallTest(_message.Message):
    __slots__ = ("fn", "args_json", "kwargs_json", "expected_json")
    FN_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_JSON_FIELD_NUMBER: _ClassVar[int]
    fn: str
    args_json: str
    kwargs_json: str
    expected_json: str
    def __init__(self, fn: _Optional[str] = ..., args_json: _Optional[str] = ..., kwargs_json: _Optional[str] = ..., expected_json: _Optional[str] = ...) -> None: ...

class CallTests(_message.Message):
    __slots__ = ("tests",)
    TESTS_FIELD_NUMBER: _ClassVar[int]
    tests: _containers.RepeatedCompositeFieldContainer[CallTest]
    def __init__(self, tests: _Optional[_Iterable[_Union[CallTest, _Mapping]]] = ...) -> None: ...

class CheckScript(_message.Message):
    __slots__ = ("test", "entry_point", "setup")
    TEST_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINT_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    test: str
    entry_point: str
    setup: str
    def __init__(self, test: _Optional[str] = ..., entry_point: _Optional[str] = ..., setup: _Optional[str] = ...) -> None: ...

class CodeRequest(_message.Message):
    __slots__ = ("program", "language", "checker", "limits", "stop_early", "rel_tol", "abs_tol", "io", "calls", "check")
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    STOP_EARLY_FIELD_NUMBER: _ClassVar[int]
    REL_TOL_FIELD_NUMBER: _ClassVar[int]
    ABS_TOL_FIELD_NUMBER: _ClassVar[int]
    IO_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    program: str
    language: str
    checker: str
    limits: Limits
    stop_early: bool
    rel_tol: float
    abs_tol: float
    io: IOTests
    calls: CallTests
    check: CheckScript
    def __init__(self, program: _Optional[str] = ..., language: _Optional[str] = ..., checker: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., stop_early: _Optional[bool] = ..., rel_tol: _Optional[float] = ..., abs_tol: _Optional[float] = ..., io: _Optional[_Union[IOTests, _Mapping]] = ..., calls: _Optional[_Union[CallTests, _Mapping]] = ..., check: _Optional[_Union[CheckScript, _Mapping]] = ...) -> None: ...

class CodeBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[CodeRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[CodeRequest, _Mapping]]] = ...) -> None: ...

class OutcomeList(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("serving", "isolation", "math_version", "code_version", "slots")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    MATH_VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    isolation: str
    math_version: str
    code_version: str
    slots: int
    def __init__(self, serving: _Optional[bool] = ..., isolation: _Optional[str] = ..., math_version: _Optional[str] = ..., code_version: _Optional[str] = ..., slots: _Optional[int] = ...) -> None: ...
