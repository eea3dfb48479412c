"""Command line: parses arguments and calls one library function per command.

Each command has a `_add_<name>(sub)` that declares its arguments and a `_run_<name>(args)` that
calls the library. One error boundary in `main` serves every command: library errors (ValueError,
including UnicodeDecodeError and CheckpointError, and every OSError: missing, existing,
unreadable or unwritable paths) are printed as exactly one line, `bertkit CMD: error: ...`, with
exit status 2 and no traceback. Messages are made at their source, in the library, so Python
callers get them too; the boundary only turns a bare OSError into a line naming the path.
Every command also takes `--threads N` (torch's intra-op threads), and `bertkit --version` prints
the version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


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
# the uses of a model: embed, fill-mask, classify, ner, qa, rerank (one inference engine)
# ---------------------------------------------------------------------------------------------
def _add_use(sub: argparse._SubParsersAction, name: str, help: str, model_help: str,
             texts: bool = True) -> argparse.ArgumentParser:
    """A use's parser with what every use shares: the model, texts or --input/--out, the engine."""
    p = sub.add_parser(name, help=help, description=help + ". Texts on the command line print "
                       "results; --input FILE (txt: a text a line; jsonl; csv/tsv with a header) "
                       "--out FILE streams a file of any size (bad rows named and skipped; "
                       "--resume continues a killed run; under torchrun the ranks split the input).")
    p.add_argument("model", help=model_help)
    if texts:
        p.add_argument("texts", nargs="*", help="texts (or give --input)")
    p.add_argument("--input", help="input file (.txt, .jsonl, .csv, .tsv)")
    p.add_argument("--out", help="output file for --input: .jsonl (or .npy for embed)")
    p.add_argument("--text-field", default="text", help="jsonl key / csv column of the text (text)")
    p.add_argument("--resume", action="store_true", help="continue a killed --input run")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="fp32",
                   help="fp32 (default, exact); bf16; int8 (dynamic, per-token; CPU); auto = the "
                   "faster of fp32 and bf16, measured on this machine")
    p.add_argument("--max-batch-tokens", type=int, default=8192, help="real tokens per batch (8192)")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per input (default: the model's limit)")
    p.add_argument("--no-truncate", action="store_false", dest="truncate",
                   help="refuse inputs over the limit instead of truncating them with a warning")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object per text")
    return p


def _engine(args: argparse.Namespace, task: str):
    from bertkit.inference import Engine

    return Engine.load(args.model, task=task, precision=args.precision,
                       max_batch_tokens=args.max_batch_tokens, device=args.device,
                       truncate=args.truncate, **({"max_length": args.max_length} if args.max_length else {}))


def _inputs(args: argparse.Namespace, *, need_texts: bool = True) -> None:
    """Texts or --input/--out, not both; outputs checked before any model is loaded."""
    from bertkit.fileio import check_writable_output

    texts = getattr(args, "texts", None)
    if args.input:
        if texts:
            raise ValueError("give texts on the command line or --input FILE, not both")
        if not args.out:
            raise ValueError("--input needs --out FILE (.jsonl, or .npy for embed)")
        if not Path(args.input).is_file():
            raise FileNotFoundError(f"--input {args.input} does not exist or is not a file")
        check_writable_output(args.out, overwrite=None if args.resume else args.overwrite)
    elif need_texts and not texts:
        raise ValueError(f"bertkit {args.command} needs texts or --input FILE --out FILE")
    elif args.out:
        raise ValueError("--out goes with --input FILE; texts on the command line print their results")


def _file_job(args: argparse.Namespace, use: str, engine, pair_field: str | None = None, **options) -> None:
    from bertkit.inference.jobs import run_use_on_file

    summary = run_use_on_file(use, engine, args.input, args.out, text_field=args.text_field,
                              pair_field=pair_field, resume=args.resume, overwrite=args.overwrite,
                              progress=args.progress, **options)
    skipped = summary.get("skipped", 0)
    print(f"{summary['rows']:,} row{'' if summary['rows'] == 1 else 's'} → {summary['out']} "
          f"({engine.precision}, {summary.get('rows_per_second') or 0:,.0f} rows/s"
          f"{f', {skipped:,} bad row' + ('' if skipped == 1 else 's') + ' skipped' if skipped else ''})")
    if engine.stats.truncated:
        print(f"{engine.stats.truncated:,} input{'' if engine.stats.truncated == 1 else 's'} over "
              f"{engine.max_length} tokens truncated")
    print(json.dumps(summary, ensure_ascii=False, default=str))


def _use_engine(args: argparse.Namespace, use: str, **file_options):
    """The engine for `use` over texts on the command line; None once `--input FILE` has been run
    through it into `--out` (file_options: the use's options for the file job)."""
    _inputs(args)
    engine = _engine(args, use)
    if not args.input:
        return engine
    _file_job(args, use, engine, **file_options)
    return None


def _print_json(rows) -> None:
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "embed", "sentence embeddings (and their cosine similarities)",
                 "model dir (any BERT checkpoint with tokenizer files)")
    p.add_argument("--pooling", choices=["mean", "cls", "max"], default=None,
                   help="default: the model's sentence-transformers pooling, else mean")
    p.add_argument("--no-normalize", action="store_false", dest="normalize", default=None,
                   help="keep the raw pooled vectors (default: the model's setting, else unit length)")
    p.set_defaults(func=_run_embed)


