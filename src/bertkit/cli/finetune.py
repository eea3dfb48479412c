"""Fine-tuning: finetune (every task of the library's table: classify, pair, ner, qa, embed, rerank,
sparse, colbert), predict with the result, and the built-in labelled data sets to try it on."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bertkit.cli.common import (
    add_adapter_arguments,
    add_engine_arguments,
    add_loop_arguments,
    add_run_arguments,
    add_training_engine_arguments,
    config_settings,
    print_file_job,
)
from bertkit.constants import FINETUNE_TASKS, LABELLED_TASKS, TRAINED_POOLINGS


def add(sub: argparse._SubParsersAction) -> None:
    _add_finetune(sub)
    _add_mine_negatives(sub)
    _add_predict(sub)
    _add_datasets(sub)


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
    # Groups only shape --help, one heading per concern; they leave the namespace as it was.
    g = p.add_argument_group("model and data")
    g.add_argument("--task", required=True, choices=FINETUNE_TASKS,
                   help="embed: a bi-encoder (in-batch negatives); rerank: a cross-encoder (--loss on "
                   "mined negatives); their data: JSONL {query, positive, negatives?} or TSV "
                   "query, document, label, or builtin:en-news-retrieval / zh-news-retrieval; colbert: "
                   "late interaction (MaxSim over token vectors), saved in PyLate's layout")
    g.add_argument("--model", required=True,
                   help="model directory, or preset (tiny … large) for random init")
    g.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    data = g.add_mutually_exclusive_group(required=True)
    data.add_argument("--train", help="training file (CSV/TSV/JSONL; CoNLL/JSONL for ner; SQuAD JSON "
                      "for qa) or builtin:NAME[:SPLIT]")
    data.add_argument("--dataset", help="built-in set (zh-sentiment, zh-ner, en-news): trains on its "
                      "train split, picks epochs on dev, scores the best model on test")
    g.add_argument("--eval", help="evaluation file, scored after every epoch")
    g.add_argument("--test", help="test file, scored once with the best model")
    g.add_argument("--out", required=True, dest="out_dir", help="output model directory")
    g.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    g.add_argument("--max-length", type=int, help="pieces per window (128; qa 384)")
    g.add_argument("--doc-stride", type=int, help="pieces between window starts (half a window; qa 128)")

    g = p.add_argument_group("optimisation")
    add_loop_arguments(g, epochs="passes over the training data (3)",
                       batch_size="examples per step, all torchrun processes together (32)",
                       lr="peak learning rate (default by model width: 1e-3 below hidden size 512, 1e-4 "
                       "below 768, 3e-5 for base and wider)",
                       weight_decay="AdamW weight decay (0.01)", warmup_ratio="share of steps warming up (0.1)",
                       max_grad_norm="gradient clipping norm (1.0)")
    g.add_argument("--freeze-encoder", action="store_true", help="train the task head only")
    g.add_argument("--patience", type=int, help="stop after N epochs without a better eval score")
    g.add_argument("--seed", type=int)

    g = p.add_argument_group("execution")
    add_training_engine_arguments(g, explain_precision=True)
    g.add_argument("--eval-batch-size", type=int, help="windows per evaluation batch (64)")
    g.add_argument("--save-every", type=int,
                   help="steps between training states in OUT/checkpoints (200; the labelled tasks also "
                   "after each epoch)")
    add_run_arguments(g, resume="continue OUT from its training state (same per-step losses as one run)",
                      overwrite="replace the results in an existing OUT")

    g = p.add_argument_group("classify / pair")
    g.add_argument("--text-column", help="text column or JSONL key (text)")
    g.add_argument("--pair-column", help="pair: second text column (text_pair)")
    g.add_argument("--label-column", help="label column (label)")
    g.add_argument("--problem-type", choices=["regression", "single_label_classification"],
                   help="default: regression when a label is a non-integer number")
    g.add_argument("--eval-first-window", action="store_false", dest="eval_windows",
                   help="evaluation: score each text's first --max-length pieces only, as training "
                   "reads it (default: every window, probabilities averaged; BBC articles at 128 "
                   "pieces have ~7 windows each)")

    g = p.add_argument_group("ner")
    g.add_argument("--tokens-key", help="JSONL key of the words (tokens)")
    g.add_argument("--tags-key", help="JSONL key of the tags (tags)")
    g.add_argument("--ner-invalid", choices=["skip", "repair"],
                   help="sentences with broken BIO/BIOES: skip them (default) or read as conlleval")

    g = p.add_argument_group("qa")
    g.add_argument("--max-query-length", type=int, help="question pieces kept (64)")
    g.add_argument("--max-answer-length", type=int, help="longest answer in pieces (30)")
    g.add_argument("--n-best", type=int, help="candidate starts/ends per window (20)")
    g.add_argument("--null-score-diff-threshold", type=float,
                   help="v2: answer '' when null score - best span score exceeds this (0.0)")
    g.add_argument("--version-2-with-negative", action="store_true",
                   help="allow 'no answer' even if the training file is v1.1")

    g = p.add_argument_group("embed / rerank (retrieval)")
    g.add_argument("--pooling", choices=TRAINED_POOLINGS, help="embed: pooling (mean)")
    g.add_argument("--scale", type=float, help="embed: cosine × scale = logit (20, a temperature of 0.05)")
    g.add_argument("--hard-negatives", type=int, help="embed: a row's negatives per query in the batch (1)")
    g.add_argument("--negatives", type=int, help="rerank: negatives per positive (3)")
    g.add_argument("--mine", choices=["bm25", "biencoder", "none"],
                   help="rerank: where negatives beyond a row's own come from (bm25)")
    g.add_argument("--mine-model", help="rerank: bi-encoder dir for --mine biencoder")
    g.add_argument("--loss", choices=["listwise", "bce", "mnrl", "cached-mnrl", "cosent", "angle", "margin-mse", "kl"],
                   help="rerank: listwise (softmax over a query's positive and negatives; "
                   "--batch-size queries a step) or bce (per pair; --batch-size pairs) (listwise); "
                   "embed: mnrl (in-batch and hard negatives), cached-mnrl (the same by GradCache, "
                   "memory flat in --batch-size), cosent / angle (JSONL sentence1, sentence2, score), "
                   "margin-mse / kl (a --teacher's scores) (mnrl)")
    g.add_argument("--mini-batch-size", type=int, help="embed, cached-mnrl: texts embedded at a time (32)")
    g.add_argument("--matryoshka-dims", help="embed: the loss also on these prefixes of the embedding, "
                   "re-normalised, and the evaluation at each, e.g. 768,256,64")
    g.add_argument("--teacher", help="embed, margin-mse / kl: a cross-encoder directory whose scores of "
                   "every (query, passage) pair are the targets (cached in OUT/teacher_scores.json)")
    g.add_argument("--temperature", type=float, help="embed, kl: temperature of both softmaxes; colbert: "
                   "MaxSim / temperature = logit (1.0 both, sentence-transformers' and PyLate's)")

    g = p.add_argument_group("sparse (SPLADE, from a masked-LM model; also --hard-negatives, --mine bm25|none)")
    g.add_argument("--flops-query-weight", type=float,
                   help="sparse: λ_q of the FLOPS regulariser on queries (3e-4, SPLADE v2)")
    g.add_argument("--flops-doc-weight", type=float,
                   help="sparse: λ_d of the FLOPS regulariser on documents (1e-4, SPLADE v2)")
    g.add_argument("--flops-warmup-ratio", type=float,
                   help="sparse: share of the steps over which both λ rise quadratically from 0 (1/3)")

    g = p.add_argument_group("colbert (late interaction, PyLate's layout; also --hard-negatives, --mine bm25|none, "
                             "--max-length: document pieces)")
    g.add_argument("--query-length", type=int,
                   help="colbert: query pieces, [MASK]-padded (the model's own, else 32 as PyLate)")
    g.add_argument("--embedding-size", type=int,
                   help="colbert: token-vector size of a new projection (128, PyLate's)")
    g.add_argument("--distill-from", metavar="DIR",
                   help="colbert: a cross-encoder whose scores of each query's candidates the model learns "
                   "(KL, PyLate's Distillation loss) instead of the contrastive loss")

    g = p.add_argument_group("LoRA")
    g.add_argument("--lora", metavar="SPEC",
                   help="LoRA adapters instead of full fine-tuning, e.g. r=8,alpha=16,dropout=0.05,"
                   "targets=query,value (targets among query, key, value, attention.output, "
                   "intermediate, output); only the adapters and the head train")
    g.add_argument("--lora-save", choices=["merged", "adapters"],
                   help="with --lora: merged into a plain checkpoint (default) or PEFT adapter files "
                   "(adapter_config.json + adapter_model.safetensors)")
    p.set_defaults(func=_run_finetune)


def _run_finetune(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.finetune import finetune_settings, run_finetune

    # Under torchrun the ranks read and check the same inputs: rank 0 says it once, the others
    # only when something fails.
    main_rank = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(level=logging.INFO if main_rank else logging.ERROR, format="%(message)s")
    settings = config_settings(args, "dataset")
    if "dataset" in vars(args):
        settings["train"] = f"builtin:{args.dataset}"
    summary = run_finetune(finetune_settings(settings))
    if not main_rank:  # rank 0 reports the run
        return
    print(finetune_summary_line(summary, settings["out_dir"]))
    print(json.dumps(summary, ensure_ascii=False))


def finetune_summary_line(summary: dict, out_dir: str) -> str:
    """The human line before the JSON: where the model is, its epoch and its eval / test score
    (a run by epochs on labelled data), or its steps, loss and eval scores (a retrieval or SPLADE
    run, with a reranker's first stage beside its score)."""
    if "steps" in summary:
        return _steps_summary_line(summary, out_dir)
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


def _steps_summary_line(summary: dict, out_dir: str) -> str:
    scores = dict(summary.get("eval") or {})
    first = scores.pop("first_stage", None)
    line = (f"model saved in {out_dir} ({summary['steps']} steps, loss {summary['first_loss']:.4f} "
            f"→ {summary['last_loss']:.4f}); " + (f"eval {json.dumps(scores)}" if scores else
                                                 "no --eval set, so no score"))
    if first:  # the baseline beside the reranker's score: the candidates in the first stage's order
        line += f"; first stage ({first['name']}) mrr@10 {first['mrr@10']}, reranked {scores['mrr@10']}"
    return line


# ---------------------------------------------------------------------------------------------
# mine-negatives
# ---------------------------------------------------------------------------------------------
def _add_mine_negatives(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mine-negatives", help="add hard negatives to (query, positive) pairs for finetune --task embed",
                       description="For each query of a JSONL / TSV file of (query, positive) pairs, retrieve "
                       "from the file's positives with a bi-encoder (--model) or BM25 (--bm25), drop the "
                       "query's positives and, optionally, likely false negatives by a cross-encoder's "
                       "scores, and keep --num-negatives from the ranks --range-min..--range-max, as "
                       "sentence-transformers' mine_hard_negatives. OUT: JSONL rows {query, positive, "
                       "negatives} that `finetune --task embed` reads.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--input", required=True, dest="input_path", help="JSONL {query, positive} or TSV pairs")
    p.add_argument("--out", required=True, dest="out_path", help="JSONL output")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="bi-encoder directory that retrieves the candidates")
    source.add_argument("--bm25", action="store_true", help="retrieve the candidates with BM25 instead")
    p.add_argument("--cross-encoder", help="cross-encoder directory whose scores order and filter the candidates")
    p.add_argument("--num-negatives", type=int, help="negatives per query (3)")
    p.add_argument("--range-min", type=int, help="skip this many best candidates (0)")
    p.add_argument("--range-max", type=int, help="consider candidates up to this rank (range-min + "
                   "num-negatives + positives; × 10 for the negatives with a filter)")
    p.add_argument("--sampling", choices=["top", "random"], help="the best candidates, or drawn among them (top)")
    p.add_argument("--margin", type=float, help="drop candidates scoring above the positive minus this")
    p.add_argument("--relative-margin", type=float,
                   help="drop candidates scoring above positive − |positive| × this (0.05: NV-Retriever's 95%%)")
    p.add_argument("--max-score", type=float, help="drop candidates scoring above this")
    p.add_argument("--min-score", type=float, help="drop candidates scoring below this")
    p.add_argument("--seed", type=int, help="seed of --sampling random (42)")
    p.add_argument("--device", help="cpu | cuda (cpu)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_mine_negatives)


def _run_mine_negatives(args: argparse.Namespace) -> None:
    from bertkit.train.retrieval.mining import mine_file

    summary = mine_file(**config_settings(args))
    print(f"{summary['rows']} rows with {summary['negatives']} negatives written to {summary['out']}"
          + (f"; {summary['short_rows']} rows have fewer than asked" if summary["short_rows"] else ""))
    print(json.dumps(summary, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------------------------
def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="run a fine-tuned model over a file (one JSON line per input)",
                       description="Run a fine-tuned directory over a file, by its head: `bertkit "
                       "classify|ner|qa --input FILE --out FILE` with the task, lengths and columns "
                       "its finetune_config.json records (or --task for any fine-tuned BERT). Inputs: "
                       "classify/pair CSV/TSV/JSONL or .txt (a text a line; every window of a long "
                       "text read); ner CoNLL or JSONL words (tags per word) or .txt raw text "
                       "(entities with character offsets); qa SQuAD JSON, or JSONL/CSV/TSV rows of "
                       "question and context. Bad rows are named and skipped; --resume continues a "
                       "killed run.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--model", required=True, dest="model_dir",
                   help="fine-tuned model directory, a LoRA adapter dir (`finetune --lora-save adapters`; its "
                   "base from adapter_config.json), or the base model of --adapter")
    add_adapter_arguments(p, "a LoRA adapter dir run over --model, its base", model="--model")
    p.add_argument("--input", required=True, dest="input_path")
    p.add_argument("--input-format", dest="fmt", choices=["auto", "txt", "jsonl", "csv", "tsv", "conll", "squad"],
                   help="the input's format (default: by its suffix; .json is SQuAD)")
    p.add_argument("--out", required=True, dest="out_path", help="JSONL predictions")
    p.add_argument("--task", choices=LABELLED_TASKS)
    p.add_argument("--batch-size", type=int,
                   help="windows per batch: the engine's token budget is this × --max-length "
                   "(default: 8,192 tokens)")
    p.add_argument("--max-length", type=int, help="pieces per window (default: as fine-tuned)")
    p.add_argument("--doc-stride", type=int, help="pieces between window starts (default: as fine-tuned)")
    p.add_argument("--text-column", help="classify: text column (as fine-tuned); qa rows: question (question)")
    p.add_argument("--pair-column", help="pair: second text column (as fine-tuned); qa rows: context (context)")
    p.add_argument("--tokens-key", help="ner JSONL: the key of the word list (as fine-tuned)")
    p.add_argument("--null-score-diff-threshold", type=float,
                   help="qa, SQuAD 2.0 models: answer '' when the [CLS] score beats the best span's by "
                   "more than this (as fine-tuned: 0.0)")
    add_engine_arguments(p, explain_precision=True, device="auto")
    p.add_argument("--no-progress", action="store_false", dest="progress")
    p.add_argument("--resume", action="store_true", help="continue a killed run")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_predict)


def _run_predict(args: argparse.Namespace) -> None:
    from bertkit.adapters import is_adapter_dir
    from bertkit.inference.jobs import predict_file

    settings = config_settings(args, "adapter", "base")
    adapter, base = getattr(args, "adapter", None), getattr(args, "base", None)
    if adapter is not None or base is not None or is_adapter_dir(args.model_dir):
        from functools import partial

        from bertkit.adapters import open_engine, resolve

        base_dir, adapter_dir = resolve(args.model_dir, adapter, base)
        settings.update(model_dir=base_dir, adapter_dir=adapter_dir,
                        open_engine=partial(open_engine, base_dir, adapter=adapter_dir))
    print_file_job(predict_file(**settings))


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------
def _add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the built-in data sets, show one, or write one out as files",
                       description="Without arguments: list the built-in sets (at once: nothing is "
                       "built). With NAME: build it and show its split sizes and a first example. "
                       "With NAME and --out: write NAME.{train,dev,test}.jsonl (classification) or "
                       ".conll (NER), or the retrieval corpus and queries, into the directory, in "
                       "the formats `finetune` and `index` read.")
    p.add_argument("name", nargs="?", help="a set to show or write (see the list)")
    p.add_argument("--out", help="directory to write the set's files into")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_run_datasets)


