"""`evaluate`: one model on one evaluation set, figures out as a dict (what `bertkit eval --json`
prints)."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from bertkit.adapters import is_adapter_dir, open_engine, resolve
from bertkit.evaluation import data as sets
from bertkit.evaluation.classification import EXPERIMENTS, MTEB_SEED, SAMPLES_PER_LABEL, classification_scores
from bertkit.evaluation.encoder import TextEncoder, cosine_pairs
from bertkit.evaluation.pairs import pair_classification_scores, sts_scores
from bertkit.evaluation.retrieval import (
    as_run,
    bi_encoder_scorer,
    bm25_candidates,
    candidates_of,
    cross_encoder_scorer,
    dense_run,
    rerank_run,
    score_run,
)
from bertkit.inference import Engine

KINDS = ("beir", "sts", "pairs", "classification", "builtin")
MAIN_SCORES = {"Retrieval": "ndcg@10", "Reranking": "ndcg@10", "STS": "spearman",
               "PairClassification": "ap", "Classification": "accuracy"}
FIRST_STAGE_DEPTH = 100  # candidates a reranker orders: BEIR's reranking depth


def evaluate(model: str | os.PathLike | Engine, *, beir: str | os.PathLike | None = None,
             sts: str | os.PathLike | None = None, pairs: str | os.PathLike | None = None,
             classification: Sequence[str | os.PathLike] | None = None, builtin: str | None = None,
             split: str = "test", candidates: str | os.PathLike | None = None, first_stage: str | None = None,
             top_k: int = FIRST_STAGE_DEPTH, prompts: Mapping[str, str] | None = None, task_name: str | None = None,
             samples_per_label: int = SAMPLES_PER_LABEL, experiments: int = EXPERIMENTS, seed: int = MTEB_SEED,
             adapter: str | os.PathLike | None = None, base: str | os.PathLike | None = None,
             **engine_options: Any) -> dict[str, Any]:
    """Score `model` on one evaluation set; give exactly one of:

    beir: a BEIR directory (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv): retrieval over the
      whole corpus for an embedding model; reranking for a cross-encoder (one relevance output) of
      the `top_k` candidates of `first_stage` ("bm25", the default, or a bi-encoder directory) or
      of `candidates` (a TREC run file). A bi-encoder given `first_stage` or `candidates` reranks
      them by cosine (MTEB's reranking tasks).
    sts: a file of sentence1, sentence2, score: Spearman of the cosine.
    pairs: a file of sentence1, sentence2, label (0 / 1): pair classification by cosine thresholds.
    classification: (train file, test file) of text, label: MTEB's logistic regression on the
      embeddings, `samples_per_label` texts a label, `experiments` runs, `seed`.
    builtin: a built-in set's name: a retrieval set (en-news-retrieval, ...) as `beir`, a
      labelled one (en-news, zh-sentiment) as `classification` on its train and `split`.

    prompts: prompt texts by MTEB's keys ("query", "document", "Retrieval-query", "STS", a task
    name ...; `evaluation.encoder`), replacing the model's own. task_name: the name those keys
    match (default: the directory's or file's name, the built-in set's). engine_options go to
    `Engine.load` (precision, device, max_length, max_batch_tokens, ...).

    model may be a LoRA adapter directory (run over its base: adapter_config.json's, or `base`),
    or the base of `adapter` (`bertkit.adapters.resolve`); an embedding adapter is scored as an
    embedding model, a rerank adapter as a cross-encoder.

    Returns {"task", "task_type", "data", "split", "model", "precision", "scores", "main_score",
    counts, "prompts" used, "seconds"}; reranking adds the first stage's own "first_stage" scores.
    An adapter adds "adapter", its directory.
    """
    given = {kind: value for kind, value in zip(KINDS, (beir, sts, pairs, classification, builtin))
             if value is not None}
    if len(given) != 1:
        raise ValueError(f"give one evaluation set ({', '.join(KINDS)}); got "
                         f"{', '.join(given) if given else 'none'}")
    if top_k < 1:
        raise ValueError(f"top_k must be positive, got {top_k}")
    adapter_dir = None
    if not isinstance(model, Engine) and (adapter is not None or base is not None or is_adapter_dir(model)):
        _, adapter_dir = resolve(model, adapter, base)
        model = open_engine(model, adapter=adapter, base=base, **engine_options)
    [(kind, source)] = given.items()
    if kind == "builtin":
        kind = "beir" if sets.builtin_kind(source) == "retrieval" else "classification"
    if (candidates or first_stage) and kind != "beir":
        raise ValueError("candidates and first_stage rerank a retrieval set; pass a BEIR directory or a "
                         "built-in retrieval set")
    start = time.perf_counter()
    if kind == "beir":
        data = (sets.builtin_retrieval(source, split) if builtin else sets.read_beir(source, split))
        data.name = task_name or data.name
        out = _retrieval(model, data, candidates, first_stage, top_k, prompts, engine_options)
    elif kind in ("sts", "pairs"):
        pair_data = sets.read_pairs(source, "score" if kind == "sts" else "label")
        out = _pairs(model, pair_data, kind, task_name or pair_data.name, prompts, engine_options)
    else:
        if builtin:
            name, train, test = sets.classification_splits(source, split=split)
        else:
            if isinstance(source, (str, os.PathLike)) or len(source) != 2:
                raise ValueError(f"classification takes (train file, test file), got {source!r}")
            name, train, test = sets.classification_splits(train=source[0], test=source[1])
        out = _classification(model, task_name or name, train, test, prompts, engine_options,
                              samples_per_label=samples_per_label, experiments=experiments, seed=seed)
    if builtin:
        data_name = f"builtin:{builtin}"
    else:
        data_name = " ".join(map(str, source)) if kind == "classification" else str(source)
    return {"data": data_name, "split": split if kind == "beir" or builtin else None,
            **out, **({"adapter": str(adapter_dir)} if adapter_dir is not None else {}),
            "main_score": MAIN_SCORES[out["task_type"]], "seconds": round(time.perf_counter() - start, 2)}


def is_cross_encoder(model: str | os.PathLike | Engine) -> bool:
    """Whether `model` is a cross-encoder: a sequence classifier with one relevance output."""
    from bertkit.encoder import tasks
    from bertkit.encoder.config import BertConfig
    from bertkit.util.fileio import model_directory

    if isinstance(model, Engine):
        return model.use == "rerank"
    directory = model_directory(model)
    return tasks.use_of(directory) == "classify" and tasks.is_cross_encoder(BertConfig.from_json(directory))


def _described(model: Any, engine: Engine) -> dict[str, Any]:
    return {"model": str(engine.model_dir or model), "precision": engine.precision}


def _encoder(model: Any, prompts: Mapping[str, str] | None, engine_options: dict[str, Any]) -> TextEncoder:
    if is_cross_encoder(model):
        raise ValueError(f"{model} is a cross-encoder (one relevance output); this evaluation embeds "
                         "texts: pass an embedding model, or a BEIR directory to rerank")
    return TextEncoder.load(model, prompts=prompts, **engine_options)


def _retrieval(model: Any, data: sets.RetrievalData, candidates: Any, first_stage: str | None, top_k: int,
               prompts: Mapping[str, str] | None, engine_options: dict[str, Any]) -> dict[str, Any]:
    counts = {"queries": len(data.qrels), "documents": len(data.corpus),
              **({"unanswerable_queries": data.unanswerable} if data.unanswerable else {}),
              **({"skipped": data.skipped} if data.skipped else {})}
    cross = is_cross_encoder(model)
    if not cross and candidates is None and first_stage is None:
        encoder = TextEncoder.load(model, prompts=prompts, **engine_options)
        run = dense_run(encoder, data)
        return {"task": "retrieval", "task_type": "Retrieval", **_described(model, encoder.engine),
                "scores": score_run(run, data), **counts, "prompts": _prompts(encoder, data.name, "Retrieval")}
    if candidates is not None:
        if first_stage is not None:
            raise ValueError("give candidates (a run file) or first_stage, not both")
        found = sets.read_run(candidates, data, top_k)
        stage = f"{candidates} top {top_k}"
    elif first_stage in (None, "bm25"):
        found = bm25_candidates(data, top_k)
        stage = f"BM25 top {top_k}"
    else:
        first = _encoder(first_stage, None, engine_options)
        found = candidates_of(dense_run(first, data, "Retrieval", top_k), top_k)
        stage = f"{first_stage} top {top_k}"
    if cross:
        from bertkit.retrieval.search import load_reranker

        options = {k: v for k, v in engine_options.items() if v is not None}
        engine = model if isinstance(model, Engine) else load_reranker(model, **options)
        run = rerank_run(found, cross_encoder_scorer(engine, data))
        used: dict[str, str] = {}
    else:
        encoder = TextEncoder.load(model, prompts=prompts, **engine_options)
        engine = encoder.engine
        run = rerank_run(found, bi_encoder_scorer(encoder, data, found))
        used = _prompts(encoder, data.name, "Reranking")
    return {"task": "reranking", "task_type": "Reranking", **_described(model, engine),
            "scores": score_run(run, data), "first_stage": {"name": stage, **score_run(as_run(found), data)},
            **counts, "prompts": used}


def _prompts(encoder: TextEncoder, name: str, task_type: str, sides: Sequence[str | None] = ("query", "document")):
    return {side or "text": encoder.prompt(name, task_type, side) for side in sides}


def _pairs(model: Any, data: sets.PairData, kind: str, name: str, prompts: Mapping[str, str] | None,
           engine_options: dict[str, Any]) -> dict[str, Any]:
    encoder = _encoder(model, prompts, engine_options)
    task_type = "STS" if kind == "sts" else "PairClassification"
    prompt = encoder.prompt(name, task_type)
    cosines = cosine_pairs(encoder.encode(data.first, prompt), encoder.encode(data.second, prompt))
    scores = sts_scores(cosines, data.gold) if kind == "sts" else pair_classification_scores(cosines, data.gold)
    return {"task": "sts" if kind == "sts" else "pair-classification", "task_type": task_type,
            **_described(model, encoder.engine), "scores": scores, "pairs": len(data.gold),
            **({"skipped": data.skipped} if data.skipped else {}), "prompts": {"text": prompt}}


def _classification(model: Any, name: str, train: list, test: list, prompts: Mapping[str, str] | None,
                    engine_options: dict[str, Any], **protocol: int) -> dict[str, Any]:
    from bertkit.evaluation.classification import need_sklearn

    need_sklearn()  # before the model loads and the texts are embedded
    encoder = _encoder(model, prompts, engine_options)
    prompt = encoder.prompt(name, "Classification")
    scores = classification_scores(lambda texts: encoder.encode(texts, prompt), [e.text for e in train],
                                   [e.label for e in train], [e.text for e in test], [e.label for e in test],
                                   **protocol)
    return {"task": "classification", "task_type": "Classification", **_described(model, encoder.engine),
            "scores": scores, "train": len(train), "test": len(test), **protocol, "prompts": {"text": prompt}}