def _run_embed(args: argparse.Namespace) -> None:
    from bertkit.inference import embed
    from bertkit.inference.embed import resolve_pooling

    engine = _use_engine(args, "embed", pooling=args.pooling, normalize=args.normalize)
    if engine is None:
        return
    vectors = embed(engine, args.texts, pooling=args.pooling, normalize=args.normalize)
    if args.json:
        return _print_json({"text": t, "embedding": v} for t, v in zip(args.texts, vectors.tolist()))
    mode, unit = resolve_pooling(engine, args.pooling, args.normalize)
    n = len(args.texts)
    print(f"{n} embedding{'' if n == 1 else 's'} of size {vectors.shape[1]} ({mode} pooling"
          f"{', unit length' if unit else ''}); cosine similarity:")
    unit_vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    sims = unit_vectors @ unit_vectors.T
    for i, text in enumerate(args.texts):
        print("  " + " ".join(f"{float(s):6.3f}" for s in sims[i]) + f"  {text}")


def _add_fill_mask(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "fill-mask", "top-k candidates with probabilities for each [MASK]",
                 "model dir with an MLM head (ours or Hugging Face's) and tokenizer files")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--targets", nargs="+", default=None, help="score only these words")
    p.set_defaults(func=_run_fill_mask)


def _run_fill_mask(args: argparse.Namespace) -> None:
    from bertkit.inference import fill_mask

    engine = _use_engine(args, "fill-mask", top_k=args.top_k, targets=args.targets)
    if engine is None:
        return
    results = fill_mask(engine, args.texts, top_k=args.top_k, targets=args.targets)
    if args.json:
        from dataclasses import asdict

        return _print_json({"text": text, "masks": [[asdict(c) for c in cands] for cands in masks]}
                           for text, masks in zip(args.texts, results))
    for text, masks in zip(args.texts, results):
        print(text)
        for i, cands in enumerate(masks):
            shown = "  ".join(f"{c.token} {c.prob:.3f}" for c in cands)
            print(f"  [MASK] {i + 1}: {shown}")


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "classify", "labels and scores of texts or text pairs",
                 "model dir with a sequence-classification head (e.g. made by `bertkit finetune`)")
    p.add_argument("--pair", nargs="+", default=None, help="second texts, one per text (pair models)")
    p.add_argument("--pair-field", default=None, help="with --input: the column of the second text")
    p.add_argument("--function", choices=["softmax", "sigmoid", "none"], default=None,
                   help="scores from logits (default: softmax; sigmoid for multi-label and 1-label heads)")
    p.set_defaults(func=_run_classify)


def _run_classify(args: argparse.Namespace) -> None:
    from bertkit.inference import classify

    engine = _use_engine(args, "classify", pair_field=args.pair_field, function=args.function)
    if engine is None:
        return
    rows = classify(engine, args.texts, args.pair, function=args.function)
    if args.json:
        return _print_json({"text": t, **r} for t, r in zip(args.texts, rows))
    for text, row in zip(args.texts, rows):
        if "value" in row:
            print(f"{row['value']:8.4f}  {text}")
        else:
            print(f"{row['label']:>12} {row['score']:.3f}  {text}")


def _add_ner(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "ner", "named entities with character offsets",
                 "model dir with a token-classification head (e.g. made by `bertkit finetune --task ner`)")
    p.set_defaults(func=_run_ner)


def _run_ner(args: argparse.Namespace) -> None:
    from bertkit.inference import ner

    engine = _use_engine(args, "ner")
    if engine is None:
        return
    results = ner(engine, args.texts)
    if args.json:
        return _print_json({"text": t, "entities": e} for t, e in zip(args.texts, results))
    for text, entities in zip(args.texts, results):
        print(text)
        for e in entities:
            print(f"  {e['type']:>6} {e['start']:>4}-{e['end']:<4} {e['score']:.3f}  {e['text']}")
        if not entities:
            print("  (no entities)")


def _add_qa(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "qa", "answer spans to questions about a context (windows past the limit)",
                 "model dir with a question-answering head (e.g. made by `bertkit finetune --task qa`)",
                 texts=False)
    p.add_argument("--question", nargs="+", default=None, help="questions")
    p.add_argument("--context", default=None, help="the context (a file path or the text itself)")
    p.add_argument("--pair-field", default="context", help="with --input: the context column (context)")
    p.add_argument("--top-k", type=int, default=1, help="answers per question (1)")
    p.add_argument("--max-answer-length", type=int, default=30, help="longest answer in pieces (30)")
    p.add_argument("--allow-no-answer", action="store_true", help="SQuAD 2.0 models: may answer ''")
    p.set_defaults(func=_run_qa, text_field="question")


def _run_qa(args: argparse.Namespace) -> None:
    from bertkit.inference import qa

    args.texts = args.question
    options = dict(top_k=args.top_k, max_answer_length=args.max_answer_length,
                   allow_no_answer=args.allow_no_answer)
    if not args.input and args.question and not args.context:
        raise ValueError("qa needs --context TEXT_OR_FILE with --question, or --input FILE --out FILE")
    engine = _use_engine(args, "qa", pair_field=args.pair_field, **options)
    if engine is None:
        return
    context = args.context
    if Path(context).is_file():
        from bertkit.data.report import read_text

        context = read_text(context)
    results = qa(engine, args.question, context, **options)
    if args.json:
        return _print_json({"question": q, "answers": a} for q, a in zip(args.question, results))
    for question, answers in zip(args.question, results):
        print(question)
        for a in answers:
            print(f"  {a['score']:.3f}  {a['text']!r}  [{a['start']}:{a['end']}]")


def _add_rerank(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "rerank", "order documents by a cross-encoder's relevance to a query",
                 "cross-encoder dir (a sequence-classification head with one label)")
    p.add_argument("--query", required=True)
    p.add_argument("--top-k", type=int, default=None, help="keep the best K (default all)")
    p.add_argument("--raw-scores", action="store_true", help="logits instead of sigmoid scores")
    p.set_defaults(func=_run_rerank)


