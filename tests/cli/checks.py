"""The CLI's Python tests' tally: check() counts a passed check or prints a failed one, finish()
prints the totals and exits 1 if any failed. Imported by the tests beside it (their folder is on
sys.path when Python runs them as scripts)."""
import sys

failures = []
passes = 0


def check(name, ok, detail=""):
    global passes
    if ok:
        passes += 1
    else:
        failures.append(name)
        print(f"FAIL: {name}{': ' + detail if detail else ''}")


def finish():
    print(f"{passes} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)
