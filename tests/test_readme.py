"""The README's commands, as a new user meets them.

Every ``bash`` block of README.md is marked, on the line above its fence, with how it is tested:

- ``<!-- readme-test: quick -->``: run as written, in order, in a fresh directory (seconds);
- ``<!-- readme-test: long -->``: run as written, in order, in one fresh directory, when
  ``RLX_README_LONG=1`` (the demo, the real-model run, the studies, the benchmarks: hours);
- ``<!-- readme-test: example -->``: a synopsis with placeholders (``DIR``, ``path/to/ckpt``,
  ``[--run ID]``), not run.

Whatever the mark, every ``rlx`` command in the README must parse with the command line's own
parser, and every ``rlx run`` / ``rlx pretrain`` config must load (fields, values and sections
the config accepts), so an example cannot name a flag, section or value that no longer exists.
``python`` blocks must compile, and the quick ones run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKS = ("quick", "long", "example")
FENCE = re.compile(r"^(?:<!-- readme-test: (?P<mark>[a-z]+) -->\n)?```(?P<lang>bash|python)\n(?P<body>.*?)^```$",
                   re.M | re.S)
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LONG = os.environ.get("RLX_README_LONG") == "1"


def blocks() -> list[tuple[int, str | None, str, str]]:
    """``(line, mark, language, body)`` of every fenced bash or python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start("body")), m.group("mark"), m.group("lang"), m.group("body"))
            for m in FENCE.finditer(text)]


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [part.strip() for ln in joined.splitlines() for part in ln.split(" && ")]
    return [line for line in lines if line and not line.startswith("#")]


def rlx_argv(command: str) -> list[str] | None:
    """The arguments of an ``rlx`` command line (environment assignments and placeholders in
    brackets left out), or None for another program."""
    words = shlex.split(command, comments=True)
    while words and ENV.match(words[0]):
        words.pop(0)
    if not words or os.path.basename(words[0]) != "rlx":
        return None
    argv, depth = [], 0
    for word in words[1:]:
        if word.startswith("["):
            depth += 1
        if depth == 0 and word not in ("…", "..."):
            argv.append(word)
        if word.rstrip(".…").endswith("]") and depth:
            depth -= 1
    return argv


def test_every_block_says_how_it_is_tested():
    found = blocks()
    assert len(found) >= 15
    unmarked = [line for line, mark, lang, _ in found if lang == "bash" and mark not in MARKS]
    assert unmarked == [], f"README.md bash blocks at lines {unmarked} need a <!-- readme-test: quick|long|example --> line"
    assert any(mark == "quick" for _, mark, _, _ in found)


def test_every_rlx_command_parses_and_its_config_loads():
    from runtime.cli import build_parser
    from runtime.commands.run import config_from_args

    parser = build_parser()
    checked = 0
    for line, _, lang, body in blocks():
        if lang != "bash":
            continue
        for command in commands(body):
            argv = rlx_argv(command)
            if argv is None:
                continue
            argv = argv[: argv.index("--")] if "--" in argv else argv
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"README.md line {line}: `{command}` does not parse")
            if args.command in ("run", "pretrain", "controller") and hasattr(args, "overrides"):
                cwd = os.getcwd()
                os.chdir(ROOT)  # a config file is named relative to the repository
                try:
                    config_from_args(args)
                except Exception as e:  # noqa: BLE001 - the message is the finding
                    pytest.fail(f"README.md line {line}: `{command}`: {e}")
                finally:
                    os.chdir(cwd)
            checked += 1
    assert checked >= 60


def test_the_config_sections_named_are_the_configs():
    import dataclasses

    from runtime.config import Config

    said = re.search(r"A config is TOML with the sections (.*?);", README.read_text(encoding="utf-8"), re.S)
    assert said is not None
    assert re.findall(r"`(\w+)`", said.group(1)) == [f.name for f in dataclasses.fields(Config)]


def test_the_invariants_listed_are_the_checked_ones():
    from runtime.controller.invariants import NAMES

    listed = dict(re.findall(r"^- \*\*(I\d)\*\* (.+)$", README.read_text(encoding="utf-8"), re.M))
    assert listed == NAMES


def test_every_repository_path_named_exists():
    """A file or directory of the repository named in the README (a link, or a path in code
    quotes) is there: the README points to nothing the repository does not have."""
    text = README.read_text(encoding="utf-8")
    named = set(re.findall(r"\]\((?!https?:)([^)#]+)\)", text))
    named |= {m for m in re.findall(r"`((?:runtime|ledger|kernels|verifiers|scripts|tests|configs)/[\w./-]*)`", text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == []
    assert not re.search(r"\b(DESIGN|STYLE)\.md\b", text)


def test_python_blocks_compile():
    for line, _, lang, body in blocks():
        if lang == "python":
            compile(body, f"README.md:{line}", "exec")


def _run_blocks(marks: tuple[str, ...], where: Path) -> int:
    """Run the README's blocks of ``marks`` in order in ``where``, as a user's shell would: the
    repository's ``scripts`` and ``configs`` beside them and ``.venv/bin`` first on the PATH."""
    for name in ("scripts", "configs"):
        (where / name).symlink_to(ROOT / name)
    (where / ".venv").symlink_to(ROOT / ".venv")
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for line, mark, lang, body in blocks():
        if mark not in marks and not (lang == "python" and "quick" in marks):
            continue
        argv = ["bash", "-euo", "pipefail", "-c", body] if lang == "bash" else [sys.executable, "-c", body]
        proc = subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True, timeout=None if LONG else 300)
        assert proc.returncode == 0, f"README.md block at line {line} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ran += 1
    return ran


def test_quick_blocks_run_as_written(tmp_path):
    assert _run_blocks(("quick",), tmp_path) >= 2


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="the README's long blocks take hours: RLX_README_LONG=1 runs them")
def test_long_blocks_run_as_written_one_after_another(tmp_path):
    assert _run_blocks(("quick", "long"), tmp_path) >= 3
