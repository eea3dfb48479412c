"""POST /search (`bertkit serve --index NAME=DIR`): the answer equals the library's `Searcher.search`
on the same index (documents, passages, offsets, scores), with a served reranker and hybrid
fusion too; queries are embedded on the model thread in the same runs as /embed's requests; an
index whose model is not served gets its own; bad requests are 4xx naming the field."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.inference import Engine
from bertkit.retrieval import Searcher, build_index
from bertkit.retrieval.multivector import build_multivector
from bertkit.serve import Limits, Service, build_app, load_model
from bertkit.serve.search import load_indexes, parse_index_args

from model_fixtures import save_tiny
from retrieval_fixtures import tiny_encoder, write_corpus
from web_fixtures import hold_runs, running_app

WAIT = 20.0
DOCS = ["The central bank raised interest rates by a quarter of a point on Tuesday. Markets had expected it. "
        "Shares in banks rose while the pound fell against the dollar. Economists said more rises would follow "
        "before the end of the year, as inflation stayed well above the target.",
        "The home side won the cup final after extra time. Their striker scored twice in the second half. "
        "The manager praised the defence, which had not conceded a goal in five matches.",
        "A new film about the life of a jazz musician opened in cinemas this week. Critics praised the music "
        "and the lead actor, who learned to play the trumpet for the part.",
        "The election was won by the opposition party, which took most seats in the north. Turnout was the "
        "highest in twenty years. The new prime minister promised lower taxes.",
        "Scientists found water ice near the south pole of the moon. The space agency plans to land a rover "
        "there within three years."]
QUERIES = ["who won the election?", "interest rates and inflation", "a film about jazz"]


@pytest.fixture(scope="module")
def setup(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    corpus = write_corpus(root / "corpus.jsonl", DOCS)
    engine = Engine.load(minilm_dir, use="embed", max_length=32)  # 30-piece passages: several per document
    build_index(corpus, engine, root / "news", progress=False)
    build_index(corpus, engine, root / "plain", progress=False, bm25=False, passage_tokens=0)
    build_index(corpus, engine, root / "cls", progress=False, bm25=False, pooling="cls", normalize=False)
    tiny_dir = tiny_encoder(root / "tiny-model")
    tiny_corpus = write_corpus(root / "tiny.jsonl", ["the cat sees a red ball", "a dog runs in the park",
                                                     "the team wins the big game"])
    build_index(tiny_corpus, tiny_dir, root / "tiny", progress=False)
    build_multivector(root / "tiny", tiny_dir)  # its multi-vector side: systems / weighted fusion
    cross = save_tiny(BertForSequenceClassification, BertTokenizer.from_pretrained(minilm_dir), root / "cross",
                      id2label={0: "LABEL_0"})
    models = {"minilm": load_model("minilm", minilm_dir), "cross": load_model("cross", cross)}
    indexes = load_indexes(parse_index_args([f"news={root / 'news'}", f"plain={root / 'plain'}",
                                             f"tiny={root / 'tiny'}", f"cls={root / 'cls'}"]), models)
    service = Service(models, Limits(), indexes=indexes)
    with running_app(build_app(service), WAIT) as url, httpx.Client(base_url=url, timeout=WAIT) as client:
        yield {"root": root, "client": client, "models": models, "service": service, "cross": cross,
               "minilm": minilm_dir, "tiny": tiny_dir}


def library(setup, index: str, queries, **options) -> list[list[dict]]:
    model = setup["tiny"] if index == "tiny" else setup["minilm"]
    searcher = Searcher.open(setup["root"] / index, model=model, rerank=options.pop("rerank", None))
    return [[h.to_dict() for h in hits] for hits in searcher.search(queries, **options)]


def same(got: list[dict], want: list[dict], tol: float = 1e-5) -> None:
    assert [h["id"] for h in got] == [h["id"] for h in want]
    for g, w in zip(got, want):
        assert (g["passage"], g["start"], g["end"], g["passage_number"]) == \
            (w["passage"], w["start"], w["end"], w["passage_number"])
        assert abs(g["score"] - w["score"]) <= tol


def test_search_equals_the_library_and_shares_the_served_model(setup):
    client = setup["client"]
    got = client.post("/search", json={"query": QUERIES, "top_k": 3})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["index"] == "news" and body["model"] == "minilm" and body["reranker"] is None
    assert set(body["timings"]) == {"embed_ms", "retrieve_ms", "rerank_ms", "total_ms"}
    assert "x-inference-time" in got.headers
    for docs, want in zip(body["documents"], library(setup, "news", QUERIES, top_k=3)):
        same(docs, want)
        assert all(d["passage"] == DOCS[int(d["id"][1:])][d["start"]:d["end"]] for d in docs)
    assert body["documents"][0][0]["id"] == "d3"  # the election
    one = client.post("/search", json={"query": QUERIES[0], "top_k": 2, "return_text": True}).json()
    assert isinstance(one["documents"][0], dict) and one["documents"][0]["text"] == DOCS[3]


def test_rerank_by_a_served_cross_encoder_and_hybrid_equal_the_library(setup):
    client = setup["client"]
    got = client.post("/search", json={"query": QUERIES, "top_k": 3, "candidates": 5, "rerank": "cross",
                                       "rerank_weight": 0.5})
    assert got.status_code == 200, got.text
    want = library(setup, "news", QUERIES, top_k=3, candidates=5, rerank=setup["cross"], rerank_weight=0.5)
    for docs, w in zip(got.json()["documents"], want):
        # The three queries' pairs share model runs here, one query's alone in the library: fp32
        # noise (~1e-6 in a logit) that the fused score, in standard deviations of a random
        # model's close logits, magnifies.
        same(docs, w, tol=1e-4)
        assert all(abs(d["rerank_score"] - x["rerank_score"]) <= 1e-5 for d, x in zip(docs, w))
    for fusion in ("rrf", "zscore"):
        got = client.post("/search", json={"query": QUERIES, "top_k": 4, "candidates": 5, "hybrid": fusion})
        assert got.status_code == 200, got.text
        for docs, w in zip(got.json()["documents"], library(setup, "news", QUERIES, top_k=4, candidates=5,
                                                            hybrid=fusion)):
            same(docs, w)
            assert all(d["bm25_score"] is not None for d in docs)


def test_an_index_pooled_otherwise_than_the_model_is_queried_the_same_way(setup):
    """An index built with --pooling cls and raw vectors: its queries are pooled and left as the index's."""
    assert setup["service"].indexes["cls"].run_key == ("cls",)
    got = setup["client"].post("/search", json={"query": QUERIES, "index": "cls", "top_k": 3})
    assert got.status_code == 200, got.text
    for docs, want in zip(got.json()["documents"], library(setup, "cls", QUERIES, top_k=3)):
        same(docs, want, tol=1e-4)  # raw (not unit) vectors: inner products of a larger scale