def _run_rerank(args: argparse.Namespace) -> None:
    from bertkit.inference import rerank

    engine = _use_engine(args, "rerank", query=args.query, raw_scores=args.raw_scores)
    if engine is None:
        return
    ranked = rerank(engine, args.query, args.texts, top_k=args.top_k, raw_scores=args.raw_scores)
    if args.json:
        return _print_json({**r, "text": args.texts[r["index"]]} for r in ranked)
    for r in ranked:
        print(f"{r['score']:8.4f}  [{r['index']}] {args.texts[r['index']]}")


# ---------------------------------------------------------------------------------------------
# index and search (bertkit.retrieval)
# ---------------------------------------------------------------------------------------------
def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="embed a corpus into a search index (vectors + documents + model)",
                       description="Stream CORPUS (jsonl rows with id and text, or txt: a document a "
                       "line, its id the line number) through a bi-encoder into OUT: vectors.npy, "
                       "docs.jsonl, index.json (the model and its fingerprint). Bad rows are named "
                       "and skipped; --resume continues a killed build.")
    p.add_argument("corpus", help="corpus file (.jsonl or .txt)")
    p.add_argument("--model", required=True, help="bi-encoder model dir (any BERT; its own pooling)")
    p.add_argument("--out", required=True, help="index directory")
    p.add_argument("--text-field", default="text", help="jsonl key of the text (text)")
    p.add_argument("--id-field", default="id", help="jsonl key of the id (id; else the line number)")
    p.add_argument("--pooling", choices=["mean", "cls", "max"], default=None,
                   help="default: the model's sentence-transformers pooling, else mean")
    p.add_argument("--resume", action="store_true", help="continue a killed build")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="fp32")
    p.add_argument("--max-batch-tokens", type=int, default=8192, help="real tokens per batch (8192)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per document (the model's limit)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    p.set_defaults(func=_run_index)


def _run_index(args: argparse.Namespace) -> None:
    from bertkit.retrieval import build_index

    summary = build_index(args.corpus, args.model, args.out, resume=args.resume,
                          overwrite=args.overwrite, progress=args.progress,
                          text_field=args.text_field, id_field=args.id_field, pooling=args.pooling,
                          precision=args.precision, max_batch_tokens=args.max_batch_tokens,
                          device=args.device,
                          **({"max_length": args.max_length} if args.max_length else {}))
    print(f"indexed {summary['rows']} documents ({summary['dim']} dims, {summary['skipped']} rows "
          f"skipped) into {summary['out']} in {summary['seconds']:.1f} s")


def _add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search an index (exact inner product), optionally reranked",
                       description="Embed each query with the index's own model (another --model is "
                       "refused unless it is the same model), take the best --candidates documents "
                       "by inner product and, with --rerank, order them by a cross-encoder.")
    p.add_argument("index", help="index directory made by `bertkit index`")
    p.add_argument("queries", nargs="+", help="query texts")
    p.add_argument("--rerank", default=None, help="cross-encoder dir to rerank the candidates")
    p.add_argument("--rerank-max-length", type=int, default=None,
                   help="pieces per query + document pair (default: the length it was trained at)")
    p.add_argument("--top-k", type=int, default=10, help="results per query (10)")
    p.add_argument("--candidates", type=int, default=100, help="first-stage results to rerank (100)")
    p.add_argument("--rerank-weight", type=float, default=1.0,
                   help="order by W · reranker + (1 − W) · first stage, each standardised over a "
                   "query's candidates (1: the reranker alone; pick W on dev queries)")
    p.add_argument("--model", default=None, help="query model (default: the index's; must be the same)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="fp32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    p.add_argument("--json", action="store_true", help="one JSON object per query")
    p.set_defaults(func=_run_search)


def _run_search(args: argparse.Namespace) -> None:
    from bertkit.retrieval import Searcher

    searcher = Searcher.open(args.index, model=args.model, rerank=args.rerank,
                             rerank_max_length=args.rerank_max_length,
                             precision=args.precision, device=args.device)
    results = searcher.search(args.queries, top_k=args.top_k, candidates=args.candidates,
                              rerank_weight=args.rerank_weight)
    if args.json:
        return _print_json({"query": q, "hits": [h.to_dict() for h in hits]}
                           for q, hits in zip(args.queries, results))
    stage = ("inner product" if not args.rerank else "reranked" if args.rerank_weight == 1.0
             else f"reranked, fused at weight {args.rerank_weight:g}")
    for query, hits in zip(args.queries, results):
        print(f"{query}  ({stage}; retrieve {searcher.timings['retrieve_ms']:.0f} ms, "
              f"rerank {searcher.timings['rerank_ms']:.0f} ms)")
        for h in hits:
            text = h.text if len(h.text) <= 100 else h.text[:97] + "..."
            print(f"  {h.rank:3d}  {h.score:8.4f}  [{h.id}] {text}")


# ---------------------------------------------------------------------------------------------
# (further commands are added below, one section each)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------------
def _add_pretrain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pre-train a BERT (MLM + NSP) on data made by `prepare`",
                       description="Pre-train a BERT on prepared data. Options left out take the "
                       "defaults of bertkit.train.pretrain.PretrainConfig; the full settings are "
                       "written to RUN_DIR/pretrain_config.json. Runs under torchrun as it is.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--data", required=True, help="DATA_DIR made by `bertkit prepare`")
    p.add_argument("--out", required=True, help="RUN_DIR for checkpoints, metrics and the model")
    p.add_argument("--model", help="preset (tiny mini small medium base large albert-base; default "
                   "mini), config.json or model directory; vocab_size comes from the data")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE", dest="model_args",
                   help="override a config.json field, e.g. hidden_dropout_prob=0 (repeatable)")
    p.add_argument("--init", help="continue from this Hugging Face BERT directory's weights")
    p.add_argument("--objective", choices=["mlm", "mlm+nsp", "mlm+sop"],
                   help="what to train (default: what the data were prepared for); mlm on pair "
                        "data ignores the pair labels")
    p.add_argument("--max-steps", type=int, help="optimizer steps (or give --epochs)")
    p.add_argument("--epochs", type=float, help="passes over the data (default 1)")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step, all processes (128)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per step (1)")
    p.add_argument("--lr", type=float, help="peak learning rate (5e-4)")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay, not on biases/LayerNorm (0.01)")
    p.add_argument("--schedule", choices=["linear", "cosine", "constant"], help="decay after warmup")
    p.add_argument("--warmup-steps", type=int, help="linear warmup steps (6%% of the steps)")
    p.add_argument("--max-grad-norm", type=float, help="gradient clipping norm (1.0)")
    p.add_argument("--mlm-probability", type=float, help="share of tokens selected for MLM (0.15)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"],
                   help="auto = bf16 on CUDA; on CPU the faster of fp32 / bf16, measured here")
    p.add_argument("--compile", action="store_true", help="torch.compile the encoder layers (on CPU no faster than eager)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--num-workers", type=int,
                   help="DataLoader worker processes (default: 1 on CUDA or when a CPU core is "
                        "left over by torch's threads, else 0)")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int, help="steps between metrics.jsonl lines (10)")
    p.add_argument("--eval-every", type=int, help="steps between held-out evaluations (10 × log)")
    p.add_argument("--eval-batches", type=int, help="held-out batches per evaluation (20)")
    p.add_argument("--save-every", type=int, help="steps between checkpoints (1000)")
    p.add_argument("--keep", type=int, help="checkpoints kept (2)")
    p.add_argument("--max-bad-steps", type=int, help="non-finite steps in a row before stopping (10)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop cleanly with a checkpoint after this much training; --resume continues")
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    p.add_argument("--resume", action="store_true", help="continue RUN_DIR from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start over in an existing RUN_DIR")
    p.set_defaults(func=_run_pretrain)