def _run_datasets(args: argparse.Namespace) -> None:
    from bertkit.data import labelled
    from bertkit.retrieval.datasets import RETRIEVAL_SETS, load_retrieval, write_retrieval

    if args.name is None:
        # Names and descriptions only: counting a set means building it (seconds each).
        sets = [(name, info.task, info.description) for name, info in labelled.LABELLED_SETS.items()]
        sets += [(name, "retrieval", info.description) for name, info in RETRIEVAL_SETS.items()]
        width = max(len(name) for name, _, _ in sets)
        for name, task, description in sets:
            print(f"{name:{width}}  {task:9}  {description}")
        print("\n`bertkit datasets NAME` shows a set's sizes; add --out DIR to write its files")
        return
    if args.name not in RETRIEVAL_SETS and args.name not in labelled.LABELLED_SETS:
        raise ValueError(f"unknown built-in data set {args.name!r}; choose one of "
                         f"{', '.join([*labelled.LABELLED_SETS, *RETRIEVAL_SETS])} (`bertkit datasets` lists them)")
    if args.out:
        written = (write_retrieval(args.name, args.out, overwrite=args.overwrite) if args.name in RETRIEVAL_SETS
                   else labelled.write_labelled(args.name, args.out, overwrite=args.overwrite))
        for part, path in written.items():
            print(f"{part}: {path}")
        return
    if args.name in RETRIEVAL_SETS:
        data = load_retrieval(args.name)
        print(f"{args.name}: {RETRIEVAL_SETS[args.name].description}")
        print(f"corpus: {len(data.corpus)} documents")
        for split, queries in data.queries.items():
            print(f"{split}: {len(queries)} queries")
    else:
        info = labelled.labelled_set(args.name)
        print(f"{args.name}: {info.description} (task {info.task})")
        for split in labelled.SPLITS:
            print(f"{split}: {len(labelled.load_labelled(args.name, split))} examples")
    print(f"write it: bertkit datasets {args.name} --out DIR")
