"""Languages the code verifier runs: how a source file is named, compiled and started.

A compile step runs in the sandbox too (compilers read untrusted source: a C ``#include`` of a
host file must find nothing), with the same isolation and longer time limits; the artifact comes
back over stdout, so no run writes to the host. Adding a language is one entry in ``LANGUAGES``.
"""

from __future__ import annotations

import dataclasses
import os

from verifiers.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Language:
    """How to build and run one language in the sandbox (paths as seen inside it).

    Attributes:
      name: registry key, e.g. ``"python"``.
      source: the file name the program is stored under in the work dir.
      run: argv that runs the program (after compiling, if any).
      compile: argv that compiles ``source`` and writes the artifact to stdout; empty: none.
      artifact: the name the artifact is stored under for ``run``.
      tools: host paths that must exist for the language to be available.
      calls: whether the function-call harness (a Python driver) works for it.
    """

    name: str
    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] = ()
    artifact: str = ""
    tools: tuple[str, ...] = ()
    calls: bool = False

    def available(self) -> bool:
        return all(os.path.exists(tool) for tool in self.tools)


PYTHON_ARGV = ("/usr/bin/python3", "-S", "-s", "-B")

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language(
            name="python",
            source="main.py",
            run=PYTHON_ARGV + ("main.py",),
            tools=("/usr/bin/python3",),
            calls=True,
        ),
        Language(
            name="c",
            source="main.c",
            compile=(
                "/bin/sh",
                "-c",
                "gcc -O2 -std=gnu17 -o \"$TMPDIR/main\" main.c -lm >&2 && exec cat \"$TMPDIR/main\"",
            ),
            artifact="main",
            run=("./main",),
            tools=("/usr/bin/gcc", "/bin/sh"),
        ),
    )
}


def get(name: str) -> Language:
    """The language registered as ``name``, if its tools are installed here."""
    lang = LANGUAGES.get(name)
    if lang is None:
        raise ConfigError(f"language {name!r} is not one of: {', '.join(sorted(LANGUAGES))}")
    if not lang.available():
        missing = [t for t in lang.tools if not os.path.exists(t)]
        raise ConfigError(f"language {name!r} needs {', '.join(missing)}, which is not installed")
    return lang
