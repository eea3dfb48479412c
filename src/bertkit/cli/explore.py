"""bertkit explore: a local page that shows how BERT sees your text, from a live model."""

from __future__ import annotations

import argparse

from bertkit.cli.common import need_web_stack


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="a local page that shows how BERT sees your text (live model)",
                       description="Start a page on this machine that shows, for your own sentences, "
                       "which tokens each position sees, how the input embeddings are summed, the "
                       "masking recipe step by step, fill-mask, attention per layer and head, and "
                       "fine-tuned models' outputs. Every number comes from the model.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL_DIR",
                   help="the model to look inside (default: runs/quickstart/model if `make demo` "
                   "made it, else all-MiniLM-L6-v2)")
    p.add_argument("--model", dest="tasks", action="append", default=[], metavar="NAME=DIR",
                   help="a fine-tuned model for the tasks view (classifier, NER, QA, reranker or "
                   "sentence encoder); repeatable")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=_run_explore)


def _run_explore(args: argparse.Namespace) -> None:
    need_web_stack("explore")
    from bertkit.explore import Explorer, default_model_dir
    from bertkit.explore.app import run
    from bertkit.util.web import listen

    tasks = []
    for spec in args.tasks:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            raise ValueError(f"--model {spec!r} must be NAME=DIR (e.g. --model sentiment=runs/sentiment)")
        tasks.append((name, directory))
    if len({name for name, _ in tasks}) < len(tasks):
        raise ValueError("two --model options share a name; give each its own NAME=DIR")
    explorer = Explorer.load(args.model or default_model_dir(), tasks)
    sock = listen(args.host, args.port)  # before announcing: a busy port is an error line
    heads = "masked-LM head" if explorer.has_mlm else "no MLM head: fill-mask and masking guesses are off"
    print(f"model {explorer.name}: {explorer.model_dir} ({heads})")
    for t in explorer.tasks.values():
        print(f"task {t.name}: {t.engine.model_dir} → {t.use}")
    print(f"explorer on http://{args.host}:{sock.getsockname()[1]}/ (Ctrl-C stops)", flush=True)
    run(explorer, sockets=[sock])
