"""Runs inside the sandbox: load a solution, then call its functions on request.

Protocol (one JSON line each way, on the process's original stdin and stdout, which the driver
keeps for itself; the solution's own ``print`` goes to stderr and its stdin reads EOF):

- driver -> harness: ``{"ready": true}`` or ``{"load_error": "..."}`` after loading;
- harness -> driver: ``{"fn": name, "args": [...], "kwargs": [[k, v], ...]}`` (wire-encoded);
- driver -> harness: ``{"ok": value}``, ``{"raised": "ValueError: ..."}`` or
  ``{"unserialisable": "..."}``.

The driver only reports; it never judges. Whatever it (or a solution tampering with it) says is
checked outside against values that never enter the sandbox. Standard library only.
"""


import wire


def main() -> None:
    requests, replies = wire.take_stdio()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", "rb") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - any failure of the solution is reported
        wire.send(replies, {"load_error": f"{type(e).__name__}: {e}"[:500]})
        return
    wire.send(replies, {"ready": True})
    for line in requests:
        request = wire.loads(line)
        fn = namespace.get(request["fn"])
        if not callable(fn):
            wire.send(replies, {"raised": f"NameError: no function {request['fn']!r} in the solution"})
            continue
        args = wire.decode(request["args"])
        kwargs = {k: v for k, v in wire.decode(request["kwargs"])}
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - SystemExit from the solution included
            wire.send(replies, {"raised": f"{type(e).__name__}: {e}"[:500]})
            continue
        try:
            line = wire.dumps({"ok": wire.encode(result)})
        except (wire.WireError, RecursionError, ValueError) as e:
            wire.send(replies, {"unserialisable": str(e)[:500]})
            continue
        replies.write(line)
        replies.flush()


if __name__ == "__main__":
    main()
