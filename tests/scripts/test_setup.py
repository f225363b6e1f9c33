"""What ``scripts/setup`` installs: the extras it names exist, and the torch pin it installs from
PyTorch's CPU index (on a machine without an NVIDIA GPU) is the one the ``hf`` extra pins."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return {name: [line.strip() for line in value.strip().splitlines()]
            for name, value in cfg["options.extras_require"].items()}


def test_the_cpu_torch_pin_is_the_hf_extras():
    script = (ROOT / "scripts" / "setup").read_text()
    command = re.search(r"torch_pin=\$\((.*)\)", script)
    assert command is not None
    pin = subprocess.run(["bash", "-c", command.group(1)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert pin.stdout.strip() in extras()["hf"]
    assert pin.stdout.strip().startswith("torch==")


def test_tensorboard_to_view_the_event_files_is_an_extra_the_readme_names():
    assert any(req.startswith("tensorboard") for req in extras()["tensorboard"])
    assert "scripts/setup tensorboard" in (ROOT / "README.md").read_text()
