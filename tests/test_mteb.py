"""bertkit.mteb: an encoder mteb.evaluate runs, on tasks built from local data (no hub), giving
the figures `bertkit eval` gives on the same data."""

from __future__ import annotations

import json
import sys

import pytest

import bertkit
from test_evaluation import CORPUS, FAST, QRELS, QUERIES, STS_ROWS, one_thread, write_beir  # noqa: F401 (a fixture)

from retrieval_fixtures import tiny_cross_encoder


def test_without_mteb_the_extra_is_named(monkeypatch, minilm_dir):
    from bertkit.mteb import Encoder

    monkeypatch.setitem(sys.modules, "mteb", None)  # as if not installed: find_spec gives None
    with pytest.raises(ValueError, match=r"pip install 'bertkit\[mteb\]'"):
        Encoder(minilm_dir)


mteb = pytest.importorskip("mteb", reason="mteb is an optional extra: pip install 'bertkit[mteb]'")

from datasets import Dataset, DatasetDict  # noqa: E402  (mteb brings datasets)
from mteb.abstasks.classification import AbsTaskClassification  # noqa: E402
from mteb.abstasks.pair_classification import AbsTaskPairClassification  # noqa: E402
from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402

from bertkit.mteb import CrossEncoder, Encoder  # noqa: E402

# What TaskMetadata requires of a task; only name, type and main_score matter to the scores.
ABOUT = dict(description="a task built from local data", reference="https://github.com/embeddings-benchmark/mteb",
             dataset={"path": "local", "revision": "local"}, category="t2t", eval_splits=["test"],
             eval_langs=["eng-Latn"], date=("2026-01-01", "2026-01-01"), dialect=[], domains=[], task_subtypes=[],
             license="cc-by-4.0", annotations_creators="derived", modalities=["text"], sample_creation="found",
             bibtex_citation="")


def local_task(base: type, name: str, task_type: str, main_score: str, dataset, **attributes):
    """An MTEB task whose data is `dataset`, in memory: `load_data` only hands it over."""

    def load_data(self, **kwargs):
        self.dataset = dataset
        self.data_loaded = True

    metadata = TaskMetadata(name=name, type=task_type, main_score=main_score, **ABOUT)
    return type(name, (base,), {"metadata": metadata, "load_data": load_data, **attributes})()


def run_mteb(model: Encoder, task) -> dict:
    result = mteb.evaluate(model, task, cache=None, show_progress_bar=False)
    return result.task_results[0].scores["test"][0]


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    return Encoder(minilm_dir, prompts={"query": "query: ", "STS": "sts: "}, **FAST)


def beir_split(top_ranked=None) -> RetrievalSplitData:
    return RetrievalSplitData(
        corpus=Dataset.from_list([{"id": k, "title": t, "text": x} for k, (t, x) in CORPUS.items()]),
        queries=Dataset.from_list([{"id": k, "text": v} for k, v in QUERIES.items()]),
        relevant_docs={q: {d: g for qq, d, g in QRELS if qq == q} for q in dict.fromkeys(q for q, _, _ in QRELS)},
        top_ranked=top_ranked)


def assert_same_retrieval_figures(ours: dict, theirs: dict) -> None:
    """MTEB rounds nDCG, MAP and recall to 5 decimals (its MRR it does not)."""
    assert ours["mrr@10"] == pytest.approx(theirs["mrr_at_10"], abs=1e-12)
    for name, their_name in (("ndcg@10", "ndcg_at_10"), ("recall@100", "recall_at_100"), ("map", "map_at_1000")):
        assert round(ours[name], 5) == theirs[their_name], name
    assert 0 < ours["map"] < 1  # not a trivial run


def test_retrieval_equals_bertkit_eval(encoder, minilm_dir, tmp_path):
    root = write_beir(tmp_path / "toy", CORPUS, QUERIES, QRELS)
    theirs = run_mteb(encoder, local_task(AbsTaskRetrieval, "toy", "Retrieval", "ndcg_at_10",
                                          {"default": {"test": beir_split()}}))
    ours = bertkit.evaluate(minilm_dir, beir=root, prompts=encoder.encoder.prompts, **FAST)
    assert ours["prompts"] == {"query": "query: ", "document": ""}
    assert_same_retrieval_figures(ours["scores"], theirs)


def test_reranking_equals_bertkit_eval(encoder, minilm_dir, tmp_path):
    root = write_beir(tmp_path / "toy", CORPUS, QUERIES, QRELS)
    candidates = {q: ["d8", "d6", "d4", "d2", "d1"] for q in QUERIES}
    run = tmp_path / "first.run"
    run.write_text("".join(f"{q} Q0 {d} {r + 1} {5 - r} first\n" for q, found in candidates.items()
                           for r, d in enumerate(found)), encoding="utf-8")
    theirs = run_mteb(encoder, local_task(AbsTaskRetrieval, "toy", "Reranking", "map_at_1000",
                                          {"default": {"test": beir_split(candidates)}}))
    ours = bertkit.evaluate(minilm_dir, beir=root, candidates=run, prompts=encoder.encoder.prompts, **FAST)
    assert ours["task"] == "reranking"
    assert_same_retrieval_figures(ours["scores"], theirs)


