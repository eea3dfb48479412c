"""Bi-encoder and cross-encoder training: inputs (bad rows named), both losses lower on a tiny
set, and the outputs load in sentence-transformers with the same vectors / scores as ours."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.train import retrieval as rt

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bad_rows_are_named_and_skipped(tmp_path, caplog):
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"query": "cat", "positive": "the cat runs", "negatives": ["a dog"]}\n'
                     '{"query": "dog"}\n' 'oops\n' '{"query": "x", "positive": "y", "negatives": "z"}\n'
                     '{"query": "car", "positive": "a red car"}\n', encoding="utf-8")
    pairs, report = rt.read_pairs(str(jsonl))
    assert [(p.query, p.negatives) for p in pairs] == [("cat", ["a dog"]), ("car", [])]
    assert report.n_skipped == 3
    assert all(f"pairs.jsonl:{n}" in caplog.text for n in (2, 3, 4))
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("query\tdocument\tlabel\ncat\tthe cat runs\t1\ncat\ta dog\t0\nbad row\n"
                   "car\ta red car\tyes\ncar\ta red car\t1\n", encoding="utf-8")
    pairs, report = rt.read_pairs(str(tsv))
    assert [(p.query, p.positive, p.negatives) for p in pairs] == [("cat", "the cat runs", ["a dog"]),
                                                                   ("car", "a red car", [])]
    assert report.n_skipped == 2 and "pairs.tsv:4" in caplog.text and "pairs.tsv:5" in caplog.text


def test_multiple_negatives_ranking_loss_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    d = torch.tensor([[1.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])  # two positives, one hard negative
    cos = torch.tensor([[1 / math.sqrt(2), 0.0, -1.0], [1 / math.sqrt(2), 1.0, 0.0]])
    logits = 20 * cos
    expected = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    assert rt.multiple_negatives_ranking_loss(q, d, 20.0).item() == pytest.approx(expected.item(), rel=1e-5)


def _pairs_file(path: Path, n: int = 24) -> Path:
    texts = sentences(n, seed=11)
    path.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t}) + "\n"
                            for t in texts), encoding="utf-8")
    return path


def _mean_loss(steps_file: Path, epoch: int) -> float:
    rows = [json.loads(line) for line in steps_file.read_text().splitlines()]
    return float(np.mean([r["loss"] for r in rows if r["epoch"] == epoch]))


def test_bi_encoder_trains_and_loads_in_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    from bertkit.inference import embed

    base = tiny_encoder(tmp_path / "base")
    out = tmp_path / "bi"
    summary = rt.finetune_retrieval(task="embed", model=str(base), train=str(_pairs_file(tmp_path / "p.jsonl")),
                                    out_dir=str(out), epochs=4, batch_size=8, lr=1e-3, progress=False,
                                    max_length=24, eval=str(tmp_path / "p.jsonl"))
    assert _mean_loss(out / "steps.jsonl", 4) < _mean_loss(out / "steps.jsonl", 1)
    assert summary["eval"]["mrr@10"] > 0
    texts = ["the cat sees a red ball", "market price rises"]
    ours = embed(out, texts).numpy()
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)


def test_cls_pooling_writes_cls_for_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    from bertkit.inference import embed

    out = tmp_path / "bi"
    rt.finetune_retrieval(task="embed", model=str(tiny_encoder(tmp_path / "base")), pooling="cls",
                          train=str(_pairs_file(tmp_path / "p.jsonl", 8)), out_dir=str(out),
                          batch_size=4, progress=False, max_length=24)
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_cls_token"]
    texts = ["a dog jumps over the tree"]
    np.testing.assert_allclose(embed(out, texts).numpy(),
                               SentenceTransformer(str(out), device="cpu").encode(texts), atol=1e-5)


@pytest.mark.parametrize("loss, batch_size", [("bce", 16), ("listwise", 6)])
def test_cross_encoder_trains_with_bm25_negatives_and_loads_in_sentence_transformers(tmp_path, loss,
                                                                                    batch_size):
    from sentence_transformers import CrossEncoder

    from bertkit.inference import rerank
    from bertkit.retrieval.search import load_reranker

    base = tiny_encoder(tmp_path / "base")  # an encoder without a head: the head starts fresh
    out = tmp_path / "ce"
    summary = rt.finetune_retrieval(task="rerank", model=str(base), train=str(_pairs_file(tmp_path / "p.jsonl")),
                                    out_dir=str(out), epochs=4, batch_size=batch_size, lr=1e-3,
                                    negatives=2, loss=loss, progress=False, max_length=32)
    assert summary["train_examples"] == 24 * 3  # each positive with 2 mined negatives
    assert summary["steps"] == 4 * math.ceil(24 * (3 if loss == "bce" else 1) / batch_size)
    # (No loss check here: a query's first two words against BM25's negatives, which share them,
    # is beyond a random 2-layer model in 16 steps; test_rerank_losses_learn has a learnable set.)
    # Pairs are scored at the length they were trained at, by us and by sentence-transformers.
    assert load_reranker(out).max_length == 32
    model = CrossEncoder(str(out), device="cpu")
    assert model.max_seq_length == 32
    docs = ["the cat sees a red ball", "market price rises", "a dog"]
    ours = rerank(out, "the cat", docs)
    theirs = model.predict([("the cat", d) for d in docs])
    got = [0.0] * len(docs)
    for row in ours:
        got[row["index"]] = row["score"]
    np.testing.assert_allclose(got, theirs, atol=1e-5)


@pytest.mark.parametrize("loss, batch_size, epochs", [("bce", 16, 16), ("listwise", 6, 8)])
def test_rerank_losses_learn(tmp_path, loss, batch_size, epochs):
    """Relevance a tiny model can learn (every positive ends in "music", no negative has it):
    each loss must fall far below its start, not merely wobble below it."""
    base = tiny_encoder(tmp_path / "base")
    texts = [t for t in sentences(400, seed=11) if "music" not in t.split()][:72]
    rows = [{"query": " ".join(t.split()[:2]), "positive": f"{t} music",
             "negatives": [texts[24 + 2 * i], texts[25 + 2 * i]]} for i, t in enumerate(texts[:24])]
    train = tmp_path / "p.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "ce"
    rt.finetune_retrieval(task="rerank", model=str(base), train=str(train), out_dir=str(out), epochs=epochs,
                          batch_size=batch_size, lr=1e-2, negatives=2, loss=loss, progress=False, max_length=32)
    first, last = _mean_loss(out / "steps.jsonl", 1), _mean_loss(out / "steps.jsonl", epochs)
    assert last < 0.3 * first, (first, last)


def test_listwise_loss_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.5, 3.0, -9.0]])  # column 0: each query's positive
    mask = torch.tensor([[True, True, True], [True, True, False]])  # query 2 has one negative
    expected = -(torch.log_softmax(logits[0], 0)[0] + torch.log_softmax(logits[1, :2], 0)[0]) / 2
    assert rt.listwise_loss(logits, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    # A positive far above its negatives costs ~0; the masked logit (-9) never counts.
    assert rt.listwise_loss(torch.tensor([[30.0, 0.0, 0.0]])).item() < 1e-6


def test_rerank_negatives_are_drawn_afresh_from_a_row_pool():
    import random

    config = rt.RetrievalTrainConfig(task="rerank", model="m", train="t", out_dir="o", negatives=2,
                                     mine="none")
    own = [f"negative {i}" for i in range(10)]
    groups = rt.rerank_groups([rt.Pair("q", "pos", own, "f:1")], config)
    rng = random.Random(0)
    epochs = [rt.rerank_epoch(groups, config, rng)[0] for _ in range(6)]
    assert all(e[:2] == ("q", "pos") and len(e[2]) == 2 and set(e[2]) <= set(own) for e in epochs)
    assert len({tuple(e[2]) for e in epochs}) > 1  # not the same two every epoch
    bce = dataclasses.replace(config, loss="bce")
    assert [r[2] for r in rt.rerank_epoch(groups, bce, rng)] == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="no query has a negative"):
        rt.rerank_epoch(rt.rerank_groups([rt.Pair("q", "pos", [], "f:1")], config), config, rng)
    with pytest.raises(ValueError, match="loss must be one of"):
        rt.RetrievalTrainConfig(task="rerank", model="m", train="t", out_dir="o", loss="hinge")


def test_bm25_by_hand():
    from bertkit.retrieval.bm25 import BM25, tokenize

    docs = ["the cat sat", "the dog", "cat cat cat"]
    bm = BM25.fit(docs, k1=1.5, b=0.75)
    avg = 8 / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # "cat" is in 2 of 3 documents

    def term(tf, length):
        return idf * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * length / avg))

    np.testing.assert_allclose(bm.scores("cat"), [term(1, 3), 0.0, term(3, 3)], rtol=1e-5)
    assert bm.top_k("cat", 2) == [2, 0]
    assert tokenize("人民日报 News!") == ["人民", "民日", "日报", "news"]


def test_finetune_cli_task_embed(tmp_path, capsys):
    from bertkit import cli

    base = tiny_encoder(tmp_path / "base")
    status = cli.main(["finetune", "--task", "embed", "--model", str(base), "--train",
                       str(_pairs_file(tmp_path / "p.jsonl", 8)), "--out", str(tmp_path / "bi"),
                       "--batch-size", "4", "--max-length", "24", "--no-progress", "--scale", "10"])
    assert status == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "bi" / "finetune_config.json").read_text())["scale"] == 10
    assert (tmp_path / "bi" / "modules.json").is_file()
    status = cli.main(["finetune", "--task", "rerank", "--model", str(base), "--train",
                       str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "bi"), "--no-progress"])
    assert status == 2 and "--overwrite" in capsys.readouterr().err
    status = cli.main(["finetune", "--task", "rerank", "--model", str(base), "--train",
                       str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "ce"), "--no-progress",
                       "--loss", "bce", "--negatives", "1", "--max-length", "20", "--epochs", "1"])
    assert status == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "ce" / "finetune_config.json").read_text())
    assert (saved["loss"], saved["negatives"], saved["lr"]) == ("bce", 1, rt.RERANK_LR)


def test_builtin_retrieval_sets_are_fixed_and_disjoint():
    from bertkit.retrieval.datasets import load_retrieval

    data = load_retrieval("en-news-retrieval")
    sizes = {s: len(q) for s, q in data.queries.items()}
    assert sizes["train"] > 1500 and sizes["test"] > 150
    relevant = {s: {d for q in data.queries[s] for d in q.relevant} for s in data.queries}
    assert not relevant["train"] & relevant["test"]
    first = data.queries["test"][0]
    assert data.corpus[first.relevant[0]] == first.positive
    assert set().union(*relevant.values()) == set(data.corpus)  # every body is in the corpus
