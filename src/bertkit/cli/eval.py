"""bertkit eval: a model's figures on a BEIR directory, an STS or pair file, a classification
split, or a built-in set (`bertkit.evaluate`)."""

from __future__ import annotations

import argparse
import json

from bertkit.cli.common import BATCH_TOKENS_HELP, add_adapter_arguments, add_engine_arguments


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score a model: BEIR retrieval / reranking, STS, pair and text classification",
                       description="Score MODEL as the embedding benchmarks do: retrieval on a BEIR "
                       "directory (nDCG@10, MRR@10, Recall@100, MAP, equal to pytrec_eval's), reranking "
                       "(a cross-encoder over a first stage's candidates), STS (Spearman of the cosine), "
                       "pair classification (cosine thresholds, MTEB's) and text classification (MTEB's "
                       "logistic regression on the embeddings), or a built-in set.")
    p.add_argument("model", help="model dir: an embedding model, or a cross-encoder to rerank; or a LoRA "
                   "adapter dir of either (its base from adapter_config.json), or the base of --adapter")
    add_adapter_arguments(p, "a LoRA adapter dir run over MODEL, its base")
    g = p.add_argument_group("the evaluation set (one)").add_mutually_exclusive_group(required=True)
    g.add_argument("--beir", metavar="DIR", help="BEIR directory: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv")
    g.add_argument("--sts", metavar="FILE", help="CSV / TSV / JSONL of sentence1, sentence2, score")
    g.add_argument("--pairs", metavar="FILE", help="CSV / TSV / JSONL of sentence1, sentence2, label (0 or 1)")
    g.add_argument("--classification", nargs=2, metavar=("TRAIN", "TEST"),
                   help="CSV / TSV / JSONL files of text, label")
    g.add_argument("--builtin", metavar="NAME", help="a built-in set: en-news-retrieval, zh-news-retrieval, "
                   "en-news-deep (retrieval), en-news, zh-sentiment (classification)")
    p.add_argument("--split", default="test", help="qrels/SPLIT.tsv of a BEIR directory, a built-in set's split (test)")
    g = p.add_argument_group("reranking")
    g.add_argument("--first-stage", default=None, metavar="bm25|DIR",
                   help="candidates to rerank: BM25's (a cross-encoder's default) or a bi-encoder's")
    g.add_argument("--candidates", default=None, metavar="RUN",
                   help="candidates to rerank from a TREC run file (qid Q0 docid rank score tag)")
    g.add_argument("--top-k", type=int, default=100, help="candidates reranked per query (100)")
    g = p.add_argument_group("prompts and protocol")
    g.add_argument("--prompt", action="append", default=None, metavar="KEY=TEXT",
                   help="a prompt by MTEB's keys: query, document, a task type (Retrieval, STS, ...) or "
                   "name, optionally -query / -document; repeat for several; replaces the model's own")
    g.add_argument("--task-name", default=None, help="the name --prompt keys match (default: the data's name)")
    g.add_argument("--samples-per-label", type=int, default=8, help="classification: training texts a label (8)")
    g.add_argument("--experiments", type=int, default=10, help="classification: runs averaged (10)")
    g.add_argument("--seed", type=int, default=42, help="classification: MTEB's seed (42)")
    add_engine_arguments(p, explain_precision=True, max_batch_tokens_help=BATCH_TOKENS_HELP,
                         max_length_help="pieces per text (the model's limit)")
    p.add_argument("--json", action="store_true", help="the figures as one JSON object")
    p.set_defaults(func=_run_eval)


def _prompts(pairs: list[str] | None) -> dict[str, str] | None:
    if pairs is None:
        return None
    out = {}
    for item in pairs:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--prompt {item!r}: write KEY=TEXT, e.g. --prompt 'query=query: '")
        out[key] = text
    return out


def _run_eval(args: argparse.Namespace) -> None:
    from bertkit.evaluation import evaluate

    result = evaluate(args.model, beir=args.beir, sts=args.sts, pairs=args.pairs,
                      classification=args.classification, builtin=args.builtin, split=args.split,
                      candidates=args.candidates, first_stage=args.first_stage, top_k=args.top_k,
                      prompts=_prompts(args.prompt), task_name=args.task_name,
                      samples_per_label=args.samples_per_label, experiments=args.experiments, seed=args.seed,
                      adapter=args.adapter, base=args.base,
                      precision=args.precision, device=args.device, max_length=args.max_length,
                      max_batch_tokens=args.max_batch_tokens)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    print(summary_line(result))
    first = result.get("first_stage")
    if first:
        print(f"  {'':<12}{'reranked':>10}  {first['name']}")
    for name, value in result["scores"].items():
        baseline = f"  {first[name]:.4f}" if first else ""
        print(f"  {name:<12}{value:>10.4f}{baseline}")


def summary_line(result: dict) -> str:
    """What was scored, on how much, how: one line above the figures."""
    counts = {"queries": "queries", "documents": "documents", "pairs": "pairs", "train": "train texts",
              "test": "test texts"}
    said = ", ".join(f"{result[key]:,} {word}" for key, word in counts.items() if key in result)
    split = f", {result['split']} split" if result.get("split") else ""
    prompts = {side: text for side, text in result.get("prompts", {}).items() if text}
    prompted = ("; prompts " + ", ".join(f"{side} {text!r}" for side, text in prompts.items())) if prompts else ""
    return (f"{result['task']} on {result['data']}{split}: {said} ({result['precision']}, "
            f"{result['seconds']:.1f} s{prompted})")