def test_an_index_of_an_unserved_model_gets_its_own(setup):
    tiny = setup["service"].indexes["tiny"]
    assert tiny.own_model and tiny.model.name == "index/tiny"
    assert not setup["service"].indexes["news"].own_model
    got = setup["client"].post("/search", json={"query": "a red ball", "index": "tiny", "top_k": 2})
    assert got.status_code == 200, got.text
    same(got.json()["documents"], library(setup, "tiny", ["a red ball"], top_k=2)[0])
    info = setup["client"].get("/info").json()
    assert [(i["name"], i["own_model"], i["model"]) for i in info["indexes"]] == \
        [("news", False, "minilm"), ("plain", False, "minilm"), ("tiny", True, "index/tiny"), ("cls", False, "minilm")]
    assert info["indexes"][0]["passages"] > len(DOCS) and info["indexes"][1]["passages"] == len(DOCS)


def test_search_queries_share_model_runs_with_embed_requests(setup, monkeypatch):
    """Held inside a run, the model thread finds an /embed and a /search queued, and runs them as one."""
    engine = setup["models"]["minilm"].engine
    client = setup["client"]
    scheduler = setup["service"].scheduler
    opened, entered = hold_runs(monkeypatch, engine, WAIT)
    try:
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(client.post, "/embed", json={"inputs": "hold the thread"})
            assert entered.wait(WAIT)
            runs = scheduler.runs
            embed = pool.submit(client.post, "/embed", json={"inputs": "an embedding"})
            search = pool.submit(client.post, "/search", json={"query": QUERIES[0], "top_k": 1})
            time.sleep(0.5)  # both queue up behind the held run
            opened.set()
            assert first.result(WAIT).status_code == 200 and embed.result(WAIT).status_code == 200
            assert search.result(WAIT).json()["documents"][0]["id"] == "d3"
        assert scheduler.runs - runs == 2  # the held run, then /embed and /search's query together
    finally:
        opened.set()


