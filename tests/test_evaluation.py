"""bertkit eval / bertkit.evaluate: retrieval figures equal pytrec_eval's (the oracle), STS and
pair scores equal scipy's and scikit-learn's, MTEB's classification protocol, prompts, and bad
BEIR directories named by file and line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit import cli
from bertkit.evaluation import data as sets
from bertkit.evaluation.encoder import TextEncoder, cosine_pairs, prompt_key
from bertkit.evaluation.pairs import average_precision, best_accuracy, pair_classification_scores, spearman
from bertkit.evaluation.retrieval import dense_run, score_run

from retrieval_fixtures import tiny_cross_encoder

FAST = {"max_length": 64}  # MiniLM on short pieces: the tests check figures, not long documents


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_beir(root: Path, corpus: dict[str, tuple[str, str]], queries: dict[str, str],
               qrels: list[tuple[str, str, int]]) -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": t, "text": x}) + "\n"
                                               for k, (t, x) in corpus.items()), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n"
                                                for k, v in queries.items()), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{s}\n" for q, d, s in qrels), encoding="utf-8")
    return root


CORPUS = {"d1": ("Cats", "A cat sits on the mat."), "d2": ("", "Dogs bark at the mailman."),
          "d3": ("Finance", "Stocks fell sharply today."), "d4": ("", "The kitten is sleeping on a sofa."),
          "d5": ("Music", "A man plays the guitar."), "d6": ("", "Shares rose after the report."),
          "d7": ("", "The orchestra performed a symphony."), "d8": ("Pets", "Puppies need daily walks.")}
QUERIES = {"q1": "where is the cat?", "q2": "stock market news", "q3": "someone plays an instrument",
           "q4": "walking a dog", "q5": "a question nobody judged relevant", "q6": "not judged at all"}
# Graded judgements, a judged document that is not relevant (grade 0), a query with no relevant document.
QRELS = [("q1", "d1", 2), ("q1", "d4", 1), ("q1", "d2", 0), ("q2", "d3", 1), ("q2", "d6", 2),
         ("q3", "d5", 1), ("q3", "d7", 1), ("q4", "d2", 1), ("q4", "d8", 2), ("q5", "d1", 0),
         ("q2", "d7", 1)]  # a judgement no model would agree with, so the figures are not all 1


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory) -> Path:
    return write_beir(tmp_path_factory.mktemp("beir") / "toy", CORPUS, QUERIES, QRELS)


def pytrec_figures(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """The oracle: pytrec_eval's ndcg_cut.10, recall.100 and map on the run, recip_rank on the run
    cut to its 10 best (trec_eval's order), each a mean over the queries."""
    pytrec_eval = pytest.importorskip("pytrec_eval", reason="the oracle: pip install pytrec-eval-terrier")
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map"}).evaluate(run)
    top10 = {q: dict(sorted(s.items(), key=lambda i: (i[1], i[0]), reverse=True)[:10]) for q, s in run.items()}
    cut = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    mean = lambda table, key: float(np.mean([row[key] for row in table.values()]))  # noqa: E731
    return {"ndcg@10": mean(full, "ndcg_cut_10"), "mrr@10": mean(cut, "recip_rank"),
            "recall@100": mean(full, "recall_100"), "map": mean(full, "map")}


# ---------------------------------------------------------------------------------------------
# retrieval figures against the oracle
# ---------------------------------------------------------------------------------------------
def test_figures_equal_pytrec_eval_on_random_runs_with_ties():
    """Graded judgements, tied scores (trec_eval breaks ties by document id, descending), runs
    deeper than 100 and relevant documents never retrieved."""
    rng = random.Random(7)
    docs = [f"doc{i}" for i in range(300)]
    qrels, run = {}, {}
    for q in range(40):
        judged = rng.sample(docs, 12)
        qrels[f"q{q}"] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        qrels[f"q{q}"][judged[0]] = 1  # at least one relevant document
        retrieved = rng.sample(docs, rng.randint(5, 250))
        run[f"q{q}"] = {d: float(rng.randint(0, 20)) / 4 for d in retrieved}  # many ties
    data = sets.RetrievalData("random", dict.fromkeys(docs, "x"), dict.fromkeys(qrels, "x"), qrels)
    ours, oracle = score_run(run, data), pytrec_figures(run, qrels)
    assert ours.keys() == oracle.keys()
    for name in ours:
        assert ours[name] == pytest.approx(oracle[name], abs=1e-12), name


def test_beir_directory_equals_pytrec_eval(beir_dir, minilm_dir):
    data = sets.read_beir(beir_dir)
    assert list(data.qrels) == ["q1", "q2", "q3", "q4", "q5"] and data.unanswerable == 1  # q5: no relevant document
    assert data.corpus["d1"] == "Cats A cat sits on the mat." and data.corpus["d2"] == "Dogs bark at the mailman."
    run = dense_run(TextEncoder.load(minilm_dir, **FAST), data)
    assert all(len(found) == len(CORPUS) for found in run.values())  # the run holds the whole (small) corpus
    oracle = pytrec_figures(run, data.qrels)
    result = bertkit.evaluate(minilm_dir, beir=beir_dir, **FAST)
    assert result["task"] == "retrieval" and result["queries"] == 5 and result["unanswerable_queries"] == 1
    assert result["main_score"] == "ndcg@10"
    for name, value in result["scores"].items():
        assert value == pytest.approx(oracle[name], abs=1e-12), name
    assert 0 < result["scores"]["map"] < 1  # not a trivial run


def test_builtin_data_as_a_beir_directory_equals_pytrec_eval(tmp_path, minilm_dir):
    """A BEIR directory written from en-news-retrieval's test split (20 queries, their articles and
    40 other articles), scored and checked against the oracle; the built-in reader gives the
    same queries and judgements as the files."""
    full = sets.builtin_retrieval("en-news-retrieval", "test")
    queries = dict(list(full.queries.items())[:20])
    relevant = {d for q in queries for d in full.qrels[q]}
    others = [d for d in full.corpus if d not in relevant][:40]
    corpus = {d: ("", full.corpus[d]) for d in sorted(relevant) + others}
    root = write_beir(tmp_path / "en-news", corpus, queries,
                      [(q, d, g) for q in queries for d, g in full.qrels[q].items()])
    data = sets.read_beir(root)
    assert data.qrels == {q: full.qrels[q] for q in queries}
    run = dense_run(TextEncoder.load(minilm_dir, **FAST), data)
    oracle = pytrec_figures(run, data.qrels)
    result = bertkit.evaluate(minilm_dir, beir=root, **FAST)
    for name, value in result["scores"].items():
        assert value == pytest.approx(oracle[name], abs=1e-12), name
    assert result["scores"]["mrr@10"] > 0.5  # MiniLM finds most BBC articles from their titles


# ---------------------------------------------------------------------------------------------
# reranking
# ---------------------------------------------------------------------------------------------
def test_reranking_a_run_file_with_a_cross_encoder(beir_dir, tmp_path):
    ce = tiny_cross_encoder(tmp_path / "ce")
    run_file = tmp_path / "first.run"
    # A first stage that ranks every document, judged or not, in a fixed order.
    lines = [f"{q} Q0 {d} {r + 1} {10 - r} bm25" for q in QUERIES for r, d in enumerate(reversed(list(CORPUS)))]
    run_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = bertkit.evaluate(ce, beir=beir_dir, candidates=run_file, top_k=5)
    assert result["task"] == "reranking" and result["first_stage"]["name"] == f"{run_file} top 5"
    data = sets.read_beir(beir_dir)
    first = {q: {d: float(10 - r) for r, d in enumerate(reversed(list(CORPUS))) if r < 5} for q in data.qrels}
    oracle = pytrec_figures(first, data.qrels)
    assert {k: v for k, v in result["first_stage"].items() if k != "name"} == pytest.approx(oracle, abs=1e-12)
    from bertkit.inference import rerank

    reranked = {}
    for q, found in first.items():
        docs = list(found)
        scores = rerank(ce, data.queries[q], [data.corpus[d] for d in docs], raw_scores=True)
        reranked[q] = {docs[s["index"]]: s["score"] for s in scores}
    assert result["scores"] == pytest.approx(pytrec_figures(reranked, data.qrels), abs=1e-12)


def test_a_cross_encoder_reranks_bm25_by_default(beir_dir, tmp_path):
    result = bertkit.evaluate(tiny_cross_encoder(tmp_path / "ce"), beir=beir_dir, top_k=3)
    assert result["task"] == "reranking" and result["first_stage"]["name"] == "BM25 top 3"
    assert result["first_stage"]["recall@100"] < 1  # three candidates cannot hold every relevant document


# ---------------------------------------------------------------------------------------------
# STS, pair classification, classification
# ---------------------------------------------------------------------------------------------
def test_pair_figures_equal_scipy_and_scikit_learn():
    scipy_stats = pytest.importorskip("scipy.stats")
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    x = np.round(rng.normal(size=200), 1)  # ties
    y = x + rng.normal(size=200)
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y)[0], abs=1e-12)
    labels = (y > 0.3).astype(int)
    assert average_precision(x, labels) == pytest.approx(metrics.average_precision_score(labels, x), abs=1e-12)
    best = max(((x > t) == labels).mean() for t in np.r_[x - 1e-9, x.max() + 1])
    assert best_accuracy(x, labels) == pytest.approx(best)
    a, b = rng.normal(size=(50, 16)).astype(np.float32), rng.normal(size=(50, 16)).astype(np.float32)
    from sklearn.metrics.pairwise import paired_cosine_distances

    np.testing.assert_array_equal(cosine_pairs(a, b), 1 - paired_cosine_distances(a, b))


