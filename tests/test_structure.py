"""The structure rules the code keeps: no module reaches into another's private names, and the
entry of ``rlx run`` is imported by its command alone (everything else takes the host, the
runners and the session it uses)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "runtime", "kernels", "verifiers")


def modules(*tops: str):
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "_generated" not in path.parts:
                yield path, ast.parse(path.read_text(encoding="utf-8"))


def imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_no_module_imports_a_private_name_of_another():
    found = []
    for path, tree in modules(*PACKAGES, "scripts"):
        for module, names in imports(tree):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and not module.endswith("_generated") and "pb2" not in module:
                found.append(f"{path.relative_to(ROOT)}: from {module} import {', '.join(private)}")
    assert not found, found


def test_only_its_command_imports_the_run_entry():
    found = [str(path.relative_to(ROOT)) for path, tree in modules(*PACKAGES)
             for module, names in imports(tree)
             if (module == "runtime.run" or (module == "runtime" and "run" in names))
             and path.relative_to(ROOT).as_posix() != "runtime/commands/run.py"]
    assert not found, found


def test_no_installed_distribution_takes_an_import_name_of_rlx():
    """rlx's top-level packages own their import names: a distribution installed beside rlx
    that ships a package of the same name (Transformers >= 5.25 requires Hugging Face's
    ``kernels``) is shadowed by ours, so importing it breaks. The ``hf`` extra pins a
    Transformers that does not require one."""
    import importlib.metadata as md

    owners = md.packages_distributions()
    clashes = {name: sorted(set(owners.get(name, ())) - {"rlx"}) for name in PACKAGES}
    assert not {k: v for k, v in clashes.items() if v}, clashes
