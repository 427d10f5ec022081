"""How a stage's process ends when it does not finish: one line on stderr and a non-zero exit status, with
nothing of it left running and nothing half-written. Each stage's `__main__` runs its main() through `run`:

    Ctrl-C (SIGINT) -> 130, SIGTERM -> 143   what was interrupted, and what is intact
    a full disk or quota (ENOSPC, EDQUOT) -> 1   the folder, the space it needed where known, what is free now
    a ConfigError or SettingError no stage caught -> 2

Before main(), while `python -m pipeline.<stage>` still imports its libraries, `guard_start` (called by
pipeline/__init__.py) makes a Ctrl-C or SIGTERM the same one line and status.

A stage says what it is doing, and what an interruption then leaves intact, with `doing`; the writers
(staging.staging_dir, write_json) turn a full disk into `DiskFull` at the folder they write, and hold a
Ctrl-C back while they move a finished output into place (`held`). A bug is still a traceback.

Standard library only at import: staging.py imports it, and the stages import it before anything else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

INTERRUPTED, TERMINATED, FAILED, BAD_INPUT = 130, 143, 1, 2  # 128 + the signal, as a shell reports it
FULL = {errno.ENOSPC: os.strerror(errno.ENOSPC), errno.EDQUOT: os.strerror(errno.EDQUOT)}

_now = {"what": "starting", "intact": "", "signal": 0}


def doing(what: str, intact: str | None = None) -> None:
    """What the stage is at now ("evaluating OUT/m/bf16"), and what an interruption then leaves intact,
    checked against how the stage writes (None: as said before)."""
    _now["what"] = what
    if intact is not None:
        _now["intact"] = intact


class Terminated(SystemExit):
    """SIGTERM (make's, when it is stopped; a `kill`), raised like Ctrl-C's KeyboardInterrupt, so that
    every `with` on the way out stops its server and removes its temporary folder."""


def _on_signal(signum, frame):
    # Once: a second Ctrl-C, or make passing a signal on, must not cut short the way out the first one took
    # (servers being stopped, temporary folders removed); the way out is bounded (serving.stop_processes).
    if _now["signal"]:
        return
    _now["signal"] = signum
    # on the way out, objects of the interrupted work are collected half-built: an asyncio loop of vLLM's
    # benchmark client cut off mid-request prints "Exception ignored in: <function BaseEventLoop.__del__ ...>"
    # and a traceback from its __repr__, before the stage's one line; nothing of the outcome depends on them
    sys.unraisablehook = lambda unraisable: None
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(TERMINATED)


@contextlib.contextmanager
def held():
    """Ctrl-C and SIGTERM wait until the block is done: around the renames that move a finished output into
    place, so that an interruption leaves all of them done or none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if None in old.values():  # a handler set outside Python: it cannot be put back
        yield
        return
    for s in old:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


# ------------------------------------------------------------------------------------- the start
# The stage each `python -m` entry of the Makefile runs, by make's name; their __main__ runs main() through `run`
# (review's through its own handlers, after `started`).
STAGE_MODULES = {
    "pipeline.quantize": "quantize",
    "pipeline.evaluate": "eval",
    "pipeline.bench": "bench",
    "pipeline.measure": "measure",
    "pipeline.report": "report",
    "pipeline.publish": "publish",
    "pipeline.source": "source",
    "pipeline.review": "review",
}


def started_stage(argv: list[str]) -> str | None:
    """The stage `python ... -m pipeline.<stage> ARGS` (sys.orig_argv) runs, else None."""
    if "-m" not in argv[:-1]:
        return None
    i = argv.index("-m")
    stage = STAGE_MODULES.get(argv[i + 1])
    return "verify-published" if stage == "publish" and argv[i + 2 : i + 3] == ["verify"] else stage


def guard_start() -> None:
    """From the first line of `python -m pipeline.<stage>` (pipeline/__init__.py) until `run` sets its own
    handlers: a Ctrl-C or SIGTERM while the stage still imports its libraries (seconds, with torch and vLLM)
    is the one line and status of every later stop, not a KeyboardInterrupt traceback. Nothing is written
    or started before main(). A signal ignored (a background job's SIGINT) stays ignored."""
    stage = started_stage(list(getattr(sys, "orig_argv", [])))
    if stage is None or threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum, frame):
        how = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "stopped (SIGTERM)"
        line = f"{stage}: {how} while starting (importing its libraries); nothing is written or started yet\n"
        os.write(2, line.encode())
        os._exit(INTERRUPTED if signum == signal.SIGINT else TERMINATED)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_signal)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_signal)