STS_ROWS = [("A man is playing a guitar.", "Someone plays an instrument.", 4.2),
            ("A cat sleeps on the sofa.", "A kitten naps on the couch.", 4.6),
            ("Stocks fell sharply today.", "The market dropped.", 3.9),
            ("A man is playing a guitar.", "Stocks fell sharply today.", 0.1),
            ("The dog runs in the park.", "A puppy plays outside.", 3.1),
            ("The dog runs in the park.", "Shares rose after the report.", 0.3)]


def test_sts_and_pairs_from_files(tmp_path, minilm_dir):
    sts = tmp_path / "sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in STS_ROWS)
                   + "not json\n", encoding="utf-8")
    result = bertkit.evaluate(minilm_dir, sts=sts, **FAST)
    assert result["task"] == "sts" and result["pairs"] == 6 and result["skipped"] == 1
    encoder = TextEncoder.load(minilm_dir, **FAST)
    cos = cosine_pairs(encoder.encode([r[0] for r in STS_ROWS]), encoder.encode([r[1] for r in STS_ROWS]))
    assert result["scores"]["spearman"] == pytest.approx(spearman([r[2] for r in STS_ROWS], cos), abs=1e-12)
    assert result["scores"]["spearman"] > 0.8
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{int(s > 2)}\n" for a, b, s in STS_ROWS),
                     encoding="utf-8")
    result = bertkit.evaluate(minilm_dir, pairs=pairs, **FAST)
    assert result["task"] == "pair-classification" and result["main_score"] == "ap"
    assert result["scores"] == pytest.approx(pair_classification_scores(cos, [int(r[2] > 2) for r in STS_ROWS]))