def _run_pretrain(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.pretrain import Interrupted, PretrainConfig, TrainingDiverged, pretrain

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "func", "model_args")}
    overrides = {}
    for item in getattr(args, "model_args", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--model-arg {item!r} is not KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string such as gelu_new
    if overrides:
        settings["model_overrides"] = overrides
    try:
        summary = pretrain(PretrainConfig(**settings))
    except TrainingDiverged as err:
        raise SystemExit(f"bertkit pretrain: stopped: {err}") from None
    except Interrupted as err:
        print(f"bertkit pretrain: {err}", file=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    print(pretrain_summary_line(summary))
    print(json.dumps(summary))


def pretrain_summary_line(summary: dict) -> str:
    """The human line before the JSON: where the model is, how far it got, the held-out score."""
    line = f"model saved in {summary['model_dir']} after {summary['steps']:,} of {summary['total_steps']:,} steps"
    held_out = summary.get("eval") or {}
    if held_out.get("mlm_accuracy") is not None:
        line += f"; held-out MLM accuracy {held_out['mlm_accuracy']:.3f}, loss {held_out['loss']:.3f}"
    if summary.get("stopped") == "time_limit":
        line += "; stopped at --time-limit: continue with --resume"
    return line


# ---------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------
def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw loss / accuracy / lr curves of a run into RUN_DIR/curves.png")
    p.add_argument("run_dir", help="RUN_DIR of `bertkit pretrain`, or OUT of `bertkit finetune`")
    p.add_argument("--out", default=None, help="image path (default RUN_DIR/curves.png, redrawn each time)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out image")
    p.set_defaults(func=_run_plot)


def _run_plot(args: argparse.Namespace) -> None:
    from bertkit.plot import plot_run

    try:
        print(plot_run(args.run_dir, args.out, overwrite=args.overwrite))
    except ImportError as err:
        raise SystemExit(f"bertkit plot: error: {err}") from None


# ---------------------------------------------------------------------------------------------
# quickstart
# ---------------------------------------------------------------------------------------------
def _add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="the demo: corpus → vocabulary → pre-training → fill-mask "
                       "(≈10 minutes on 2 CPU cores)")
    p.add_argument("--lang", choices=["zh", "en"], default="zh",
                   help="zh: People's Daily 1998 (default); en: BBC News")
    p.add_argument("--out", default="runs/quickstart", help="run directory (default runs/quickstart)")
    p.add_argument("--steps", type=int, default=None, help="pre-training steps (default: sized to fit)")
    p.add_argument("--overwrite", action="store_true", help="start over if --out holds another run")
    p.set_defaults(func=_run_quickstart)


def _run_quickstart(args: argparse.Namespace) -> None:
    import logging

    from bertkit.quickstart import QuickstartConfig, quickstart
    from bertkit.train.pretrain import Interrupted

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    try:
        result = quickstart(QuickstartConfig(lang=args.lang, out=args.out, steps=args.steps,
                                             overwrite=args.overwrite))
    except Interrupted as err:
        print(f"bertkit quickstart: {err}; run the same command again to continue", file=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    print(json.dumps(result, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# tokenizer train
# ---------------------------------------------------------------------------------------------
def _add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """--corpus / --format / --text-field, shared by the commands that read raw text."""
    p.add_argument("--corpus", required=True, nargs="+", metavar="SOURCE",
                   help="files, directories, globs or builtin:NAME (peoples-daily, zh-reviews, "
                   "bbc-news, zh)")
    p.add_argument("--format", choices=["auto", "lines", "paragraphs", "jsonl"], default="auto",
                   help="corpus file format (auto: jsonl by suffix, else one sentence per line)")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text")


def _add_tokenizer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools (train a WordPiece vocabulary)")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="learn a WordPiece vocabulary from a corpus",
                        description="Learn a BERT WordPiece vocabulary ([PAD]=0 [UNK] [CLS] [SEP] "
                        "[MASK], then the alphabet and learned pieces) and write vocab.txt, "
                        "tokenizer.json and tokenizer_config.json to OUT.")
    _add_corpus_arguments(t)
    t.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary")
    t.add_argument("--out", required=True, help="directory for the tokenizer files")
    t.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                   help="lowercase (and strip accents) before tokenizing (default: yes)")
    t.add_argument("--min-frequency", type=int, default=2, help="least count of a learned piece")
    t.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in OUT")
    t.set_defaults(func=_run_tokenizer_train)


def _run_tokenizer_train(args: argparse.Namespace) -> None:
    from bertkit.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(args.corpus, args.vocab_size, args.out, lowercase=args.lowercase,
                                min_frequency=args.min_frequency, overwrite=args.overwrite,
                                corpus_format=args.format, text_field=args.text_field,
                                show_progress=True)
    print(f"{args.out}: {tokenizer.vocab_size} tokens, fingerprint {tokenizer.fingerprint()}")


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------
def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="tokenize a corpus into pre-training shards (DATA_DIR)",
                       description="Tokenize a corpus once and write pre-training instances "
                       "(NSP pairs, or packed sentences with --no-nsp) as memory-mapped shards, "
                       "with meta.json and a copy of the tokenizer, for `bertkit pretrain`.")
    _add_corpus_arguments(p)
    p.add_argument("--tokenizer", required=True, help="tokenizer or model directory")
    p.add_argument("--out", required=True, help="DATA_DIR to create")
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens per instance (128)")
    p.add_argument("--no-nsp", action="store_false", dest="nsp",
                   help="no next-sentence pairs: pack full sentences across documents (RoBERTa)")
    p.add_argument("--objective", choices=["mlm", "mlm+nsp", "mlm+sop"], default=None,
                   help="instances for: mlm (packed full sentences, = --no-nsp), mlm+nsp (BERT's "
                        "pairs, the default) or mlm+sop (ALBERT's consecutive pairs, swapped half "
                        "the time)")
    p.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="share of NSP chunks aiming at a random shorter length (0.1)")
    p.add_argument("--whole-word-mask", action="store_true",
                   help="mask whole words (WordPiece ## groups; jieba words for Chinese)")
    p.add_argument("--static-masking", action="store_true",
                   help="fix the masks now (default: new masks every epoch)")
    p.add_argument("--dupe-factor", type=int, default=1,
                   help="passes over the corpus with different pairs / static masks (1)")
    p.add_argument("--mlm-probability", type=float, default=0.15,
                   help="share of tokens predicted, for static masks (0.15)")
    p.add_argument("--max-predictions", type=int, default=None, dest="max_predictions_per_seq",
                   help="cap on predictions per sequence (default round(max_seq_len × rate))")
    p.add_argument("--eval-fraction", type=float, default=0.01,
                   help="share of documents held out for evaluation (0.01)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes for Chinese word segmentation (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace data already in DATA_DIR")
    p.set_defaults(func=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> None:
    from bertkit.data.shards import prepare

    stats = prepare(args.corpus, args.tokenizer, args.out, max_seq_len=args.max_seq_len,
                    nsp=args.nsp, objective=args.objective, short_seq_prob=args.short_seq_prob,
                    whole_word_mask=args.whole_word_mask, static_masking=args.static_masking,
                    dupe_factor=args.dupe_factor, mlm_probability=args.mlm_probability,
                    max_predictions_per_seq=args.max_predictions_per_seq,
                    eval_fraction=args.eval_fraction, seed=args.seed, workers=args.workers,
                    overwrite=args.overwrite, corpus_format=args.format,
                    text_field=args.text_field)
    print(stats.summary())


# ---------------------------------------------------------------------------------------------
# mask-demo
# ---------------------------------------------------------------------------------------------
def _add_mask_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mask-demo", help="show how pre-training masks a text",
                       description="Mask one text as pre-training does and show, per selected "
                       "position, whether it became [MASK], a random token or stayed unchanged. "
                       "Without --tokenizer: text with CJK characters uses a vocabulary of its own "
                       "characters/words, other text the all-MiniLM-L6-v2 vocabulary.")
    p.add_argument("text")
    p.add_argument("--tokenizer", default=None, help="tokenizer or model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--whole-word-mask", action="store_true",
                   help="mask whole words (WordPiece ## groups; jieba words for Chinese)")
    p.add_argument("--mlm-probability", type=float, default=0.15, help="share selected (0.15)")
    p.set_defaults(func=_run_mask_demo)


