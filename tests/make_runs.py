"""make as a user runs it from a terminal, for the tests that check what a stage's failure looks like through it."""

import os
import re
import signal

ALONE = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not make test's -j4

# GNU make 4.3, when a Ctrl-C reaches it just as its child exits: its own wait has reaped the child before the
# signal handler waits for it again, and it stops on ECHILD with these lines and status 2 instead of its
# "Error 130" line and SIGINT (seen on a loaded CI machine). It is make's, after the stage's own line; the
# stage's part is the same either way.
MAKE_LOST_ITS_CHILD = {"make: *** wait: No child processes.  Stop.", "make: *** Waiting for unfinished jobs...."}


def make_error(target: str, code: int) -> re.Pattern:
    return re.compile(rf"make: \*\*\* \[Makefile:\d+: {re.escape(target)}\] Error {code}")


def assert_make_passed_on_the_interrupt(code: int, lines: list[str], target: str, status: int) -> None:
    """make's own lines after an interrupted stage's one line, and make's exit `code`: its `[Makefile:N: target]
    Error <status>` line and the interrupt as its exit, or its lines for the race above and status 2."""
    if lines and set(lines) <= MAKE_LOST_ITS_CHILD:
        assert code == 2, code
        return
    assert len(lines) == 1 and make_error(target, status).fullmatch(lines[0]), lines
    assert code == -signal.SIGINT, code  # make passes the interrupt on as its own status
