"""The sparse (SPLADE) side of an index: its inverted index against brute-force dot products of
`embed_sparse`, search --sparse, three-way hybrid fusion, updates, and the models it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertkit.encoder.model import BertForMaskedLM
from bertkit.inference.sparse import embed_sparse
from bertkit.retrieval.bm25 import BM25
from bertkit.retrieval.fusion import rrf, zscore
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.search import Searcher
from bertkit.retrieval.sparse import SparseIndex, build_sparse, postings
from bertkit.retrieval.update import update_index

from model_fixtures import save_tiny
from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder, tiny_mlm, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    docs = [". ".join(s.capitalize() for s in sentences(3 + i % 5, seed=i)) + "." for i in range(40)]
    corpus = write_corpus(root / "c.jsonl", docs)
    models = {"bi": tiny_encoder(root / "bi"), "mlm": tiny_mlm(root / "mlm"), "mlm2": tiny_mlm(root / "mlm2", seed=4)}
    build_index(corpus, models["bi"], root / "ix", progress=False, passage_tokens=12)
    build_sparse(root / "ix", models["mlm"], progress=False)
    return root, corpus, models


def doc_best(index, passage_scores):
    out = np.full(len(index), -np.inf)
    np.maximum.at(out, index.passages[:, 0], passage_scores)
    return out


def test_postings_are_the_transposed_matrix():
    rows = [([1, 4], [0.5, 2.0]), ([], []), ([4, 6], [1.0, 3.0])]
    a = postings(rows, 7)
    assert a["indptr"].tolist() == [0, 0, 1, 1, 1, 3, 3, 4]  # term 1: one passage, term 4: two, term 6: one
    assert a["rows"].tolist() == [0, 0, 2, 2] and a["weights"].tolist() == [0.5, 2.0, 1.0, 3.0]


def test_sparse_search_equals_brute_force_dot_products(built):
    root, _, models = built
    index = open_index(root / "ix")
    passages = [json.loads(line)["text"] for line in (root / "ix" / "passages.jsonl").open()]
    rows = embed_sparse(models["mlm"], passages)
    matrix = np.zeros((len(rows), 38), np.float32)
    for p, (ix, v) in enumerate(rows):
        matrix[p, ix.numpy()] = v.numpy()
    query = "the red ball sees a big dog"
    (qi, qv), = embed_sparse(models["mlm"], [query])
    q = np.zeros(38, np.float32)
    q[qi.numpy()] = qv.numpy()
    side = SparseIndex.open(root / "ix")
    np.testing.assert_allclose(side.scores([(qi, qv)])[0], matrix @ q, rtol=1e-5, atol=1e-6)
    best = doc_best(index, matrix @ q)
    want = sorted(range(len(index)), key=lambda d: (-best[d], d))[:5]
    searcher = Searcher.open(root / "ix", sparse=True)
    hits = searcher.search(query, top_k=5, systems=["sparse"])[0]
    assert [h.row for h in hits] == want
    assert [h.score for h in hits] == pytest.approx([best[d] for d in want], rel=1e-5)


@pytest.mark.parametrize("fusion", ["rrf", "zscore"])
def test_three_way_hybrid_fuses_dense_bm25_and_sparse_over_the_union(built, fusion):
    root, _, models = built
    index = open_index(root / "ix")
    searcher = Searcher.open(root / "ix", sparse=True)
    query, n = "red ball river city", 6
    dense = doc_best(index, np.asarray(index.vectors) @ searcher.embed_queries([query])[0])
    lexical = doc_best(index, BM25.load(root / "ix" / "bm25").scores(query))
    sparse = doc_best(index, searcher.sparse.index.scores(embed_sparse(models["mlm"], [query]))[0])
    tops = [sorted(range(len(index)), key=lambda d: (-s[d], d))[:n] for s in (dense, lexical, sparse)]
    union = sorted(set().union(*tops))
    if fusion == "rrf":
        fused = rrf(tops)
    else:
        fused = dict(zip(union, np.mean([zscore(s[union]) for s in (dense, lexical, sparse)], axis=0)))
    want = sorted(union, key=lambda d: (-fused[d], d))[:n]
    hits = searcher.search(query, top_k=n, candidates=n, hybrid=fusion, systems=["dense", "bm25", "sparse"])[0]
    assert [h.row for h in hits] == want
    assert [h.sparse_score for h in hits] == pytest.approx([sparse[d] for d in want], rel=1e-5)
    with pytest.raises(ValueError, match="pass a fusion"):
        searcher.search(query, systems=["dense", "sparse"])
    with pytest.raises(ValueError, match="sparse side opened"):
        Searcher.open(root / "ix").search(query, systems=["sparse"])


def test_a_vocabulary_mismatch_or_another_model_is_refused_naming_both(built, tmp_path, minilm_dir, capsys):
    from bertkit import cli
    from bertkit.data.tokenizer import BertTokenizer

    root, _, models = built
    other_vocab = save_tiny(BertForMaskedLM, BertTokenizer.from_pretrained(minilm_dir), tmp_path / "en")
    with pytest.raises(ValueError, match=r"vocabulary mismatch: .*mlm \(38 tokens.*query model .*en has 30522"):
        Searcher.open(root / "ix", sparse=True, sparse_model=other_vocab)
    with pytest.raises(ValueError, match="same vocabulary, another model"):
        Searcher.open(root / "ix", sparse=True, sparse_model=models["mlm2"])
    assert cli.main(["search", str(root / "ix"), "cat", "--sparse", "--sparse-model", str(models["bi"])]) == 2
    assert "need a masked-LM head" in capsys.readouterr().err


def test_cli_builds_and_searches_the_sparse_side(built, tmp_path, capsys):
    from bertkit import cli

    root, corpus, models = built
    out = tmp_path / "ix"
    assert cli.main(["index", str(corpus), "--model", str(models["bi"]), "--out", str(out), "--sparse-model",
                     str(models["mlm"]), "--sparse-top-k", "8", "--no-progress"]) == 0
    assert "sparse side: " in capsys.readouterr().out
    side = SparseIndex.open(out)
    assert side.meta["top_k"] == 8 and np.bincount(side.rows).max() == 8  # 8 terms in a passage at most
    assert cli.main(["search", str(out), "red ball", "--sparse", "--top-k", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("red ball  (sparse;") and len(printed) == 4
    assert cli.main(["search", str(out), "red ball", "--sparse", "--hybrid", "rrf", "--top-k", "2", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(h["sparse_score"] is not None and h["bm25_score"] is not None for h in row["hits"])
    assert cli.main(["search", str(out), "x", "--hybrid", "rrf", "--systems", "dense,bm25", "--sparse"]) == 2
    assert "add sparse to --systems" in capsys.readouterr().err
    # The side replaced on an existing index (no CORPUS): all weights this time.
    assert cli.main(["index", "--out", str(out), "--sparse-model", str(models["mlm"]), "--no-progress"]) == 0
    assert SparseIndex.open(out).meta["top_k"] is None


def test_an_update_re_encodes_the_sparse_side(built, tmp_path):
    root, corpus, models = built
    out = tmp_path / "ix"
    build_index(corpus, models["bi"], out, progress=False, passage_tokens=12)
    build_sparse(out, models["mlm"], progress=False)
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps({"id": f"new{i}", "text": t}) + "\n"
                           for i, t in enumerate(["A green tree by the river.", "The team wins the game."])))
    update_index(out, upsert=new, delete=["d3"])
    index = open_index(out)
    searcher = Searcher.open(out, sparse=True)
    assert searcher.sparse.index.meta["rows"] == index.meta["rows"]
    hits = {h.id: h for h in searcher.search("green tree river", top_k=len(index), systems=["sparse"])[0]}
    assert "d3" not in hits and len(hits) == len(index)
    (qi, qv), (di, dv) = embed_sparse(models["mlm"], ["green tree river", "A green tree by the river."])
    common, a, b = np.intersect1d(qi.numpy(), di.numpy(), return_indices=True)
    assert hits["new0"].score == pytest.approx(float(qv.numpy()[a] @ dv.numpy()[b]), rel=1e-5)