def _run_mask_demo(args: argparse.Namespace) -> None:
    from bertkit.data.masking import mask_demo

    print(mask_demo(args.text, args.tokenizer, seed=args.seed,
                    whole_word_mask=args.whole_word_mask,
                    mlm_probability=args.mlm_probability).format())


# ---------------------------------------------------------------------------------------------
# finetune
# ---------------------------------------------------------------------------------------------
def _add_finetune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a BERT on classify / pair / ner / qa data",
                       description="Fine-tune a model directory (or a preset, randomly initialised, "
                       "with --tokenizer) on a task. Options left out take the defaults of "
                       "bertkit.train.finetune.FinetuneConfig. OUT is a Hugging Face model directory "
                       "with finetune_config.json, metrics.jsonl and eval.json; the best epoch is "
                       "saved as soon as it is scored.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--task", required=True, choices=["classify", "pair", "ner", "qa", "embed", "rerank"],
                   help="embed: a bi-encoder (in-batch negatives); rerank: a cross-encoder (--loss on "
                   "mined negatives); their data: JSONL {query, positive, negatives?} or TSV "
                   "query, document, label, or builtin:en-news-retrieval / zh-news-retrieval")
    p.add_argument("--pooling", choices=["mean", "cls"], help="embed: pooling (mean)")
    p.add_argument("--scale", type=float, help="embed: cosine × scale = logit (20, a temperature of 0.05)")
    p.add_argument("--hard-negatives", type=int, help="embed: a row's negatives per query in the batch (1)")
    p.add_argument("--negatives", type=int, help="rerank: negatives per positive (3)")
    p.add_argument("--mine", choices=["bm25", "biencoder", "none"],
                   help="rerank: where negatives beyond a row's own come from (bm25)")
    p.add_argument("--mine-model", help="rerank: bi-encoder dir for --mine biencoder")
    p.add_argument("--loss", choices=["listwise", "bce"],
                   help="rerank: listwise (softmax over a query's positive and negatives; "
                   "--batch-size queries a step) or bce (per pair; --batch-size pairs) (listwise)")
    p.add_argument("--model", required=True, help="model directory, or preset (tiny … large) for random init")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--train", help="training file (CSV/TSV/JSONL; CoNLL/JSONL for ner; SQuAD JSON "
                      "for qa) or builtin:NAME[:SPLIT]")
    data.add_argument("--dataset", help="built-in set (zh-sentiment, zh-ner, en-news): trains on its "
                      "train split, picks epochs on dev, scores the best model on test")
    p.add_argument("--eval", help="evaluation file, scored after every epoch")
    p.add_argument("--test", help="test file, scored once with the best model")
    p.add_argument("--out", required=True, dest="out_dir", help="output model directory")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add_argument("--epochs", type=int, help="passes over the training data (3)")
    p.add_argument("--batch-size", type=int, help="examples per step (32)")
    p.add_argument("--lr", type=float, help="peak learning rate (default by model width: 1e-3 below "
                   "hidden size 512, 1e-4 below 768, 3e-5 for base and wider)")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay (0.01)")
    p.add_argument("--warmup-ratio", type=float, help="share of steps warming up (0.1)")
    p.add_argument("--max-grad-norm", type=float, help="gradient clipping norm (1.0)")
    p.add_argument("--freeze-encoder", action="store_true", help="train the task head only")
    p.add_argument("--lora", metavar="SPEC",
                   help="LoRA adapters instead of full fine-tuning, e.g. r=8,alpha=16,dropout=0.05,"
                   "targets=query,value (targets among query, key, value, attention.output, "
                   "intermediate, output); only the adapters and the head train")
    p.add_argument("--lora-save", choices=["merged", "adapters"],
                   help="with --lora: merged into a plain checkpoint (default) or PEFT adapter files "
                   "(adapter_config.json + adapter_model.safetensors)")
    p.add_argument("--patience", type=int, help="stop after N epochs without a better eval score")
    p.add_argument("--seed", type=int)
    p.add_argument("--max-length", type=int, help="pieces per window (128; qa 384)")
    p.add_argument("--doc-stride", type=int, help="pieces between window starts (half a window; qa 128)")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    p.add_argument("--text-column", help="classify/pair: text column or JSONL key (text)")
    p.add_argument("--pair-column", help="pair: second text column (text_pair)")
    p.add_argument("--label-column", help="classify/pair: label column (label)")
    p.add_argument("--problem-type", choices=["regression", "single_label_classification"],
                   help="default: regression when a label is a non-integer number")
    p.add_argument("--tokens-key", help="ner JSONL key of the words (tokens)")
    p.add_argument("--tags-key", help="ner JSONL key of the tags (tags)")
    p.add_argument("--ner-invalid", choices=["skip", "repair"],
                   help="sentences with broken BIO/BIOES: skip them (default) or read as conlleval")
    p.add_argument("--max-query-length", type=int, help="qa: question pieces kept (64)")
    p.add_argument("--max-answer-length", type=int, help="qa: longest answer in pieces (30)")
    p.add_argument("--n-best", type=int, help="qa: candidate starts/ends per window (20)")
    p.add_argument("--null-score-diff-threshold", type=float,
                   help="qa v2: answer '' when null score - best span score exceeds this (0.0)")
    p.add_argument("--version-2-with-negative", action="store_true",
                   help="qa: allow 'no answer' even if the training file is v1.1")
    p.add_argument("--eval-batch-size", type=int, help="windows per evaluation batch (64)")
    p.add_argument("--eval-first-window", action="store_false", dest="eval_windows",
                   help="classify/pair evaluation: score each text's first --max-length pieces only, as "
                   "training reads it (default: every window, probabilities averaged; BBC articles at "
                   "128 pieces have ~7 windows each)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"],
                   help="auto = bf16 on CUDA; on CPU the faster of fp32 / bf16, measured here")
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    p.add_argument("--save-every", type=int,
                   help="steps between training states in OUT/checkpoints (200; also after each epoch)")
    p.add_argument("--resume", action="store_true",
                   help="continue OUT from its training state (same per-step losses as one run)")
    p.add_argument("--overwrite", action="store_true", help="replace the results in an existing OUT")
    p.set_defaults(func=_run_finetune)


