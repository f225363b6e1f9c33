"""Runs inside the sandbox, in its own process: a check script's ``check(candidate)``.

A check script (HumanEval's ``check``) is code from whoever posed the problem, so it never runs
in the verifier's process. It runs here, in a sandboxed process of its own with its own uid,
and reaches the solution (another sandboxed process) only through the verifier, which forwards
each call and its plain-data result. The solution can neither see nor touch this process.

Protocol (one JSON line each way on the process's original stdin and stdout; the check's own
``print`` goes to stderr):

- driver -> verifier: ``{"call": {"args": [...], "kwargs": [[k, v], ...]}}`` (wire-encoded),
  answered ``{"ok": value}`` or ``{"failed": "..."}`` (the solution raised or returned
  something that is not plain data; ``candidate`` raises ``CandidateFailed`` here);
- driver -> verifier, last: ``{"done": {"asserts": n}}``, ``{"error": {"type": ..., "message":
  ..., "candidate": bool, "asserts": n}}`` or ``{"load_error": "..."}``.

``asserts`` counts the ``assert`` statements of the test code that ran. The driver only
reports; the verifier decides, and it counts the calls itself. Standard library only.
"""

import ast
import json
import random

import wire

COUNTER = "__rlx_assert_ran__"


class CandidateFailed(Exception):
    """The solution raised, or returned a value that is not plain data."""


class _CountAsserts(ast.NodeTransformer):
    """Puts a call of the counter before every ``assert`` statement."""

    def visit_Assert(self, node):
        self.generic_visit(node)
        count = ast.Expr(ast.Call(ast.Name(COUNTER, ast.Load()), [], []))
        return [ast.copy_location(count, node), node]



def main() -> None:
    requests, replies = wire.take_stdio()
    random.seed(0)  # a check that draws random inputs draws the same ones every time
    asserts = [0]

    def candidate(*args, **kwargs):
        wire.send(replies, {"call": {"args": wire.encode(list(args)),
                                 "kwargs": wire.encode([[k, v] for k, v in kwargs.items()])}})
        reply = wire.loads(requests.readline())
        if "failed" in reply:
            raise CandidateFailed(reply["failed"])
        return wire.decode(reply["ok"])

    def count() -> None:
        asserts[0] += 1

    try:
        with open("check.json", "rb") as f:
            script = json.load(f)
        namespace = {"__name__": "__check__", "__builtins__": __builtins__, COUNTER: count}
        exec(compile(script["setup"], "<setup>", "exec"), namespace)
        namespace[script["entry_point"]] = candidate  # test code may call the solution by name
        tree = ast.fix_missing_locations(_CountAsserts().visit(ast.parse(script["test"], "<test>")))
        exec(compile(tree, "<test>", "exec"), namespace)
        check = namespace.get("check")
        if not callable(check):
            raise NameError("the test code defines no function check(candidate)")
    except BaseException as e:  # noqa: BLE001 - any failure of the check code is reported
        wire.send(replies, {"load_error": f"{type(e).__name__}: {e}"[:500]})
        return
    try:
        check(candidate)
    except BaseException as e:  # noqa: BLE001 - SystemExit from the check included
        wire.send(replies, {"error": {"type": type(e).__name__, "message": str(e)[:200],
                                  "candidate": isinstance(e, CandidateFailed), "asserts": asserts[0]}})
        return
    wire.send(replies, {"done": {"asserts": asserts[0]}})


if __name__ == "__main__":
    main()
