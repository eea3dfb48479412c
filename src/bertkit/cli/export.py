"""bertkit export: a model directory as ONNX or OpenVINO files that TEI and sentence-transformers load."""

from __future__ import annotations

import argparse
import json

from bertkit.constants import EXPORT_USES, POOLINGS


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export a model to ONNX or OpenVINO (dynamic batch and length)",
        description="Export a model directory for one task head to ONNX (OUT/onnx/model.onnx) or "
        "OpenVINO (OUT/openvino/openvino_model.xml), with its config, tokenizer and "
        "sentence-transformers files beside it: the layout text-embeddings-inference's ONNX backend "
        "and sentence-transformers' backend='onnx' / 'openvino' read. Inputs input_ids, "
        "attention_mask (and token_type_ids for BERT and ALBERT); outputs last_hidden_state "
        "(+ sentence_embedding with --pooled), logits, or start_logits and end_logits. The written "
        "file is run once and compared with bertkit before it is moved into place. Needs the "
        "export extra: pip install 'bertkit[export]'.")
    p.add_argument("model", help="model directory")
    p.add_argument("--format", required=True, help="onnx or openvino")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--task", choices=EXPORT_USES, default=None,
                   help="the head to export (default: the one the model has; embed exports the encoder)")
    p.add_argument("--pooled", action="store_true",
                   help="embed: add a sentence_embedding output, pooled and normalised as the model's "
                   "sentence-transformers files say (mean and unit length without them)")
    p.add_argument("--pooling", choices=POOLINGS, default=None, help="embed: pool this way (implies --pooled)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="embed: unit-length sentence_embedding or not (implies --pooled)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_run_export)


def _run_export(args: argparse.Namespace) -> None:
    from bertkit.export import export

    report = export(args.model, args.out, format=args.format, task=args.task, pooled=args.pooled,
                    pooling=args.pooling, normalize=args.normalize, opset=args.opset,
                    overwrite=args.overwrite)
    if args.json:
        print(json.dumps(report.as_dict()))
        return
    model_file = next(f for f in report.files if f.endswith((".onnx", ".xml")))
    print(f"{report.format} {report.task} → {report.out / model_file} "
          f"(inputs {', '.join(report.inputs)}; outputs {', '.join(report.outputs)}; "
          f"max |Δ| vs bertkit {report.max_abs_diff:.1e})")
