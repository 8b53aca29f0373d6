"""The `roam` executable (and `python -m roam_cli`). The command line's modules are imported
inside `main`, so that a Ctrl-C while they load (a second or two) is an interrupt like any
other: one line and exit 130, not a traceback."""

import sys


def main() -> None:
    try:
        from roam_cli import cli
    except KeyboardInterrupt:
        print("roam: interrupted", file=sys.stderr)
        sys.exit(130)
    cli.main()


if __name__ == "__main__":
    main()
