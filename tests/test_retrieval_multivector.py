"""The multi-vector side of an index: residual compression, the centroid stage, exact MaxSim on
the decompressed tokens, updates, and its place in hybrid fusion."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.inference.multivector import maxsim_scores
from bertkit.retrieval.fusion import M3_WEIGHTS, weighted_sum
from bertkit.retrieval.index import open_index
from bertkit.retrieval.multivector import MultiVectorIndex, inverted_lists
from bertkit.retrieval.residual import ResidualCodec, n_centroids
from bertkit.retrieval.search import Searcher
from bertkit.retrieval.token_vectors import TOKEN_VECTORS, token_vector_kind

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("faiss")


def unit_rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(16, dim))
    x = centres[rng.integers(0, 16, n)] + 0.4 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_residual_codes_pack_and_decode():
    x = unit_rows(3000, 24)
    errors = {}
    for nbits in (1, 2, 4, 8):
        codec = ResidualCodec.train(x, nbits=nbits, centroids=32)
        codes, packed = codec.encode(x)
        assert codes.shape == (3000,) and packed.shape == (3000, 24 * nbits // 8) and packed.dtype == np.uint8
        buckets = np.searchsorted(codec.cutoffs, x - codec.centroids[codes])
        assert (codec._unpack(packed, 24) == buckets).all()  # packing loses nothing
        decoded = codec.decode(codes, packed)
        np.testing.assert_allclose(np.linalg.norm(decoded, axis=1), 1, rtol=1e-5)
        errors[nbits] = float(np.mean(np.sum(decoded * x, axis=1)))  # mean cosine to the original
    assert errors[1] < errors[2] < errors[4] < errors[8] and errors[2] > 0.9 and errors[8] > 0.999
    assert n_centroids(1_000_000) == 8192 and n_centroids(100) == 2  # 2^⌊log2 16,000⌋; 100 // 39
    with pytest.raises(ValueError, match="--mv-nbits 3 must be 1, 2, 4 or 8"):
        ResidualCodec.train(x, nbits=3)


def test_inverted_lists_by_hand():
    codes = np.array([2, 0, 2, 1, 1, 2], np.int32)  # passages of 2, 1 and 3 tokens
    lists = inverted_lists(codes, np.array([2, 1, 3], np.int32), 4)
    ptr, rows = lists["ivf_ptr"], lists["ivf_rows"]
    assert [rows[ptr[c]:ptr[c + 1]].tolist() for c in range(4)] == [[0], [2], [0, 1, 2], []]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from bertkit import cli

    root = tmp_path_factory.mktemp("mv")
    docs = [". ".join(s.capitalize() for s in sentences(4 + i % 5, seed=i)) + "." for i in range(40)]
    model = tiny_encoder(root / "bi")
    corpus = write_corpus(root / "c.jsonl", docs)
    assert cli.main(["index", str(corpus), "--model", str(model), "--out", str(root / "ix"), "--no-progress",
                     "--passage-tokens", "12", "--multi-vector", "--mv-centroids", "16"]) == 0
    return root, model, docs


def brute_force(searcher: Searcher, query: str, k: int) -> list[str]:
    """Documents by their best passage's exact MaxSim over every passage's decompressed tokens."""
    side = searcher.multivector.index
    q = searcher.multivector.encode([query])[0]
    s = maxsim_scores(torch.from_numpy(q), [torch.from_numpy(v) for v in
                                            side.passage_vectors(range(side.meta["rows"]))]).numpy()
    pdoc = searcher.index.passages[:, 0]
    best = {}
    for row in np.lexsort((np.arange(len(s)), -s)):
        best.setdefault(int(pdoc[row]), float(s[row]))
    ids = searcher.index.ids()
    return [ids[d] for d in sorted(best, key=lambda d: (-best[d], d))[:k]]


def test_multivector_search_is_exact_maxsim_when_every_passage_is_a_candidate(built, capsys):
    from bertkit import cli

    root, model, docs = built
    side = MultiVectorIndex.open(root / "ix")
    meta = json.loads((root / "ix" / "multivector" / "multivector.json").read_text())
    assert meta["kind"] == "token-states" and meta["centroids"] == 16
    assert meta["rows"] == open_index(root / "ix").meta["rows"]
    assert side.memory_bytes() < meta["tokens"] * meta["dim"] * 4 / 4  # under a quarter of float32
    searcher = Searcher.open(root / "ix", multi_vector=True)
    assert searcher.multivector.engine is searcher.engine  # token states of the dense model: one engine
    searcher.mv_nprobe, searcher.mv_candidates = 16, 10_000
    for query in (docs[5][:30], "red car in the park", docs[22][-25:]):
        hits = searcher.search(query, top_k=5, systems=["multivector"])[0]
        assert [h.id for h in hits] == brute_force(searcher, query, 5)
        assert all(h.multivector_score is not None for h in hits)
    # Decompressed tokens score close to the raw token states.
    raw = token_vector_kind("token-states").encode(searcher.engine, [docs[5]], False)[0]
    q = searcher.multivector.encode(["red car"])[0]
    rows = [r for r in range(len(searcher.index.passages)) if searcher.index.passages[r, 0] == 5]
    exact = side.exact_scores(q, rows)
    assert exact.shape == (len(rows),) and np.isfinite(exact).all() and raw.shape[1] == q.shape[1]
    assert cli.main(["search", str(root / "ix"), "red car", "--multi-vector", "--top-k", "3"]) == 0
    assert "MaxSim" in capsys.readouterr().out


def test_hybrid_fusions_over_three_systems(built):
    root, _, docs = built
    searcher = Searcher.open(root / "ix", multi_vector=True)
    systems = ["dense", "bm25", "multivector"]
    for fusion in ("rrf", "weighted", "zscore"):
        hits = searcher.search([docs[9][:40]], top_k=5, candidates=20, hybrid=fusion, systems=systems)[0]
        assert len(hits) == 5 and all(h.multivector_score is not None and h.bm25_score is not None for h in hits)
    # Every document a candidate (and a hit), so the best BM25 score among the hits is the candidates' best.
    hits = searcher.search(docs[9][:40], top_k=40, candidates=40, hybrid="weighted", systems=systems)[0]
    assert len(hits) == 40
    q_tokens = len(searcher.multivector.encode([docs[9][:40]])[0])
    top_bm25 = max(h.bm25_score for h in hits)
    for h in hits:  # BGE-M3's sum, BM25 scaled by the best candidate's score
        want = (0.4 * h.dense_score + 0.2 * h.bm25_score / top_bm25 + 0.4 * h.multivector_score / q_tokens) / 1.0
        assert h.score == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="multi-vector side opened"):
        Searcher.open(root / "ix").search("cat", hybrid="rrf", systems=systems)


def test_weighted_sum_is_m3s_formula():
    dense, colbert, sparse = np.array([0.9, 0.5]), np.array([0.7, 0.8]), np.array([3.0, 6.0])
    got = weighted_sum({"dense": dense, "multivector": colbert, "bm25": sparse})
    np.testing.assert_allclose(got, (0.4 * dense + 0.2 * sparse / 6 + 0.4 * colbert) / 1.0)
    np.testing.assert_allclose(weighted_sum({"dense": dense, "multivector": colbert}), (dense + colbert) / 2)
    assert M3_WEIGHTS["dense"] == M3_WEIGHTS["multivector"] == 0.4


def test_upsert_and_delete_keep_the_side(built, tmp_path):
    import shutil

    from bertkit import cli

    root, _, docs = built
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    before = MultiVectorIndex.open(ix)
    old = open_index(ix)
    keep = [r for r in range(len(old.passages)) if old.passages[r, 0] not in (3,)]
    kept_vectors = before.passage_vectors(keep)
    updates = write_corpus(tmp_path / "up.jsonl", ["The green river runs under the big city. A dog wins."])
    (tmp_path / "up.jsonl").write_text(updates.read_text().replace('"d0"', '"new"'))
    assert cli.main(["index", str(updates), "--out", str(ix), "--upsert", "--delete", "d3"]) == 0
    after = MultiVectorIndex.open(ix, rows=open_index(ix).meta["rows"])
    assert after.meta["centroids"] == before.meta["centroids"]
    for a, b in zip(after.passage_vectors(range(len(keep))), kept_vectors):
        np.testing.assert_array_equal(a, b)
    searcher = Searcher.open(ix, multi_vector=True)
    searcher.mv_nprobe, searcher.mv_candidates = 16, 10_000
    hits = searcher.search("The green river runs under the big city.", top_k=3, systems=["multivector"])[0]
    assert [h.id for h in hits] == brute_force(searcher, "The green river runs under the big city.", 3)
    assert "d3" not in open_index(ix).ids() and "new" in open_index(ix).ids()


def test_kinds_table():
    assert set(TOKEN_VECTORS) == {"token-states", "colbert", "m3"}
    with pytest.raises(ValueError, match="unknown token-vector kind 'splade-tokens'"):
        token_vector_kind("splade-tokens")


@pytest.mark.parametrize("kind, model", [("colbert", "colbert_pylate/model"), ("m3", "m3_flag/model")])
def test_colbert_and_m3_models_index_their_own_vectors(kind, model, tmp_path):
    """The side of a ColBERT or BGE-M3 model holds that model's late-interaction vectors (its
    queries read as the model reads queries) and ranks as exact MaxSim over them."""
    from pathlib import Path

    from bertkit import cli

    model_dir = Path(__file__).parent / "fixtures" / model
    docs = [". ".join(s.capitalize() for s in sentences(3 + i % 4, seed=100 + i)) + "." for i in range(24)]
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    assert cli.main(["index", str(corpus), "--model", str(model_dir), "--out", str(tmp_path / "ix"),
                     "--no-progress", "--passage-tokens", "0", "--multi-vector", kind, "--mv-nbits", "8",
                     "--mv-centroids", "8"]) == 0
    searcher = Searcher.open(tmp_path / "ix", multi_vector=True)
    spec = token_vector_kind(kind)
    query = docs[7][:35]
    assert np.allclose(searcher.multivector.encode([query])[0], spec.encode(searcher.multivector.engine, [query],
                                                                              True)[0])
    # Every passage a candidate, 8-bit residuals: the search is exact MaxSim over the model's own
    # document vectors (decompressed), so it ranks as those vectors do.
    searcher.mv_nprobe, searcher.mv_candidates = 8, 10_000
    hits = searcher.search(query, top_k=5, systems=["multivector"])[0]
    assert [h.id for h in hits] == brute_force(searcher, query, 5)
    raw = spec.encode(searcher.multivector.engine, docs, False)
    side = searcher.multivector.index
    decoded = side.passage_vectors(range(side.meta["rows"]))
    assert all(a.shape == b.shape for a, b in zip(raw, decoded))
    assert min(float(np.mean(np.sum(a * b, axis=1))) for a, b in zip(raw, decoded)) > 0.99
