"""The `roam` executable (and `python -m roam_cli`). The command line's modules are imported
inside `main`, so that a Ctrl-C or SIGTERM while they load (a second or two) stops it like any
other: one line and exit 130 or 143, not a traceback.

While they load, both signals raise `Stopped`, never KeyboardInterrupt: CPython ends a process
with SIGINT itself (exit -2) once a KeyboardInterrupt has passed through some of its C paths
(an extension module's initialisation), even one caught; and a SIGTERM would end it silently.
Once the command is done, both are ignored."""

import signal
import sys

from roam_cli.core.errors import Stopped, stopped_line


def stop(signum, frame) -> None:
    raise Stopped(signum)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    try:
        from roam_cli import cli
    except (Stopped, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(stopped_line(signum), file=sys.stderr)
        sys.exit(128 + signum)
    try:
        cli.main()
    finally:
        # the command is done, its exit code chosen: a signal now would end the interpreter's shutdown
        # by the signal's default action (Python restores it there), with no line and another code
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


if __name__ == "__main__":
    main()