def test_classification_follows_mteb_undersampling(tmp_path, minilm_dir):
    pytest.importorskip("sklearn")
    from bertkit.evaluation.classification import undersamples

    # MTEB's _undersample_data: the same RandomState(seed) shuffles the same list again each run.
    order, expected = list(range(12)), []
    labels = ["a", "b", "c"] * 4
    for _ in range(3):
        np.random.RandomState(42).shuffle(order)
        taken: dict = {}
        expected.append([i for i in order if taken.setdefault(labels[i], []).append(i) or len(taken[labels[i]]) <= 2])
    assert undersamples(labels, 2, 3) == expected
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    rows = [("The team won the match.", "sport"), ("Shares fell on the news.", "business"),
            ("The striker scored twice.", "sport"), ("Profits rose this quarter.", "business"),
            ("The coach praised his players.", "sport"), ("The bank cut interest rates.", "business")]
    train.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows * 2), encoding="utf-8")
    test.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in
                            [("A goal in the final minute.", "sport"), ("Oil prices climbed.", "business")]),
                    encoding="utf-8")
    result = bertkit.evaluate(minilm_dir, classification=(train, test), samples_per_label=3, experiments=2, **FAST)
    assert result["task"] == "classification" and result["experiments"] == 2
    assert set(result["scores"]) == {"accuracy", "f1", "f1_weighted", "precision", "recall"}
    assert result["scores"]["accuracy"] == 1.0


