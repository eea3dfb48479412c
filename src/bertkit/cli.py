"""Command line: parses arguments and calls one library function per command.

Each command has a `_add_<name>(sub)` that declares its arguments and a `_run_<name>(args)` that
calls the library. Library errors (ValueError, FileNotFoundError, FileExistsError) are printed as
one clear line and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------
def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="parameter table of a preset or model directory")
    p.add_argument("model", help="preset name (tiny, mini, small, medium, base, large) or model dir")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary size for a preset")
    p.set_defaults(func=_run_info)


def _run_info(args: argparse.Namespace) -> None:
    from bertkit.summary import format_parameter_table

    print(format_parameter_table(args.model, vocab_size=args.vocab_size))


# ---------------------------------------------------------------------------------------------
# (further commands are added below, one section each)
# ---------------------------------------------------------------------------------------------


COMMANDS = [_add_info]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError) as err:
        print(f"bertkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
