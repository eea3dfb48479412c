"""bertkit info: the parameter table of a preset or a model directory (or a LoRA adapter's base,
with the adapter's own figures under it)."""

from __future__ import annotations

import argparse

from bertkit.cli.common import add_base_argument


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="parameter table of a preset or model directory")
    p.add_argument("model", help="preset name (tiny, mini, small, medium, base, large), model dir, or LoRA "
                   "adapter dir (its base's table, then the adapter's)")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary size for a preset")
    add_base_argument(p)
    p.set_defaults(func=_run_info)


def _run_info(args: argparse.Namespace) -> None:
    from bertkit.adapters import is_adapter_dir
    from bertkit.encoder.summary import format_parameter_table

    if args.base is None and not is_adapter_dir(args.model):
        print(format_parameter_table(args.model, vocab_size=args.vocab_size))
        return
    from bertkit.adapters import read_adapter, resolve
    from bertkit.encoder.config import BertConfig

    base_dir, adapter_dir = resolve(args.model, None, args.base)
    print(format_parameter_table(base_dir))
    files = read_adapter(adapter_dir, BertConfig.from_json(base_dir), base_name=str(base_dir))
    print(f"\nLoRA adapter {adapter_dir} over {base_dir}: {files.use}, r={files.r}, lora_alpha={files.alpha:g}, "
          f"{len(files.targets)} adapted modules, {files.parameters:,} parameters"
          + (f"; labels {', '.join(files.labels)}" if files.labels else ""))