def _run_finetune(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.finetune import FinetuneConfig, run_finetune

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "func", "dataset")}
    if "dataset" in vars(args):
        settings["train"] = f"builtin:{args.dataset}"
    from bertkit.train import retrieval

    extra = {k: settings.pop(k) for k in retrieval.RETRIEVAL_OPTIONS if k in settings}
    config = FinetuneConfig(**settings)
    if config.task in retrieval.TASKS:
        summary = retrieval.run(retrieval.from_finetune_config(config, **extra))
        scores = summary.get("eval")
        print(f"model saved in {config.out_dir} ({summary['steps']} steps, loss {summary['first_loss']:.4f} "
              f"→ {summary['last_loss']:.4f}); " + (f"eval {json.dumps(scores)}" if scores else
                                                   "no --eval set, so no score"))
        print(json.dumps(summary, ensure_ascii=False))
        return
    if extra:
        raise ValueError(f"--{next(iter(extra)).replace('_', '-')} applies to --task embed / rerank "
                         f"only, not {config.task}")
    summary = run_finetune(config)
    print(finetune_summary_line(summary, config.out_dir))
    print(json.dumps(summary, ensure_ascii=False))


def finetune_summary_line(summary: dict, out_dir: str) -> str:
    """The human line before the JSON: where the model is, its epoch and its eval / test score."""
    metric = summary.get("metric")
    line = f"model saved in {out_dir}"
    if summary.get("best_epoch") is not None:
        line += f" (epoch {summary['best_epoch']} of {summary.get('epochs_run')})"
    for split in ("eval", "test"):
        scores = summary.get(split) or {}
        if isinstance(scores.get(metric), (int, float)):
            line += f"; {split} {metric} {scores[metric]:.4f}"
    if not summary.get("eval") and not summary.get("test"):
        line += "; no --eval or --test set, so no score"
    return line + f"; details in {Path(out_dir) / 'eval.json'}"


