"""The ways a command stops early; the CLI maps them to exit codes."""

import signal


class RoamError(Exception):
    """Bad input or usage. The CLI prints the message as one line and exits 2."""


class CheckFailed(Exception):
    """A check ran and the subject failed it (verify, capacity). Exit 1."""


class RoamBug(Exception):
    """roam made something wrong (a graph the runtime refuses) and caught it before writing it.
    The CLI prints the message as one line and exits 3, as for any internal error."""


class Stopped(BaseException):
    """SIGINT or SIGTERM, raised by the CLI's handlers: every cleanup runs, as for Ctrl-C, and the
    CLI says which (exit 128 + the signal). Not a KeyboardInterrupt, which click would answer with
    a blank line of its own."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stopped_line(signum: int) -> str:
    """What roam says when SIGINT or SIGTERM stopped it."""
    return "roam: terminated" if signum == signal.SIGTERM else "roam: interrupted"


def first_line(e: Exception) -> str:
    """An exception's message as one line (ONNX Runtime's span many), for a RoamError that wraps it."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