def test_cross_encoder_reranking_equals_bertkit_eval(tmp_path):
    ce = tiny_cross_encoder(tmp_path / "ce")
    root = write_beir(tmp_path / "toy", CORPUS, QUERIES, QRELS)
    candidates = {q: ["d8", "d6", "d4", "d2", "d1", "d3"] for q in QUERIES}
    run = tmp_path / "first.run"
    run.write_text("".join(f"{q} Q0 {d} {r + 1} {6 - r} first\n" for q, found in candidates.items()
                           for r, d in enumerate(found)), encoding="utf-8")
    theirs = run_mteb(CrossEncoder(ce), local_task(AbsTaskRetrieval, "toy", "Reranking", "map_at_1000",
                                                   {"default": {"test": beir_split(candidates)}}))
    ours = bertkit.evaluate(ce, beir=root, candidates=run)
    assert ours["task"] == "reranking"
    assert_same_retrieval_figures(ours["scores"], theirs)


def test_sts_and_pair_classification_equal_bertkit_eval(encoder, minilm_dir, tmp_path):
    sts = tmp_path / "toy-sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in STS_ROWS),
                   encoding="utf-8")
    data = DatasetDict({"test": Dataset.from_dict({"sentence1": [r[0] for r in STS_ROWS],
                                                   "sentence2": [r[1] for r in STS_ROWS],
                                                   "score": [r[2] for r in STS_ROWS]})})
    theirs = run_mteb(encoder, local_task(AbsTaskSTS, "toy-sts", "STS", "cosine_spearman", data,
                                          min_score=0, max_score=5))
    ours = bertkit.evaluate(minilm_dir, sts=sts, prompts=encoder.encoder.prompts, **FAST)
    assert ours["prompts"] == {"text": "sts: "}
    assert ours["scores"]["spearman"] == pytest.approx(theirs["cosine_spearman"], abs=1e-12)
    assert ours["scores"]["pearson"] == pytest.approx(theirs["cosine_pearson"], abs=1e-6)  # gold rescaled there
    labels = [int(r[2] > 3.5) for r in STS_ROWS]
    pairs = tmp_path / "toy-pairs.jsonl"
    pairs.write_text("".join(json.dumps({"sentence1": r[0], "sentence2": r[1], "label": y}) + "\n"
                             for r, y in zip(STS_ROWS, labels)), encoding="utf-8")
    data = DatasetDict({"test": Dataset.from_dict({"sentence1": [r[0] for r in STS_ROWS],
                                                   "sentence2": [r[1] for r in STS_ROWS], "labels": labels})})
    theirs = run_mteb(encoder, local_task(AbsTaskPairClassification, "toy-pairs", "PairClassification",
                                          "max_ap", data))
    ours = bertkit.evaluate(minilm_dir, pairs=pairs, prompts=encoder.encoder.prompts, **FAST)
    for name in ("accuracy", "f1", "precision", "recall", "ap"):
        assert ours["scores"][name] == pytest.approx(theirs[f"cosine_{name}"], abs=1e-12), name


def test_classification_equals_bertkit_eval(encoder, minilm_dir, tmp_path):
    from bertkit.data.labelled import load_labelled

    # en-news: 60 training articles, 25 test articles, MTEB's protocol at 4 texts a label, 3 runs.
    train = load_labelled("en-news", "train")[:60]
    test = load_labelled("en-news", "test")[:25]
    names = sorted({e.label for e in train + test})
    files = {}
    for split, rows in (("train", train), ("test", test)):
        files[split] = tmp_path / f"news-{split}.jsonl"
        files[split].write_text("".join(json.dumps({"text": e.text, "label": str(names.index(e.label))}) + "\n"
                                        for e in rows), encoding="utf-8")
    data = DatasetDict({split: Dataset.from_dict({"text": [e.text for e in rows],
                                                  "label": [names.index(e.label) for e in rows]})
                        for split, rows in (("train", train), ("test", test))})
    theirs = run_mteb(encoder, local_task(AbsTaskClassification, "news-test", "Classification", "accuracy", data,
                                          samples_per_label=4, n_experiments=3))
    ours = bertkit.evaluate(minilm_dir, classification=(files["train"], files["test"]), samples_per_label=4,
                            experiments=3, prompts=encoder.encoder.prompts, **FAST)
    for name in ("accuracy", "f1", "f1_weighted", "precision", "recall"):
        assert ours["scores"][name] == pytest.approx(theirs[name], abs=1e-12), name
    assert 0.2 < ours["scores"]["accuracy"] < 1  # better than chance (5 topics), not trivially perfect


def test_encoder_meets_the_protocol(encoder):
    from mteb.models.models_protocols import EncoderProtocol

    assert isinstance(encoder, EncoderProtocol)
    assert encoder.mteb_model_meta.name == "bertkit/model"
    assert encoder.mteb_model_meta.embed_dim == 384
