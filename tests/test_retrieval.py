"""Retrieval: metrics on hand-computed cases, exact chunked top-k, index build / resume / model
check, search with and without a reranker, the CLI commands."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

from bertkit.retrieval import metrics
from bertkit.retrieval.index import VECTORS_FILE, IndexConfig, build_index, open_index
from bertkit.retrieval.search import Searcher, search, top_k_inner_product

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_cross_encoder, tiny_encoder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# metrics, by hand
# ---------------------------------------------------------------------------------------------
def test_reciprocal_rank_by_hand():
    assert metrics.reciprocal_rank(["a", "b", "c"], {"c"}) == pytest.approx(1 / 3)
    assert metrics.reciprocal_rank(["a", "b", "c"], {"b", "c"}) == pytest.approx(1 / 2)
    assert metrics.reciprocal_rank(["x"] * 10 + ["a"], {"a"}, k=10) == 0.0  # rank 11 is outside @10
    assert metrics.reciprocal_rank([], {"a"}) == 0.0


def test_recall_by_hand():
    ranked = ["a", "b", "c", "d"]
    assert metrics.recall(ranked, {"a", "d", "z"}, 1) == pytest.approx(1 / 3)
    assert metrics.recall(ranked, {"a", "d", "z"}, 4) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no relevant"):
        metrics.recall(ranked, set(), 10)


def test_ndcg_by_hand():
    # Relevant at ranks 2 and 3 (binary): DCG = 1/log2(3) + 1/log2(4); ideal = 1 + 1/log2(3).
    expected = (1 / math.log2(3) + 0.5) / (1 + 1 / math.log2(3))
    assert metrics.ndcg(["x", "a", "b"], {"a", "b"}) == pytest.approx(expected)
    # Graded: grades 3 at rank 2, 1 at rank 1; ideal puts the 3 first.
    graded = {"a": 3, "b": 1}
    expected = (1 / 1 + 3 / math.log2(3)) / (3 / 1 + 1 / math.log2(3))
    assert metrics.ndcg(["b", "a"], graded) == pytest.approx(expected)
    assert metrics.ndcg(["a", "b"], graded) == pytest.approx(1.0)
    assert metrics.ndcg(["a", "a"], {"a", "b"}) == pytest.approx(1 / (1 + 1 / math.log2(3)))  # no double gain


def test_evaluate_run_averages_and_missing_queries():
    run = {"q1": ["a", "b"], "q2": ["c", "d"], "unjudged": ["a"]}
    qrels = {"q1": {"b"}, "q2": {"c"}, "q3": {"e"}}  # q3 is not in the run: it scores 0
    out = metrics.evaluate_run(run, qrels)
    assert out["queries"] == 3
    assert out["mrr@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert out["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert out["recall@10"] == pytest.approx(2 / 3)
    assert out["ndcg@10"] == pytest.approx((1 / math.log2(3) + 1 + 0) / 3)
    with pytest.raises(ValueError, match="no relevant"):
        metrics.evaluate_run(run, {"q1": set()})


def test_average_precision_and_trec_order_by_hand():
    # Relevant a, b, c; found at ranks 1 and 3: (1/1 + 2/3) / 3; c never found counts as 0.
    assert metrics.average_precision(["a", "x", "b"], {"a", "b", "c"}) == pytest.approx((1 + 2 / 3) / 3)
    assert metrics.average_precision(["a", "x", "b"], {"a", "b", "c"}, k=2) == pytest.approx(1 / 3)  # map_cut.2
    assert metrics.average_precision(["a", "a", "b"], {"a", "b"}) == pytest.approx((1 + 2 / 3) / 2)  # no double credit
    out = metrics.evaluate_run({"q": ["a", "x", "b"]}, {"q": {"a", "b"}}, {"map": (None, 1)})
    assert out["map"] == pytest.approx((1 + 2 / 3) / 2) and out["map@1"] == pytest.approx(1 / 2)
    # trec_eval's order: score descending, then document id descending.
    assert metrics.trec_order({"d1": 0.5, "d3": 0.9, "d2": 0.5, "d10": 0.5}) == ["d3", "d2", "d10", "d1"]


# ---------------------------------------------------------------------------------------------
# exact top-k in chunks
# ---------------------------------------------------------------------------------------------
def test_top_k_matches_brute_force_for_any_chunking():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1037, 13)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # unit rows: a query's own row wins
    vectors[500] = vectors[17]  # a tie: the lower row must come first
    queries = rng.standard_normal((7, 13)).astype(np.float32)
    queries[0] = vectors[17] * 5
    full = queries @ vectors.T
    for budget in (1, 50, 2048, 10 ** 7):
        scores, rows = top_k_inner_product(vectors, queries, 10, budget=budget)
        for q in range(len(queries)):
            expected = sorted(range(len(vectors)), key=lambda i: (-full[q, i], i))[:10]
            assert rows[q].tolist() == expected, budget
            np.testing.assert_allclose(scores[q], full[q, expected], rtol=1e-5)
        assert rows[0, 0] == 17 and rows[0, 1] == 500


def test_top_k_memory_is_bounded_on_200k_documents(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "v.npy"
    stored = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(200_000, 32))
    for lo in range(0, 200_000, 50_000):
        stored[lo:lo + 50_000] = rng.standard_normal((50_000, 32), dtype=np.float32)
    planted = 123_457
    query = np.array(stored[planted]) * 3
    stored.flush()
    del stored
    vectors = np.load(path, mmap_mode="r")  # 25.6 MB on disk
    queries = np.stack([query, rng.standard_normal(32, dtype=np.float32)])
    tracemalloc.start()
    scores, rows = top_k_inner_product(vectors, queries, 100, budget=1 << 18)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows[0, 0] == planted
    # The whole index as float32 would be 25.6 MB; a budget of 2**18 scores keeps a chunk of
    # (131072, 32) rows (16.8 MB) plus its scores. Allow twice a chunk, well under the index.
    assert peak < 20 * 2 ** 20, f"peak {peak / 2 ** 20:.1f} MiB"
    full = np.asarray(vectors[:], dtype=np.float32) @ queries[1]
    assert rows[1].tolist() == np.argsort(-full, kind="stable")[:100].tolist()


# ---------------------------------------------------------------------------------------------
# index and search
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"bi": tiny_encoder(root / "bi"), "other": tiny_encoder(root / "other", seed=5),
            "cross": tiny_cross_encoder(root / "cross")}


def test_index_search_finds_the_planted_document(tmp_path, models):
    texts = sentences(60)
    corpus = write_corpus(tmp_path / "corpus.jsonl", texts)
    summary = build_index(corpus, models["bi"], tmp_path / "index", progress=False, chunk_size=16)
    assert summary["rows"] == 60 and summary["dim"] == 32
    index = open_index(tmp_path / "index")
    assert index.document(41) == {"id": "d41", "text": texts[41]}
    hits = search(tmp_path / "index", [texts[41], texts[7]], top_k=5)
    assert [h[0].id for h in hits] == ["d41", "d7"]  # each text's own vector is its nearest
    assert hits[0][0].score == pytest.approx(1.0, abs=1e-5) and len(hits[0]) == 5
    from bertkit.inference import embed

    np.testing.assert_allclose(index.vectors, embed(models["bi"], texts).numpy(), atol=1e-5)


def test_rerank_orders_candidates_by_the_cross_encoder(tmp_path, models):
    from bertkit.inference import rerank

    texts = sentences(30, seed=3)
    build_index(write_corpus(tmp_path / "c.jsonl", texts), models["bi"], tmp_path / "ix", progress=False)
    searcher = Searcher.open(tmp_path / "ix", rerank=models["cross"])
    hits = searcher.search("the cat sees a ball", top_k=4, candidates=12)[0]
    first = Searcher.open(tmp_path / "ix").search("the cat sees a ball", top_k=12)[0]
    expected = rerank(models["cross"], "the cat sees a ball", [h.text for h in first], top_k=4)
    assert [h.id for h in hits] == [first[e["index"]].id for e in expected]
    assert [h.score for h in hits] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    assert all(h.first_stage_score is not None for h in hits)


def test_fuse_scores_on_hand_cases():
    from bertkit.retrieval import fuse_scores

    first, second = np.array([3.0, 2.0, 1.0]), np.array([-1.0, 0.0, 1.0])  # the stages disagree
    z = np.array([1.0, 0.0, -1.0]) * np.sqrt(1.5)  # (x - 2) / std, std = sqrt(2/3)
    np.testing.assert_allclose(fuse_scores(first, second, 0.0), z)
    np.testing.assert_allclose(fuse_scores(first, second, 1.0), -z)
    np.testing.assert_allclose(fuse_scores(first, second, 0.5), [0.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(fuse_scores(first, 10 * second + 7, 0.25), fuse_scores(first, second, 0.25))
    np.testing.assert_allclose(fuse_scores(np.ones(3), second, 0.5), 0.5 * -z)  # a flat stage adds 0
    with pytest.raises(ValueError, match=r"rerank weight must be in \[0, 1\].*got 1.5"):
        fuse_scores(first, second, 1.5)


def test_rerank_weight_mixes_the_two_stages(tmp_path, models):
    from bertkit.inference import rerank
    from bertkit.retrieval import fuse_scores

    texts = sentences(30, seed=3)
    build_index(write_corpus(tmp_path / "c.jsonl", texts), models["bi"], tmp_path / "ix", progress=False)
    searcher = Searcher.open(tmp_path / "ix", rerank=models["cross"])
    query = "the cat sees a ball"
    first = Searcher.open(tmp_path / "ix").search(query, top_k=12)[0]
    assert [h.id for h in searcher.search(query, top_k=12, candidates=12, rerank_weight=0.0)[0]] == \
        [h.id for h in first]  # weight 0: the first stage's order
    logits = np.empty(12)
    for e in rerank(models["cross"], query, [h.text for h in first], raw_scores=True):
        logits[e["index"]] = e["score"]
    fused = fuse_scores(np.array([h.score for h in first]), logits, 0.6)
    hits = searcher.search(query, top_k=5, candidates=12, rerank_weight=0.6)[0]
    expected = sorted(range(12), key=lambda i: (-fused[i], i))[:5]
    assert [h.id for h in hits] == [first[i].id for i in expected]
    assert [h.score for h in hits] == pytest.approx([fused[i] for i in expected], abs=1e-5)
    assert [h.rerank_score for h in hits] == pytest.approx([1 / (1 + np.exp(-logits[i])) for i in expected], abs=1e-6)
    with pytest.raises(ValueError, match="has no reranker; pass --rerank"):
        Searcher.open(tmp_path / "ix").search(query, rerank_weight=0.5)


def test_reranker_reads_pairs_at_its_trained_length(tmp_path, models):
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.retrieval.search import load_reranker

    assert load_reranker(models["cross"]).max_length == 41  # no trained length: the model's limit
    trained = tmp_path / "trained"
    import shutil

    shutil.copytree(models["cross"], trained)
    tokenizer = BertTokenizer.from_pretrained(trained)
    tokenizer.model_max_length = 12  # what finetune --task rerank writes
    tokenizer.save_pretrained(trained)
    assert load_reranker(trained).max_length == 12
    assert load_reranker(trained, max_length=30).max_length == 30
    texts = sentences(10, seed=8)
    build_index(write_corpus(tmp_path / "c.jsonl", texts), models["bi"], tmp_path / "ix", progress=False)
    assert Searcher.open(tmp_path / "ix", rerank=trained).reranker.max_length == 12
    assert Searcher.open(tmp_path / "ix", rerank=trained, rerank_max_length=20).reranker.max_length == 20


def test_index_refuses_another_query_model(tmp_path, models):
    build_index(write_corpus(tmp_path / "c.jsonl", sentences(5)), models["bi"], tmp_path / "ix",
                progress=False)
    with pytest.raises(ValueError, match="another space"):
        Searcher.open(tmp_path / "ix", model=models["other"])
    Searcher.open(tmp_path / "ix", model=models["bi"])  # the same model is fine


def test_index_resume_continues_a_killed_build(tmp_path, models, monkeypatch):
    import bertkit.inference as inference

    texts = sentences(40, seed=2)
    corpus = write_corpus(tmp_path / "c.jsonl", texts)
    build_index(corpus, models["bi"], tmp_path / "whole", progress=False, chunk_size=8)
    calls = {"n": 0}
    real = inference.embed

    def dies_on_third_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # a kill between chunks
        return real(*args, **kwargs)

    monkeypatch.setattr(inference, "embed", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, models["bi"], tmp_path / "ix", progress=False, chunk_size=8)
    assert not (tmp_path / "ix" / "index.json").exists()
    with pytest.raises(ValueError, match="not a finished index"):
        open_index(tmp_path / "ix")
    with pytest.raises(FileExistsError, match="--overwrite"):
        build_index(corpus, models["bi"], tmp_path / "ix", progress=False, chunk_size=8)
    monkeypatch.setattr(inference, "embed", real)
    with pytest.raises(ValueError, match="fingerprint"):  # another model cannot continue it
        build_index(corpus, models["other"], tmp_path / "ix", progress=False, chunk_size=8, resume=True)
    summary = build_index(corpus, models["bi"], tmp_path / "ix", progress=False, chunk_size=8, resume=True)
    assert summary["resumed_from"] == 16 and summary["rows"] == 40
    assert (tmp_path / "ix" / VECTORS_FILE).read_bytes() == (tmp_path / "whole" / VECTORS_FILE).read_bytes()


def test_bad_rows_and_duplicate_ids(tmp_path, models, caplog):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "the cat"}\nnot json\n{"id": "b"}\n{"id": "c", "text": "a dog"}\n',
                      encoding="utf-8")
    summary = build_index(corpus, models["bi"], tmp_path / "ix", progress=False)
    assert summary["rows"] == 2 and summary["skipped"] == 2
    assert "c.jsonl:2" in caplog.text
    assert open_index(tmp_path / "ix").ids() == ["a", "c"]
    corpus.write_text('{"id": "a", "text": "the cat"}\n{"id": "a", "text": "a dog"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="appears twice"):
        build_index(corpus, models["bi"], tmp_path / "ix2", progress=False)
    assert not (tmp_path / "ix2").exists()  # nothing half-made is left


def test_cli_index_and_search(tmp_path, models, capsys):
    from bertkit import cli

    texts = sentences(20, seed=4)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert cli.main(["index", str(corpus), "--model", str(models["bi"]), "--out", str(tmp_path / "ix"),
                     "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "ix"), texts[12], "--top-k", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["query"] == texts[12] and rows[0]["hits"][0]["id"] == "13"  # txt ids: line numbers
    assert cli.main(["search", str(tmp_path / "ix"), texts[3], "--rerank", str(models["cross"]),
                     "--top-k", "2", "--candidates", "5", "--rerank-max-length", "16"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") >= 3 and "rerank" in out
    assert cli.main(["search", str(tmp_path / "ix"), texts[3], "--rerank", str(models["cross"]),
                     "--top-k", "2", "--candidates", "5", "--rerank-weight", "0.5"]) == 0
    assert "fused at weight 0.5" in capsys.readouterr().out
    assert cli.main(["search", str(tmp_path / "ix"), "cat", "--model", str(models["other"])]) == 2
    assert "another space" in capsys.readouterr().err


def test_index_config_names_a_bad_setting_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        IndexConfig(corpus=tmp_path / "c.jsonl", model="m", out_dir=tmp_path / "ix", resume=True, overwrite=True)
    with pytest.raises(ValueError, match="--passage-overlap -1 must be 0 or more"):
        build_index(tmp_path / "c.jsonl", "m", tmp_path / "ix", passage_overlap=-1)
    assert not (tmp_path / "ix").exists()
