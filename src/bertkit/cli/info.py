"""bertkit info: the parameter table of a preset or a model directory."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="parameter table of a preset or model directory")
    p.add_argument("model", help="preset name (tiny, mini, small, medium, base, large) or model dir")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary size for a preset")
    p.set_defaults(func=_run_info)


def _run_info(args: argparse.Namespace) -> None:
    from bertkit.encoder.summary import format_parameter_table

    print(format_parameter_table(args.model, vocab_size=args.vocab_size))