# ---------------------------------------------------------------------------------------------
# distill
# ---------------------------------------------------------------------------------------------
def _add_distill(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil a teacher into a student with fewer layers",
                       description="General distillation on prepared pre-training data (--data) or "
                       "task distillation from a fine-tuned teacher (--task classify|ner --train, "
                       "optionally --unlabeled): the student copies teacher layers spread over the "
                       "depth and learns loss = alpha_ce * KL * T^2 + alpha_hard * (MLM or label CE) "
                       "+ alpha_cos * (1 - cos) of last hidden states. Options left out take the "
                       "defaults of bertkit.train.distill.DistillConfig. OUT holds model/ (the "
                       "student), metrics.jsonl, checkpoints/ and summary.json.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--teacher", required=True, help="teacher model directory (fine-tuned for --task)")
    p.add_argument("--out", required=True, dest="out_dir", help="output directory")
    p.add_argument("--task", choices=["classify", "ner"], help="task distillation (default: general)")
    p.add_argument("--data", help="general: DATA_DIR made by `bertkit prepare` with the teacher's tokenizer")
    p.add_argument("--train", help="task: labelled training file or builtin:NAME[:SPLIT]")
    p.add_argument("--unlabeled", help="task: inputs without labels (soft labels from the teacher only)")
    p.add_argument("--eval", help="task: scored after every epoch")
    p.add_argument("--test", help="task: scored at the end")
    p.add_argument("--student-layers", type=int, help="layers of the student (6)")
    p.add_argument("--layers", type=lambda text: [int(i) for i in text.split(",")], metavar="I,J,...",
                   help="the teacher layers to copy (default: spread over the depth, 12 -> 6: 0,2,4,7,9,11)")
    p.add_argument("--temperature", type=float, help="softmax temperature T (2.0)")
    p.add_argument("--alpha-ce", type=float, help="weight of the soft loss (5 general, 1 task)")
    p.add_argument("--alpha-hard", type=float, help="weight of MLM / label cross-entropy (2 general, 0 task)")
    p.add_argument("--alpha-cos", type=float, help="weight of the hidden-state cosine loss (1 general, 0 task)")
    p.add_argument("--epochs", type=int, help="passes over the data (3)")
    p.add_argument("--max-steps", type=int, help="stop after N steps")
    p.add_argument("--batch-size", type=int, help="examples per step (32)")
    p.add_argument("--lr", type=float, help="peak learning rate (5e-4)")
    p.add_argument("--warmup-ratio", type=float, help="share of steps warming up (0.05)")
    p.add_argument("--max-length", type=int, help="task: pieces per example (128)")
    p.add_argument("--max-train-examples", type=int, help="task: train on the first N examples only")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int, help="steps per metrics.jsonl line (10)")
    p.add_argument("--save-every", type=int, help="steps between checkpoints (200; also at the end)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"])
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    p.add_argument("--resume", action="store_true", help="continue OUT from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the results in an existing OUT")
    p.set_defaults(func=_run_distill)


