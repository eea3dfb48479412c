"""Command line: parses arguments and calls one library function per command.

One module per room (`use`: embed, fill-mask, classify, ner, qa, rerank; `retrieval`: index, search;
`pretrain`: tokenizer train, prepare, mask-demo, pretrain, plot, quickstart; `finetune`: finetune,
predict, datasets; `calibrate`; `eval`; `distill`; `serve`; `explore`; `export`; `info`), each with
an `add(sub)` that registers its commands; a command has a `_add_<name>(sub)` that declares its
arguments and a `_run_<name>(args)` that calls the library; the option groups several commands share
(the engine's flags and the options they make, --adapter / --base, --pooling, the training loop's
settings, a run's --resume / --overwrite / --no-progress) are declared once, in `common`. One error
boundary in `main` serves every command: library errors (ValueError, including UnicodeDecodeError
and CheckpointError, and every OSError: missing, existing, unreadable or unwritable paths) are
printed as exactly one line, `bertkit CMD: error: ...`, with exit status 2 and no traceback.
Messages are made at their source, in the library, so Python callers get them too; the boundary only
turns a bare OSError into a line naming the path. Every command also takes `--threads N` (torch's
intra-op threads), and `bertkit --version` prints the version.
"""

from __future__ import annotations

import argparse
import os
import sys

from bertkit.cli import calibrate, distill, eval, explore, export, finetune, info, pretrain, retrieval, serve, use
from bertkit.cli.finetune import finetune_summary_line
from bertkit.cli.pretrain import pretrain_summary_line

__all__ = ["USER_ERRORS", "build_parser", "command_parsers", "error_line", "finetune_summary_line",
           "main", "pretrain_summary_line"]

# In this order `bertkit --help` lists the commands.
ROOMS = [info, use, calibrate, pretrain, finetune, eval, serve, retrieval, distill, explore, export]


def command_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every runnable command's parser by its full name ("info", "tokenizer train", ...)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[prefix] = p
        for action in subs:
            for name, child in action.choices.items():
                walk(child, f"{prefix} {name}".strip())

    walk(parser, "")
    return found


def build_parser() -> argparse.ArgumentParser:
    from bertkit import __version__

    parser = argparse.ArgumentParser(
        prog="bertkit", description="BERT end to end: pre-train, fine-tune and use encoder models "
        "(Hugging Face checkpoint format).")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for room in ROOMS:
        room.add(sub)
    # One shared option on every command, added here so a new command gets it too. An explicit
    # default: the commands with argument_default=SUPPRESS pass their namespace on as settings.
    for command in command_parsers(parser).values():
        command.add_argument("--threads", type=int, default=None, metavar="N",
                             help="torch intra-op threads (default: torch's choice)")
    return parser


# Errors a user can cause and fix: printed as one line, exit status 2. Anything else is a bug and
# keeps its traceback. UnicodeDecodeError and json's errors are ValueErrors.
USER_ERRORS = (ValueError, OSError)


def error_line(err: BaseException) -> str:
    """One line for a library error: its message, or for a bare OSError the path and a fix."""
    if isinstance(err, OSError) and err.errno is not None and err.filename is not None:
        # Raised by the OS itself, not by our code: "[Errno 13] Permission denied: '/x'" → a sentence.
        path = err.filename if err.filename2 is None else f"{err.filename} → {err.filename2}"
        message = f"{path}: {err.strerror or err}; check the path and its permissions, or choose another path"
    else:
        message = str(err) or type(err).__name__
    return " ".join(message.split())  # exactly one line, whatever the message held


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse gives a positional list only the values before the first option, so `embed
        # MODEL --json "a text"` would leave "a text" over: texts may come anywhere after MODEL.
        if isinstance(getattr(args, "texts", None), list) and not any(e.startswith("-") for e in extra):
            args.texts = [*args.texts, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command = args.command + (f" {args.tokenizer_command}" if args.command == "tokenizer" else "")
    threads = vars(args).pop("threads", None)
    try:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"--threads must be at least 1, got {threads}")
            import torch

            torch.set_num_threads(threads)
        args.func(args)
    except BrokenPipeError:  # the reader went away (`bertkit info base | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second one at exit
        return 0
    except USER_ERRORS as err:
        print(f"bertkit {command}: error: {error_line(err)}", file=sys.stderr)
        return 2
    return 0