def started() -> None:
    """Python's own Ctrl-C and SIGTERM handling again, where guard_start set its own: for a stage that does
    not end through `run` (review stops its servers on KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if getattr(signal.getsignal(s), "__qualname__", "").startswith("guard_start."):
            signal.signal(s, default)


# ------------------------------------------------------------------------------------- full disk
class DiskFull(OSError):
    """A full disk or quota at the folder a stage writes: its message is the whole line."""

    def __init__(self, message: str, code: int = errno.ENOSPC):
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def disk_full(e: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT where `e`, or what it was raised from, is a full disk or quota: an OSError's errno,
    or its text in another library's error (safetensors' writer raises its own, "... No space left on
    device (os error 28)"); else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL:
            return e.errno
        for code, text in FULL.items():
            if text in str(e):
                return code
        e = e.__cause__ or e.__context__
    return None


def size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_space(folder: Path) -> int | None:
    """Bytes free now on the file system of `folder` (or of its nearest existing parent)."""
    for p in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return None


def disk_full_error(code: int, folder: Path, what: str, written: int, needs: int | None) -> DiskFull:
    """The line of a write of `what` into `folder` that ran out of space after `written` bytes, and whose
    own half-written copy is already removed. needs: the bytes it needs in all, where known."""
    free = free_space(folder)
    need = f"it needs about {size(needs)}" if needs else f"it needs more than the {size(written)} it had written"
    return DiskFull(
        f"{folder}: {FULL[code].lower()} while writing {what}: {'?' if free is None else size(free)} free there now, "
        f"{need}; earlier outputs are untouched and the half-written copy is removed; free some space, or set OUT "
        "to a folder on a larger disk",
        code,
    )


# --------------------------------------------------------------------------------------- the end
def run(stage: str, main: Callable[[], int], intact: str, vllm_in_process: bool = False) -> NoReturn:
    """Run a stage's main() and end the process: its status, or the one line of an interruption, a full disk
    or a bad setting. vllm_in_process: the stage ran vLLM's code in this process (its benchmark client,
    its engine), which the interpreter's own teardown would follow with dozens of lines (below)."""
    _now["intact"] = intact
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    line = None
    try:
        code = main()
    except KeyboardInterrupt:
        code, line = INTERRUPTED, f"interrupted (Ctrl-C) while {_now['what']}"
    except Terminated:
        code, line = TERMINATED, f"stopped (SIGTERM) while {_now['what']}"
    except DiskFull as e:
        code, line = FAILED, str(e)
    except Exception as e:
        from pipeline.schema import ConfigError
        from pipeline.settings import SettingError  # here: pipeline/__init__.py imports this module first

        if full := disk_full(e):
            code, line = FAILED, unplaced_disk_full(full, e)
        elif isinstance(e, (ConfigError, SettingError)):  # a check no stage caught: its one line
            code, line = BAD_INPUT, str(e)
        else:
            raise
    if line is None and not vllm_in_process:
        sys.exit(code)
    left = stop_children()
    if line is not None and code in (INTERRUPTED, TERMINATED):
        running = f"{left} of its processes would not stop" if left else "nothing of it left running"
        line = f"{line}; {_now['intact']}; {running}"
    if line is not None:
        print(f"{stage}: {line}", file=sys.stderr)
    leave(code)


def finish(code: int) -> NoReturn:
    """End a process that ran vLLM's code, once everything is written: its children stopped, then `leave`."""
    stop_children()
    leave(code)


def unplaced_disk_full(code: int, e: Exception) -> str:
    """A full disk met outside the writers that name their folder: the file where the error names one,
    else OUT (make exports it), and what is free there."""
    where = Path(getattr(e, "filename", None) or os.environ.get("OUT") or ".")
    free = free_space(where if where.is_dir() else where.parent)
    return (
        f"{where}: {FULL[code].lower()}: {'?' if free is None else size(free)} free there now; outputs that were "
        "complete are untouched; free some space, or set OUT to a folder on a larger disk"
    )


def stop_children() -> int:
    """Stop every process this one started that is still running (serving.stop_processes); how many would
    not stop."""
    import psutil

    from pipeline.serving import process_tree, stop_processes

    children = process_tree(os.getpid())[1:]
    stop_processes(children, timeout_s=10)
    left = 0
    for p in children:
        with contextlib.suppress(psutil.Error):  # gone
            left += p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return left


def leave(code: int) -> NoReturn:
    """Exit now, once everything is written and every process this one started is stopped: without the
    interpreter's teardown, in which triton's bindings (imported with vLLM) print dozens of "nanobind:
    leaked ..." lines, aiohttp its unclosed sessions, and vLLM's engine threads have aborted it ("terminate
    called without an active exception"), turning a finished run into a failed one. The streams and the
    logging handlers are flushed first; nothing else of the teardown writes a stage's outputs."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
