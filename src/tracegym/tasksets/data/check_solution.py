"""Run in a sandbox by python-functions: import solution.py, call its function on each argument list in
calls.json, and print each outcome as one JSON line after the sentinel (argv: function name, sentinel).

The expected values never reach the sandbox: the host compares them with what is printed here, so a solution that
prints lines of its own can only forge values it could have computed."""

import json
import sys

name, sentinel = sys.argv[1], sys.argv[2]
with open("calls.json") as file:
    calls = json.load(file)


def report(index, **outcome):
    print(sentinel + json.dumps({"i": index, **outcome}, default=repr), flush=True)


try:
    import solution

    function = getattr(solution, name)
except BaseException as exc:
    for index in range(len(calls)):
        report(index, error=f"{type(exc).__name__} while loading the solution: {exc}")
    raise SystemExit(1) from None
for index, args in enumerate(calls):
    try:
        report(index, value=function(*args))
    except BaseException as exc:
        report(index, error=f"{type(exc).__name__}: {exc}")