def _run_distill(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.distill import DistillConfig, distill

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = DistillConfig(**{k: v for k, v in vars(args).items() if k not in ("command", "func")})
    summary = distill(config)
    line = f"student saved in {summary['model']} ({len(summary['layers'])} of {summary['teacher_layers']} layers)"
    for split in ("eval", "test"):
        scores = summary.get(split) or {}
        for metric in ("accuracy", "f1"):
            if isinstance(scores.get(metric), (int, float)):
                line += f"; {split} {metric} {scores[metric]:.4f}"
    print(line)
    print(json.dumps(summary, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------------------------
def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="run a fine-tuned model over a file (one JSON line per input)",
                       description="Predict with a directory made by `finetune` (task, lengths and "
                       "columns come from its finetune_config.json) or any fine-tuned BERT (--task). "
                       "Inputs: classify/pair CSV/TSV/JSONL or .txt (a text a line); ner CoNLL/JSONL "
                       "words or .txt raw text (entities with character offsets); qa SQuAD JSON.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--model", required=True, dest="model_dir", help="fine-tuned model directory")
    p.add_argument("--input", required=True, dest="input_file")
    p.add_argument("--out", required=True, dest="out_file", help="JSONL predictions")
    p.add_argument("--task", choices=["classify", "pair", "ner", "qa"])
    p.add_argument("--batch-size", type=int, help="windows per batch (64)")
    p.add_argument("--max-length", type=int)
    p.add_argument("--doc-stride", type=int)
    p.add_argument("--text-column")
    p.add_argument("--pair-column")
    p.add_argument("--tokens-key")
    p.add_argument("--null-score-diff-threshold", type=float)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-progress", action="store_false", dest="progress")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_predict)


def _run_predict(args: argparse.Namespace) -> None:
    from bertkit.train.finetune import predict

    settings = {k: v for k, v in vars(args).items() if k not in ("command", "func")}
    print(json.dumps(predict(**settings), ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------
def _add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the built-in labelled sets, or write one out as files",
                       description="Without arguments: list the built-in sets and their split sizes. "
                       "With NAME and --out: write NAME.{train,dev,test}.jsonl (classification) or "
                       ".conll (NER) into the directory, in the formats `finetune` reads.")
    p.add_argument("name", nargs="?", help="set to write (zh-sentiment, zh-ner, en-news)")
    p.add_argument("--out", help="directory for the files")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_datasets)


def _run_datasets(args: argparse.Namespace) -> None:
    from bertkit.data import labelled

    if args.name is None:
        for name, info in labelled.LABELLED_SETS.items():
            sizes = ", ".join(f"{s} {len(labelled.load_labelled(name, s))}" for s in labelled.SPLITS)
            print(f"{name:14} {info.task:9} {info.description} ({sizes})")
        from bertkit.retrieval.datasets import RETRIEVAL_SETS, load_retrieval

        for name, info in RETRIEVAL_SETS.items():
            data = load_retrieval(name)
            sizes = ", ".join(f"{s} {len(q)} queries" for s, q in data.queries.items())
            print(f"{name:14} retrieval {info.description} (corpus {len(data.corpus)}; {sizes})")
        return
    if not args.out:
        raise ValueError("writing a data set needs --out DIR")
    from bertkit.retrieval.datasets import RETRIEVAL_SETS, write_retrieval

    if args.name in RETRIEVAL_SETS:
        for part, path in write_retrieval(args.name, args.out, overwrite=args.overwrite).items():
            print(f"{part}: {path}")
        return
    for split, path in labelled.write_labelled(args.name, args.out, overwrite=args.overwrite).items():
        print(f"{split}: {path}")


# ---------------------------------------------------------------------------------------------
# serve
# ---------------------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP (text-embeddings-inference and OpenAI APIs)",
                       description="Serve one or more model dirs in one process: POST /embed, "
                       "/v1/embeddings, /rerank, /predict, /tokenize, /fill-mask, /ner, /qa; GET "
                       "/health, /info, /metrics. Each request picks a model with its `model` field "
                       "(the first is the default); requests are batched together on one model "
                       "thread. SIGTERM or Ctrl-C: stop taking requests, finish those in flight, exit 0.")
    p.add_argument("models", nargs="+", metavar="[NAME=]MODEL_DIR",
                   help="model dirs, each optionally named (default name: the dir's last part)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this "
                   "machine only; 0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-batch-tokens", type=int, default=8192,
                   help="real tokens per model run, all requests together (8192)")
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="inputs in flight before new requests get 429 (512)")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="inputs per request (32)")
    p.add_argument("--max-input-length", type=int, default=None,
                   help="tokens per input (default: the model's limit); longer → 422, or cut with "
                   "--auto-truncate or the request's \"truncate\": true")
    p.add_argument("--auto-truncate", action="store_true", help="cut over-long inputs instead of refusing them")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="request body bytes (2,000,000)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (not on /health)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="fp32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish requests in flight at shutdown (30)")
    p.set_defaults(func=_run_serve)


def _need_web_stack(command: str) -> None:
    """The `serve` extra's packages, or an error with the line that installs them."""
    import importlib.util

    for module in ("starlette", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"bertkit {command} needs the web stack ({module} is not installed): "
                             "pip install 'bertkit[serve]'")


def _run_serve(args: argparse.Namespace) -> None:
    _need_web_stack("serve")
    from bertkit.serve import Limits, Service, load_model, parse_model_args, serve
    from bertkit.serve.app import listen

    limits = Limits(max_concurrent_requests=args.max_concurrent_requests,
                    max_client_batch_size=args.max_client_batch_size,
                    max_batch_tokens=args.max_batch_tokens, payload_limit=args.payload_limit,
                    auto_truncate=args.auto_truncate)
    options = {"precision": args.precision, "device": args.device, "max_batch_tokens": args.max_batch_tokens,
               **({"max_length": args.max_input_length} if args.max_input_length else {})}
    named = parse_model_args(args.models)
    models = {name: load_model(name, directory, **options) for name, directory in named}
    sock = listen(args.host, args.port)  # before announcing: a busy port is an error line
    for model in models.values():
        print(f"model {model.name}: {model.engine.model_dir} → {', '.join(model.uses)} "
              f"({model.engine.precision}, {model.engine.device}, ≤ {model.max_length} tokens)")
    print(f"listening on http://{args.host}:{sock.getsockname()[1]} (SIGTERM or Ctrl-C stops, "
          "finishing requests in flight)", flush=True)
    serve(Service(models, limits, api_key=args.api_key), sockets=[sock], graceful_timeout=args.graceful_timeout)


def _add_explore(sub: argparse._SubParsersAction) -> None:
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
    _need_web_stack("explore")
    from bertkit.explore import Explorer, default_model_dir
    from bertkit.explore.app import run
    from bertkit.serve.app import listen

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


COMMANDS = [_add_info, _add_fill_mask, _add_embed, _add_classify, _add_ner, _add_qa, _add_rerank,
            _add_pretrain, _add_plot, _add_quickstart, _add_tokenizer, _add_prepare,
            _add_mask_demo, _add_finetune, _add_predict, _add_datasets, _add_serve,
            _add_index, _add_search, _add_distill, _add_explore]


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
    for add in COMMANDS:
        add(sub)
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
    args = build_parser().parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