def test_prompts_follow_mteb_priority(tmp_path, minilm_dir, beir_dir):
    prompts = {"query": "q: ", "document": "d: ", "Retrieval-query": "rq: ", "toy": "toy: ", "STS": "sts: "}
    assert prompt_key(prompts, "toy", "Retrieval", "query") == "toy"
    assert prompt_key(prompts, "other", "Retrieval", "query") == "Retrieval-query"
    assert prompt_key(prompts, "other", "Retrieval", "document") == "document"
    assert prompt_key(prompts, "other", "STS", None) == "STS"
    assert prompt_key({"query": "q"}, "other", "Classification", None) is None
    # A model's own prompts apply unless replaced; its default prompt where no key matches.
    model = tmp_path / "prompted"
    model.mkdir()
    for file in minilm_dir.iterdir():
        if file.name != "config_sentence_transformers.json":
            (model / file.name).symlink_to(file)
    (model / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "plain": "text: "}, "default_prompt_name": "plain"}), encoding="utf-8")
    own = bertkit.evaluate(model, beir=beir_dir, **FAST)
    assert own["prompts"] == {"query": "query: ", "document": "text: "}
    replaced = bertkit.evaluate(model, beir=beir_dir, prompts={"Retrieval-query": "query: "}, **FAST)
    assert replaced["prompts"] == {"query": "query: ", "document": "text: "}  # the default prompt stays
    plain = bertkit.evaluate(minilm_dir, beir=beir_dir, **FAST)
    assert plain["prompts"] == {"query": "", "document": ""}
    data = sets.read_beir(beir_dir)
    assert dense_run(TextEncoder.load(model, **FAST), data) != dense_run(TextEncoder.load(minilm_dir, **FAST), data)


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the file and line
# ---------------------------------------------------------------------------------------------
def run_cli(argv: list[str], capsys) -> str:
    status = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("bertkit eval: error: "), err
    assert all(line.endswith("skipped)") for line in err[:-1]), err
    return err[-1]


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv"])
def test_a_missing_file_is_named(missing, beir_dir, tmp_path, capsys, minilm_dir):
    import shutil

    root = shutil.copytree(beir_dir, tmp_path / "copy")
    (root / missing).unlink()
    line = run_cli(["eval", str(minilm_dir), "--beir", str(root)], capsys)
    assert f"{root / missing}: no such file" in line


def test_another_split_is_suggested(beir_dir, minilm_dir, capsys):
    line = run_cli(["eval", str(minilm_dir), "--beir", str(beir_dir), "--split", "dev"], capsys)
    assert "qrels/dev.tsv: no such file" in line and "holds test: pass --split" in line


@pytest.mark.parametrize("bad, says", [
    (("q9", "d1", 1), "query-id 'q9' is not in"), (("q1", "d99", 1), "corpus-id 'd99' is not in"),
    (("q1", "d1", "high"), "score 'high' is not an integer")])
def test_a_bad_judgement_is_named_by_file_and_line(bad, says, tmp_path, minilm_dir, capsys):
    root = write_beir(tmp_path / "bad", CORPUS, QUERIES, [*QRELS[:3], bad, *QRELS[3:]])
    line = run_cli(["eval", str(minilm_dir), "--beir", str(root)], capsys)
    assert f"{root / 'qrels' / 'test.tsv'}:5: " in line and says in line  # line 1 is the header


def test_bad_json_lines_are_named_counted_and_skipped(beir_dir, tmp_path, minilm_dir, caplog):
    import shutil

    root = shutil.copytree(beir_dir, tmp_path / "copy")
    with open(root / "corpus.jsonl", "a", encoding="utf-8") as f:
        f.write('{"_id": "d9", "text": "unfinished\n["a list"]\n{"title": "no id", "text": "x"}\n')
    data = sets.read_beir(root)
    assert data.skipped == {"corpus.jsonl": 3} and "d9" not in data.corpus
    said = " ".join(caplog.messages)
    assert f"{root / 'corpus.jsonl'}:9: invalid JSON" in said and f"{root / 'corpus.jsonl'}:11: no _id" in said
    # ... and a qrels line naming a skipped document is an error naming the qrels line.
    with open(root / "qrels" / "test.tsv", "a", encoding="utf-8") as f:
        f.write("q1\td9\t1\n")
    with pytest.raises(ValueError, match=rf"test.tsv:{len(QRELS) + 2}: corpus-id 'd9' is not in"):
        sets.read_beir(root)


def test_a_cross_encoder_cannot_embed(tmp_path, capsys):
    sts = tmp_path / "sts.jsonl"
    sts.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "score": 1}) + "\n", encoding="utf-8")
    line = run_cli(["eval", str(tiny_cross_encoder(tmp_path / "ce")), "--sts", str(sts)], capsys)
    assert "is a cross-encoder" in line


def test_cli_prints_figures_and_json(beir_dir, minilm_dir, capsys):
    assert cli.main(["eval", str(minilm_dir), "--beir", str(beir_dir), "--max-length", "64",
                     "--prompt", "query=query: ", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompts"]["query"] == "query: "
    assert set(result["scores"]) == {"ndcg@10", "mrr@10", "recall@100", "map"}
    assert cli.main(["eval", str(minilm_dir), "--beir", str(beir_dir), "--max-length", "64"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"retrieval on {beir_dir}, test split: 5 queries, 8 documents (fp32")
    assert [line.split()[0] for line in out[1:]] == ["ndcg@10", "mrr@10", "recall@100", "map"]
