"""Run in a sandbox by python-functions: import solution.py, call its function on each argument list in
calls.json, and print each outcome as one JSON line after the sentinel (argv: function name, sentinel).

Every exception is also printed to stderr, and any makes the exit status 1, so the sandbox can tell a broken
limit (MemoryError, a failed fork) from a wrong answer. The expected values never reach the sandbox: the host
compares them with what is printed here, so a solution that prints lines of its own can only forge values it
could have computed."""

import json
import sys
import traceback

name, sentinel = sys.argv[1], sys.argv[2]
with open("calls.json") as file:
    calls = json.load(file)


def report(index, **outcome):
    print(sentinel + json.dumps({"i": index, **outcome}, default=repr), flush=True)


try:
    import solution

    function = getattr(solution, name)
except BaseException as exc:
    traceback.print_exc()
    for index in range(len(calls)):
        report(index, error=f"{type(exc).__name__} while loading the solution: {exc}")
    raise SystemExit(1) from None
failed = False
for index, args in enumerate(calls):
    try:
        report(index, value=function(*args))
    except BaseException as exc:
        traceback.print_exc()
        failed = True
        report(index, error=f"{type(exc).__name__}: {exc}")
sys.exit(1 if failed else 0)
