"""Why a child process failed, in one line from its output: a vLLM server or engine, a quantizer. A module
below the stages, as serving.py is."""

from __future__ import annotations

import re

# vLLM's wrappers around a failure of its engine process: the cause is in the lines before them
FAILURE_WRAPPERS = ("see root cause above", "engine core initialization failed")
# an exception line, behind vLLM's process prefix "(EngineCore_DP0 pid=7) " and a log header "ERROR ... ] "
EXCEPTION_LINE = re.compile(
    r"^(?:\([^)]*\)\s*)?(?:(?:ERROR|CRITICAL)\b[^\]]*\]\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$"
)
KILLED_LINE = re.compile(r"out of memory|\bOOM\b|\bKilled\b")


def failure_cause(output: str, keep: int = 400) -> str:
    """The line of a failed process's output that says why (a vLLM server, its engine, a quantizer): the
    last exception, or out-of-memory, line that is not one of vLLM's wrappers ("Engine core initialization
    failed. See root cause above": the engine process's own exception is printed before it); else its last
    three lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if any(w in line.lower() for w in FAILURE_WRAPPERS):
            continue
        if found := EXCEPTION_LINE.match(line):
            return found.group(1)[-keep:]
        if KILLED_LINE.search(line):
            return line[-keep:]
    return " | ".join(lines[-3:])[-keep:] or "(no output)"
