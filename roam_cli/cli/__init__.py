"""The `roam` command line: parses, calls, prints. Exit codes: 0 ok, 1 check failed, 2 bad input.

The group, the options and helpers every command shares, and `main`; the commands are in the
modules beside this one, by what they work on: `planning` (optimize, max-batch, tradeoff), `plans`
(verify, report, plot, export), `running` (execute, train), `graphs` (make-training-graph, lower,
emulate, shard, gradcheck) and `solving` (remat, layout-csv)."""

import math
import os
import signal
import sys

import click
from rich.console import Console
from roam_cli import __version__
from roam_cli.core.errors import CheckFailed, RoamBug, RoamError, Stopped, stopped_line
from roam_cli.core.units import parse_bytes
from roam_cli.outputs import report as report_mod

# piped, rich would cut tables at 80 columns ("1,223,2…"): as wide as COLUMNS says, else 200
COLUMNS = os.environ.get("COLUMNS", "")
out = Console() if sys.stdout.isatty() else Console(width=int(COLUMNS) if COLUMNS.isdigit() else 200)
err = Console(stderr=True)


def parse_pairs(values: tuple[str, ...], what: str, as_int: bool) -> dict:
    pairs = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key or not value:
            raise RoamError(f"{what} expects NAME=VALUE, got {v!r}")
        if as_int:
            try:
                value = int(value)
                assert value >= 0
            except (ValueError, AssertionError):
                raise RoamError(f"{what} {key}: {v.partition('=')[2]!r} is not a non-negative integer") from None
        pairs[key] = value
    return pairs


class Progress:
    """A spinner on stderr while a long step runs (silent with -q or when not a terminal)."""

    def __init__(self, quiet: bool):
        self.status = None if quiet or not err.is_terminal else err.status("starting")

    def __enter__(self):
        if self.status:
            self.status.start()
        return self

    def __call__(self, message: str):
        if self.status:
            self.status.update(message)

    def __exit__(self, *exc):
        if self.status:
            self.status.stop()


class ByteSize(click.ParamType):
    """A byte quantity as people write it: 16GiB, 512MB, 4096; at least one byte (a budget of
    nothing is a typo, not a question)."""

    name = "BYTES"

    def convert(self, value, param, ctx):
        try:
            size = value if isinstance(value, int) else parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size < 1:
            self.fail(f"must be at least 1 byte, got {value!r}", param, ctx)
        return size


JOBS = click.IntRange(min=1)  # --jobs: parallel solver processes


class Seconds(click.ParamType):
    """A duration: finite and above 0 (click's FloatRange lets NaN and infinity through)."""

    name = "SECONDS"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            self.fail(f"{value} is not a finite number of seconds above 0", param, ctx)
        return seconds


SECONDS = Seconds()  # --time-limit, --timeout


class Finite(click.FloatRange):
    """A number in a range, never NaN or infinity (click's FloatRange lets both through: NaN compares
    false with either bound)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value} is not a finite number", param, ctx)
        return number


GAP = Finite(min=0, max=1)  # --gap: a fraction
FRACTION = Finite(min=0, min_open=True)  # --budget-fraction: of the given order's peak
RATE = Finite(min=0)  # --learning-rate (AdamW refuses a negative one)


BUDGET_HELP = "Memory the device has for this step, e.g. 16GiB: says whether the plan fits (exit 1 if not)."


def fail_over_budget(verdict: dict | None) -> None:
    """A plan over its budget fails the check: the message on stderr, exit 1."""
    if verdict is not None and not verdict["fits"]:
        raise CheckFailed(report_mod.budget_line(verdict))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="roam")
@click.option("-q", "--quiet", is_flag=True, help="Print only results and errors.")
@click.option("-v", "--verbose", is_flag=True, help="Print notes about the model and each phase.")
@click.pass_context
def cli(ctx, quiet, verbose):
    """roam: fit DNN training into less accelerator memory.

    Reads an ONNX training graph, chooses the operator order and every tensor's
    address in one static arena, and writes a plan a runtime can follow.

    \b
    Exit codes: 0 ok, 1 a check failed, 2 bad input or usage.
    """
    ctx.obj = {"quiet": quiet, "verbose": verbose}




def split_names(values: tuple[str, ...]) -> list[str]:
    return [name for v in values for name in v.split(",") if name]


def stopper(pid: int):
    """The handler of SIGINT and SIGTERM for the process `pid`. A process forked from it (a solver's
    worker) keeps what it had before: Ctrl-C interrupts it, SIGTERM (its parent's terminate())
    ends it at once, whatever lock it holds — not a Stopped raised inside a queue's lock, which
    would leave it, and the parent joining it, waiting for ever."""
    def stop(signum, frame) -> None:
        if os.getpid() == pid:
            raise Stopped(signum)
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise KeyboardInterrupt
    return stop


def signal_behind(e: BaseException) -> int | None:
    """The signal that raised what led to `e` (a SIGTERM while a C extension initialised becomes an
    ImportError, "initialization failed"), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Stopped):
            return e.signum
        if isinstance(e, KeyboardInterrupt):
            return signal.SIGINT
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def main() -> None:
    stop = stopper(os.getpid())
    before = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        code = e.exit_code
    except Stopped as e:
        print(stopped_line(e.signum), file=sys.stderr)
        code = 128 + e.signum
    except (click.exceptions.Abort, KeyboardInterrupt):
        print(stopped_line(signal.SIGINT), file=sys.stderr)
        code = 130
    except click.UsageError as e:
        print(f"roam: error: {e.format_message().splitlines()[0]}", file=sys.stderr)
        code = 2
    except click.ClickException as e:
        print(f"roam: error: {e.format_message().splitlines()[0]}", file=sys.stderr)
        code = 2
    except RoamError as e:
        print(f"roam: error: {str(e).splitlines()[0] if str(e) else 'bad input'}", file=sys.stderr)
        code = 2
    except CheckFailed as e:
        print(f"roam: {e}", file=sys.stderr)
        code = 1
    except RoamBug as e:
        print(f"roam: internal error: {str(e).splitlines()[0]}", file=sys.stderr)
        code = 3
    except MemoryError:
        print("roam: error: out of memory", file=sys.stderr)
        code = 2
    except Exception as e:  # a bug: one line, and the traceback only on request
        if (signum := signal_behind(e)) is not None:
            print(stopped_line(signum), file=sys.stderr)
            code = 128 + signum
        elif os.environ.get("ROAM_DEBUG"):
            raise
        else:
            print(f"roam: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                  "(set ROAM_DEBUG=1 for a traceback)", file=sys.stderr)
            code = 3
    for signum, handler in before.items():  # main may run inside another program (the tests)
        signal.signal(signum, handler)
    sys.exit(code if isinstance(code, int) else 0)


from roam_cli.cli import graphs, planning, plans, running, solving  # noqa: E402,F401  (each registers its commands)
