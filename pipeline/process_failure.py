"""Why a child process failed, in one line from its output: a vLLM server or engine, a quantizer. A module
below the stages, as serving.py is."""

from __future__ import annotations

import re

# vLLM's wrappers around a failure of its engine process: the cause is in the lines before them
FAILURE_WRAPPERS = ("see root cause above", "engine core initialization failed")
# what vLLM puts before a line of a process's traceback: "(EngineCore_DP0 pid=7) ", a log header
# "ERROR ... ] ", a worker's "[rank0]: "
LINE_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:(?:ERROR|CRITICAL)\b[^\]]*\]\s*)?(?:\[rank\d+\]:\s*)?")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")
FRAME_LINE = re.compile(r'^File "(?:[^"]*?/)?((?:[^/"]+/){0,2}[^/"]+)", line (\d+)(?:, in (\S+))?')
KILLED_LINE = re.compile(r"out of memory|\bOOM\b|\bKilled\b")


def failure_cause(output: str, keep: int = 400) -> str:
    """The line of a failed process's output that says why (a vLLM server, its engine, a quantizer): the
    last exception, or out-of-memory, line that is not one of vLLM's wrappers ("Engine core initialization
    failed. See root cause above": the engine process's own exception is printed before it); an exception
    without a message (a failed assert) with the frame and code line it was raised at; else its last three
    lines."""
    lines = [line for line in (LINE_PREFIX.sub("", raw.strip()) for raw in output.splitlines()) if line]
    for i in reversed(range(len(lines))):
        line = lines[i]
        if any(w in line.lower() for w in FAILURE_WRAPPERS):
            continue
        if found := EXCEPTION_LINE.match(line):
            cause = found.group(1)
            if ":" not in cause and (frame := raised_at(lines[:i])):
                cause = f"{cause} at {frame}"
            return cause[-keep:]
        if KILLED_LINE.search(line):
            return line[-keep:]
    return " | ".join(lines[-3:])[-keep:] or "(no output)"


def raised_at(traceback: list[str]) -> str | None:
    """The innermost frame of the traceback these lines end with (its last lines: the frame, its code, the
    carets under it), as "dir/dir/file.py line N (in f): code"."""
    for j in reversed(range(max(0, len(traceback) - 3), len(traceback))):
        if frame := FRAME_LINE.match(traceback[j]):
            path, number, function = frame.groups()
            code = next((c for c in traceback[j + 1 :] if c.strip("^~ ")), "")
            where = f"{path} line {number}" + (f" (in {function})" if function else "")
            return f"{where}: {code}" if code else where
    return None