BAD = [
    ({"query": "x", "index": "nope"}, 404, "index 'nope' is not served here; `index` must be one of 'news', 'plain', "
     "'tiny'"),
    ({"query": "x", "top_k": 0}, 422, "`top_k` must be an integer greater than or equal to 1"),
    ({"query": "x", "top_k": 1001}, 422, "`top_k` must be an integer less than or equal to 1000"),
    ({"query": "x", "top_k": "3"}, 422, "`top_k` must be an integer"),
    ({"query": ""}, 422, "`query` is empty"),
    ({"query": ["x"] * 33}, 422, "33 inputs, more than max_client_batch_size 32"),
    ({"query": "word " * 40}, 422, "`query[0]` is longer than 32 tokens (the length index 'news' was built at)"),
    ({"query": "x", "rerank": "minilm"}, 424, "does not serve rerank"),
    ({"query": "x", "rerank": "nope"}, 404, "model 'nope' is not served"),
    ({"query": "x", "rerank_weight": 0.5}, 422, "this search has no reranker; pass `rerank`"),
    ({"query": "x", "rerank": "cross", "top_k": 20, "candidates": 10}, 422, "raise `candidates`"),
    ({"query": "x", "index": "plain", "hybrid": "rrf"}, 422, "has no BM25 index for hybrid search"),
    ({"query": "x", "hybrid": "bm25"}, 422, "`hybrid`"),
    ({"query": "x", "systems": ["multivector"]}, 422, "index 'news' has none; build it with `bertkit index "
     "--multi-vector`"),
    ({"query": "x", "index": "tiny", "systems": ["dense", "multivector"]}, 422,
     "dense + multivector are several rankings: pass a fusion (`hybrid` rrf, zscore or weighted)"),
    ({"query": "x", "systems": ["colbert"]}, 422, "`systems[0]`"),
    ({"query": "x", "systems": []}, 422, "`systems`"),
    ({"query": "x", "hybrid": "weighted", "systems": ["dense", "dense", "bm25", "bm25"]}, 422, "`systems`"),
    ({"query": "x", "qurey": "y"}, 422, "unknown field `qurey`"),
]


@pytest.mark.parametrize("request_body,status,message", BAD, ids=[m[:32] for _, _, m in BAD])
def test_bad_search_requests(setup, request_body, status, message):
    got = setup["client"].post("/search", json=request_body)
    assert got.status_code == status, got.text
    assert message in got.json()["error"], got.json()
    assert setup["client"].get("/health").status_code == 200


@pytest.mark.parametrize("options", [{"systems": ["multivector"]},
                                     {"hybrid": "weighted", "systems": ["dense", "bm25", "multivector"]},
                                     {"hybrid": "rrf", "systems": ["dense", "multivector"]}])
def test_multivector_and_weighted_fusion_equal_the_library(setup, options):
    got = setup["client"].post("/search", json={"query": ["a red ball", "the park"], "index": "tiny", "top_k": 3,
                                               **options})
    assert got.status_code == 200, got.text
    searcher = Searcher.open(setup["root"] / "tiny", model=setup["tiny"], multi_vector=True)
    want = [[h.to_dict() for h in hits] for hits in searcher.search(["a red ball", "the park"], top_k=3, **options)]
    for g, w in zip(got.json()["documents"], want):
        same(g, w)
        assert [h["multivector_score"] for h in g] == pytest.approx([h["multivector_score"] for h in w], abs=1e-5)


def test_a_long_query_is_cut_when_asked(setup):
    got = setup["client"].post("/search", json={"query": "election " * 40, "truncate": True, "top_k": 1})
    assert got.status_code == 200 and got.json()["documents"][0]["id"] == "d3"


def test_index_arguments(tmp_path):
    assert parse_index_args(["a=x", "y/z/"]) == [("a", "x"), ("z", "y/z/")]
    with pytest.raises(ValueError, match="two indexes are named 'a'"):
        parse_index_args(["a=x", "a=y"])
    with pytest.raises(FileNotFoundError, match="no index at"):
        load_indexes([("a", str(tmp_path / "missing"))], {})
    (tmp_path / "half").mkdir()
    with pytest.raises(ValueError, match="not a finished index"):
        load_indexes([("a", str(tmp_path / "half"))], {})


def test_cli_serve_index_flag_reaches_the_service(setup, monkeypatch, capsys):
    """`bertkit serve MODEL --index NAME=DIR` loads the index beside the models and says which model embeds it."""
    from bertkit import cli
    from bertkit.serve import app

    seen = {}
    monkeypatch.setattr(app.web, "run", lambda built, **kw: seen.setdefault("app", built))
    code = cli.main(["serve", f"minilm={setup['minilm']}", "--index", f"news={setup['root'] / 'news'}",
                     "--port", "0"])
    out = capsys.readouterr().out
    assert code in (0, None) and "app" in seen
    assert "index news:" in out and "queries embedded by model minilm" in out, out
    assert cli.main(["serve", f"minilm={setup['minilm']}", "--index", f"x={setup['root'] / 'missing'}"]) == 2
    assert "no index at" in capsys.readouterr().err
