"""`bertkit serve` over a real socket: uvicorn on 127.0.0.1 with an ephemeral port, httpx clients.

Every route's JSON shape is TEI's (or OpenAI's), and its numbers equal the library's on the same
engine (fp32: 1e-5): MiniLM for embeddings, tiny random models for the heads. Concurrency is
made deterministic by holding the model thread inside `Engine.run` (a gate) while requests pile
up, so batching across requests, 429s and dropped work of departed clients are checked without
timing luck; every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM
from bertkit.inference import classify, embed, fill_mask, ner, qa, rerank
from bertkit.serve import Limits, Service, build_app, load_model
from bertkit.serve.runners import RUNNERS
from bertkit.serve.scheduler import default_model_threads, thread_shares

from model_fixtures import save_tiny, save_tiny_m3
from web_fixtures import running_app, serve_process

SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument on stage tonight.",
             "Stocks fell.", "The central bank raised interest rates by a quarter of a point.",
             "Paris is the capital of France, and Berlin that of Germany."]
WAIT = 20.0  # seconds: the bound on every wait in this file


@pytest.fixture(scope="module")
def model_dirs(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    tok = BertTokenizer.from_pretrained(minilm_dir)
    return {"minilm": Path(minilm_dir),
            "mlm": save_tiny(BertForMaskedLM, tok, root / "mlm"),
            "clf": save_tiny(BertForSequenceClassification, tok, root / "clf", id2label={0: "neg", 1: "neu", 2: "pos"}),
            "cross": save_tiny(BertForSequenceClassification, tok, root / "cross", id2label={0: "LABEL_0"}),
            "ner": save_tiny(BertForTokenClassification, tok, root / "ner",
                         id2label={0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}),
            "qa": save_tiny(BertForQuestionAnswering, tok, root / "qa"),
            "m3": save_tiny_m3(tok, root / "m3")}


@pytest.fixture(scope="module")
def models(model_dirs):
    return {name: load_model(name, path) for name, path in model_dirs.items()}


@contextlib.contextmanager
def running(service: Service):
    """uvicorn serving `service` on 127.0.0.1:<ephemeral> in a thread; yields an httpx client."""
    with running_app(build_app(service), WAIT) as url, httpx.Client(base_url=url, timeout=WAIT) as client:
        yield client


@pytest.fixture(scope="module")
def client(models):
    with running(Service(dict(models), Limits(payload_limit=100_000))) as c:
        yield c


class Gate:
    """Holds the model thread inside `engine.run` until opened (made deterministic concurrency)."""

    def __init__(self, engine, monkeypatch):
        self.opened, self.entered = threading.Event(), threading.Event()
        real = engine.run

        def held(*args, **kwargs):
            self.entered.set()
            assert self.opened.wait(WAIT), "the gate was never opened"
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, "run", held)

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc) -> None:
        self.opened.set()  # never leave the model thread held, whatever the test did


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# every route: TEI's shapes, the library's numbers
# ---------------------------------------------------------------------------------------------
def test_embed_equals_the_library(client, models):
    engine = models["minilm"].engine
    got = client.post("/embed", json={"inputs": SENTENCES})
    assert got.status_code == 200
    assert (torch.tensor(got.json()) - embed(engine, SENTENCES)).abs().max() <= 1e-5
    raw = client.post("/embed", json={"inputs": SENTENCES[0], "normalize": False}).json()
    assert len(raw) == 1 and len(raw[0]) == 384  # a single string still answers a list of vectors
    assert (torch.tensor(raw) - embed(engine, SENTENCES[:1], normalize=False)).abs().max() <= 1e-5
    other = client.post("/embed", json={"inputs": ["a cat"], "model": "clf"}).json()  # any model embeds
    assert (torch.tensor(other) - embed(models["clf"].engine, ["a cat"])).abs().max() <= 1e-5


def test_openai_embeddings_float_and_base64(client, models):
    body = client.post("/v1/embeddings", json={"input": SENTENCES[:2], "model": "minilm"}).json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    tokenizer = BertTokenizer.from_pretrained(models["minilm"].engine.model_dir)
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(SENTENCES[:2]))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    expected = embed(models["minilm"].engine, SENTENCES[:2])
    assert (torch.tensor([d["embedding"] for d in body["data"]]) - expected).abs().max() <= 1e-5
    packed = client.post("/v1/embeddings", json={"input": SENTENCES[0], "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.abs(vector - expected[0].numpy()).max() <= 1e-5


def test_predict_texts_pairs_and_batches(client, models):
    engine = models["clf"].engine
    single = client.post("/predict", json={"inputs": SENTENCES[0], "model": "clf"}).json()
    assert [p["score"] for p in single] == sorted((p["score"] for p in single), reverse=True)
    assert {p["label"] for p in single} == {"neg", "neu", "pos"}
    ref = classify(engine, SENTENCES[:1])[0]["scores"]
    assert max(abs(p["score"] - ref[p["label"]]) for p in single) <= 1e-5
    pair = client.post("/predict", json={"inputs": [SENTENCES[0], SENTENCES[1]], "model": "clf"}).json()
    ref = classify(engine, SENTENCES[:1], SENTENCES[1:2])[0]["scores"]
    assert max(abs(p["score"] - ref[p["label"]]) for p in pair) <= 1e-5
    batch = client.post("/predict", json={"inputs": [SENTENCES[2], [SENTENCES[3]], [SENTENCES[0], SENTENCES[1]]],
                                          "model": "clf", "raw_scores": True}).json()
    assert len(batch) == 3 and all(len(row) == 3 for row in batch)
    ref = classify(engine, [SENTENCES[2], SENTENCES[3]], function="none")
    for got, want in zip(batch[:2], ref):
        assert max(abs(p["score"] - want["scores"][p["label"]]) for p in got) <= 1e-5
    assert {p["label"]: p["score"] for p in batch[2]} == pytest.approx(
        {p["label"]: p["score"] for p in client.post("/predict", json={
            "inputs": [SENTENCES[0], SENTENCES[1]], "model": "clf", "raw_scores": True}).json()}, abs=1e-5)


def test_rerank_sorted_with_text(client, models):
    query = "who plays music?"
    got = client.post("/rerank", json={"query": query, "texts": SENTENCES, "model": "cross",
                                       "return_text": True}).json()
    want = rerank(models["cross"].engine, query, SENTENCES)
    assert [r["index"] for r in got] == [r["index"] for r in want]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(got, want)) <= 1e-5
    assert all(r["text"] == SENTENCES[r["index"]] and set(r) == {"index", "score", "text"} for r in got)
    raw = client.post("/rerank", json={"query": query, "texts": SENTENCES, "model": "cross", "raw_scores": True}).json()
    assert set(raw[0]) == {"index", "score"}
    want = rerank(models["cross"].engine, query, SENTENCES, raw_scores=True)
    assert max(abs(a["score"] - b["score"]) for a, b in zip(raw, want)) <= 1e-5


def test_tokenize_ids_text_special_offsets(client, models):
    text = "Paris is lovely."
    got = client.post("/tokenize", json={"inputs": text}).json()
    assert len(got) == 1
    tokens = got[0]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["special"] and tokens[-1]["text"] == "[SEP]"
    tokenizer = BertTokenizer.from_pretrained(models["minilm"].engine.model_dir)
    assert [t["id"] for t in tokens] == tokenizer.encode(text).ids
    for t in tokens[1:-1]:
        assert not t["special"] and text[t["start"]:t["stop"]] == t["text"]
    bare = client.post("/tokenize", json={"inputs": [text, "b"], "add_special_tokens": False}).json()
    assert len(bare) == 2 and not any(t["special"] for t in bare[0]) and len(bare[0]) == len(tokens) - 2


def test_fill_mask_ner_qa_equal_the_library(client, models):
    texts = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK]."]
    got = client.post("/fill-mask", json={"inputs": texts, "model": "mlm", "top_k": 3}).json()
    want = fill_mask(models["mlm"].engine, texts, top_k=3)
    assert [len(masks) for masks in got] == [1, 2]
    for g_text, w_text in zip(got, want):
        for g, w in zip(g_text, w_text):
            assert [c["token"] for c in g] == [c.token for c in w]
            assert max(abs(c["score"] - d.score) for c, d in zip(g, w)) <= 1e-6
    single = client.post("/fill-mask", json={"inputs": texts[0], "model": "mlm", "top_k": 3}).json()
    assert [c["token"] for c in single[0]] == [c["token"] for c in got[0][0]]
    text = "John Smith lives in Paris."
    entities = client.post("/ner", json={"inputs": text, "model": "ner"}).json()
    want = ner(models["ner"].engine, [text])[0]
    assert entities and [{k: v for k, v in e.items() if k != "score"} for e in entities] == \
        [{k: v for k, v in e.items() if k != "score"} for e in want]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(entities, want)) <= 1e-6
    answers = client.post("/qa", json={"question": "where does he live?", "context": text,
                                       "model": "qa", "top_k": 2}).json()
    want = qa(models["qa"].engine, ["where does he live?"], [text], top_k=2)[0]
    assert [(a["text"], a["start"], a["end"]) for a in answers] == [(a["text"], a["start"], a["end"]) for a in want]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(answers, want)) <= 1e-6


def test_embed_sparse_equals_the_library_in_teis_shape(client, models):
    from bertkit.inference.sparse import embed_sparse

    texts = ["paris is the capital of france.", "the cat sat on the mat, and then it sat on the dog."]
    got = client.post("/embed_sparse", json={"inputs": texts, "model": "mlm"})
    assert got.status_code == 200, got.text
    want = embed_sparse(models["mlm"].engine, texts)
    for row, (ix, values) in zip(got.json(), want):
        assert [p["index"] for p in row] == ix.tolist()
        assert max(abs(p["value"] - v) for p, v in zip(row, values.tolist())) <= 1e-6
    (single,) = client.post("/embed_sparse", json={"inputs": texts[0], "model": "mlm"}).json()  # a list, as TEI
    assert [p["index"] for p in single] == [p["index"] for p in got.json()[0]]
    info = {m["name"]: m for m in client.get("/info").json()["models"]}["mlm"]
    assert info["model_type"] == {"embedding": {"pooling": "mean", "splade": {"pooling_strategy": "max",
                                                                              "activation_function": "relu"}}}


def test_m3_routes_equal_the_library(client, models):
    """A model in BGE-M3's layout: /embed_sparse gives its lexical weights in TEI's shape and
    /embed_multi its ColBERT vectors, as `encode_m3` gives them."""
    from bertkit.inference.m3 import encode_m3

    texts = ["paris is the capital of france.", "the cat sat on the mat."]
    want = encode_m3(models["m3"].engine, texts)
    sparse = client.post("/embed_sparse", json={"inputs": texts, "model": "m3"})
    assert sparse.status_code == 200, sparse.text
    for row, (ix, values) in zip(sparse.json(), want["sparse"]):
        assert [p["index"] for p in row] == ix.tolist()
        assert max(abs(p["value"] - v) for p, v in zip(row, values.tolist())) <= 1e-6
    multi = client.post("/embed_multi", json={"inputs": texts, "model": "m3"})
    assert multi.status_code == 200, multi.text
    for row, vectors in zip(multi.json(), want["colbert"]):
        assert np.abs(np.array(row) - vectors.numpy()).max() <= 1e-6
    info = {m["name"]: m for m in client.get("/info").json()["models"]}["m3"]
    assert info["uses"] == ["embed", "tokenize", "embed_sparse", "embed_multi"]
    assert info["model_type"] == {"embedding": {"pooling": "mean", "m3": {"colbert_dim": 29}}}


def test_health_info_metrics(client):
    assert client.get("/health").status_code == 200
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.content == b""
    info = client.get("/info").json()
    assert info["model_id"].endswith("model") and info["model_dtype"] == "float32"
    assert info["precision"] == "fp32" and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert {m["name"]: m["uses"] for m in info["models"]}["cross"] == ["embed", "tokenize", "predict", "rerank"]
    assert info["max_client_batch_size"] == 32 and info["max_concurrent_requests"] == 512
    client.post("/embed", json={"inputs": "counted"})
    client.post("/embed", json={"inputs": 3})
    text = client.get("/metrics").text
    ok = re.search(r'bertkit_requests_total\{outcome="success",route="/embed"\} (\d+)', text)
    bad = re.search(r'bertkit_requests_total\{outcome="validation",route="/embed"\} (\d+)', text)
    assert ok and int(float(ok.group(1))) >= 1 and bad and int(float(bad.group(1))) >= 1
    for name in ("bertkit_queue_duration_seconds_bucket", "bertkit_inference_duration_seconds_count",
                 "bertkit_batch_tokens_sum", "bertkit_batch_size_count", "bertkit_queue_size"):
        assert name in text


# ---------------------------------------------------------------------------------------------
# bad requests: each a 4xx naming the field or limit, and the server keeps serving
# ---------------------------------------------------------------------------------------------
BAD = [
    ("/embed", b"{not json", 422, "not valid JSON"),
    ("/embed", b"", 422, "no body"),
    ("/embed", [1, 2], 422, "must be a JSON object"),
    ("/embed", {"input": "x"}, 422, "unknown field `input`"),
    ("/embed", {"inputs": 5}, 422, "`inputs` must be a string or a list"),
    ("/embed", {"inputs": []}, 422, "`inputs` is an empty list"),
    ("/embed", {"inputs": ["ok", ""]}, 422, "`inputs[1]` is empty"),
    ("/embed", {"inputs": ["ok", 3]}, 422, "`inputs[1]` must be a string"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, 422, "`normalize` must be true or false"),
    ("/embed", {"inputs": ["x"] * 33}, 422, "33 inputs, more than max_client_batch_size 32"),
    ("/embed", {"inputs": "word " * 300}, 422, "`inputs[0]` is longer than max_input_length 256"),
    ("/embed", {"inputs": "x", "model": "nope"}, 404, "model 'nope' is not served"),
    ("/embed", {"inputs": "x", "dimensions": 8}, 422, "not trained for truncated embeddings"),
    ("/embed", {"inputs": "x", "dimensions": 385}, 422, "`dimensions` 385 is more than model 'minilm''s 384"),
    ("/embed", {"inputs": "x", "prompt_name": "query"}, 422, "`prompt_name` 'query' is not a prompt"),
    ("/embed", {"inputs": "x", "truncation_direction": "Left"}, 422, "`truncation_direction` must be"),
    ("/embed", {"inputs": "x", "inptus": "x"}, 422, "unknown field `inptus` for /embed (did you mean `inputs`?)"),
    ("/embed_all", {"inputs": []}, 422, "`inputs` is an empty list"),
    ("/embed_all", {"inputs": ["x"] * 33}, 422, "33 inputs, more than max_client_batch_size 32"),
    ("/similarity", {"inputs": {"source_sentence": "a"}}, 422, "missing field `inputs.sentences`"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"x": 1}}, 422,
     "unknown field `parameters.x`"),
    ("/decode", {"ids": [-1]}, 422, "`ids[0]` must be an integer greater than or equal to 0"),
    ("/decode", {"ids": [10 ** 9]}, 422, "past the vocabulary"),
    ("/decode", {"ids": "hello"}, 422, "`ids` must be a list of token ids"),
    ("/v1/embeddings", {"input": ["x"] * 2049}, 422, "2049 inputs, more than openai_max_batch_size 2048"),
    ("/v1/embeddings", {"input": [[1, 2], [3]]}, 422, "check_embedding_ctx_length=False"),
    ("/v1/embeddings", {"input": "x", "model": "text-embedding-3-small"}, 404, "is not served here"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 422, "`encoding_format`"),
    ("/v1/embeddings", {"input": [1, 2]}, 422, "`input` holds token ids; this server reads text"),
    ("/rerank", {"query": "q", "texts": ["a"]}, 424, "does not serve rerank"),
    ("/rerank", {"texts": ["a"], "model": "cross"}, 422, "missing field `query`"),
    ("/predict", {"inputs": [["a", "b", "c"]], "model": "clf"}, 422, "`inputs[0]` has 3 items, more than 2"),
    ("/predict", {"inputs": [["a"], 5], "model": "clf"}, 422, "`inputs[1]` must be a string or a list"),
    ("/fill-mask", {"inputs": "no mask here", "model": "mlm"}, 422, "has no [MASK]"),
    ("/embed_sparse", {"inputs": "x"}, 424, "does not serve embed_sparse"),
    ("/embed_sparse", {"inputs": [], "model": "mlm"}, 422, "`inputs` is an empty list"),
    ("/embed_sparse", {"inputs": "x", "model": "mlm", "truncation_direction": "Left"}, 422,
     "`truncation_direction` must be"),
    ("/embed_sparse", {"inputs": "x", "model": "mlm", "prompt_name": "query"}, 422, "is not a prompt"),
    ("/embed_sparse", {"inputs": "word " * 300, "model": "mlm", "truncate": False}, 422, "longer than"),
    ("/embed_multi", {"inputs": "x"}, 424, "does not serve embed_multi"),
    ("/embed_multi", {"inputs": "x", "model": "mlm"}, 424, "does not serve embed_multi"),
    ("/embed_multi", {"inputs": [], "model": "m3"}, 422, "`inputs` is an empty list"),
    ("/embed_multi", {"inputs": ["x"] * 33, "model": "m3"}, 422, "33 inputs, more than max_client_batch_size 32"),
    ("/embed_multi", {"inputs": "x", "model": "m3", "prompt_name": "query"}, 422, "is not a prompt"),
    ("/embed_multi", {"inputs": "word " * 300, "model": "m3", "truncate": False}, 422, "longer than"),
    ("/fill-mask", {"inputs": "a [MASK]", "model": "mlm", "top_k": 0}, 422, "`top_k` must be an integer"),
    ("/qa", {"question": ["a", "b"], "context": ["c", "d", "e"], "model": "qa"}, 422, "`context` has 3"),
    ("/embed", b'{"inputs": "' + b"x" * 100_001 + b'"}', 413, "payload limit of 100,000 bytes"),
    ("/adapters", {"name": "topics", "path": "topics"}, 403, "adapters at run time is off"),
    ("/search", {"query": "x"}, 404, "no index is served here; start the server with --index NAME=INDEX_DIR"),
    ("/search", {"query": "x", "top_k": 0}, 422, "`top_k` must be an integer greater than or equal to 1"),
    ("/search", {"query": "x", "candidates": -1}, 422, "`candidates` must be an integer greater than or equal"),
    ("/search", {"query": []}, 422, "`query` is an empty list"),
]


@pytest.mark.parametrize("route,body,status,message", BAD, ids=[f"{r}-{m[:24]}" for r, _, _, m in BAD])
def test_bad_request(client, route, body, status, message):
    if isinstance(body, bytes):
        got = client.post(route, content=body, headers={"content-type": "application/json"})
    else:
        got = client.post(route, json=body)
    assert got.status_code == status, got.text
    if route.startswith("/v1/"):  # OpenAI's error shape, so OpenAI's clients show the message
        error = got.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
        assert message in error["message"], error
    else:
        assert set(got.json()) == {"error", "error_type"} and message in got.json()["error"], got.json()
    assert client.get("/health").status_code == 200


def test_unknown_route_is_a_json_404(client):
    got = client.get("/nowhere")
    assert got.status_code == 404 and got.json()["error_type"] == "not_found"


@pytest.mark.parametrize("route", ["/health", "/ready"])
def test_probes_take_get_only(client, route):
    got = client.post(route, json={"inputs": "x"})
    assert got.status_code == 405 and set(got.json()) == {"error", "error_type"}
    assert "GET /ready" in got.json()["error"] and "GET /health" in got.json()["error"]


def test_a_draining_server_is_alive_not_ready_and_still_answers(models):
    service = Service({"minilm": models["minilm"]}, Limits())
    with running(service) as c:
        assert c.get("/ready").status_code == 200
        service.draining = True  # what SIGTERM sets (serve's on_signal)
        ready = c.get("/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        assert ready.json()["error_type"] == "unhealthy" and "draining" in ready.json()["error"]
        assert c.get("/health").status_code == 200
        assert c.post("/embed", json={"inputs": "still answered"}).status_code == 200


def test_one_bad_request_in_a_merged_run_fails_alone(client, models, monkeypatch):
    with Gate(models["mlm"].engine, monkeypatch) as gate, ThreadPoolExecutor(3) as pool:
        first = pool.submit(client.post, "/fill-mask", json={"inputs": "a [MASK] b", "model": "mlm"})
        assert gate.entered.wait(WAIT)
        good = pool.submit(client.post, "/fill-mask", json={"inputs": "the [MASK] is red", "model": "mlm"})
        bad = pool.submit(client.post, "/fill-mask", json={"inputs": "nothing to fill", "model": "mlm"})
        time.sleep(0.2)  # both queued behind the gate: they share one run
        gate.opened.set()
        assert first.result(WAIT).status_code == 200 and good.result(WAIT).status_code == 200
        assert bad.result(WAIT).status_code == 422


# ---------------------------------------------------------------------------------------------
# batching across requests, back-pressure, departed clients
# ---------------------------------------------------------------------------------------------
def test_concurrent_requests_are_batched_and_equal_each_alone(client, models, monkeypatch):
    engine = models["minilm"].engine
    alone = [embed(engine, [s]) for s in SENTENCES * 2]
    before = engine.stats.batches
    with Gate(engine, monkeypatch) as gate, ThreadPoolExecutor(len(alone)) as pool:
        futures = [pool.submit(client.post, "/embed", json={"inputs": s}) for s in SENTENCES * 2]
        assert gate.entered.wait(WAIT)
        time.sleep(0.3)  # the other requests queue up behind the held run
        gate.opened.set()
        results = [f.result(WAIT) for f in futures]
    assert all(r.status_code == 200 for r in results)
    for got, want in zip(results, alone):
        assert (torch.tensor(got.json()) - want).abs().max() <= 1e-5
    batches = engine.stats.batches - before
    assert batches < len(alone), f"{len(alone)} requests took {batches} engine batches"


def test_overload_is_429_with_retry_after_and_recovers(models, monkeypatch):
    service = Service({"minilm": models["minilm"]}, Limits(max_concurrent_requests=2, max_client_batch_size=2))
    with running(service) as c, Gate(models["minilm"].engine, monkeypatch) as gate, \
            ThreadPoolExecutor(2) as pool:
        held = [pool.submit(c.post, "/embed", json={"inputs": s}) for s in SENTENCES[:2]]
        until(lambda: service.admission.free == 0, "both permits to be taken")
        refused = c.post("/embed", json={"inputs": "one more"})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error_type"] == "overloaded" and "max_concurrent_requests 2" in refused.json()["error"]
        assert c.get("/health").status_code == 200  # refusing work is not being unhealthy
        full = c.get("/ready")  # but it is not being ready: a balancer should send work elsewhere
        assert full.status_code == 429 and full.json()["error_type"] == "overloaded"
        assert "all max_concurrent_requests 2 inputs are in flight" in full.json()["error"]
        gate.opened.set()
        assert [f.result(WAIT).status_code for f in held] == [200, 200]
        assert c.post("/embed", json={"inputs": "again"}).status_code == 200
        assert c.get("/ready").status_code == 200
        assert 'outcome="overloaded"' in c.get("/metrics").text
    assert service.admission.free == 2


def test_model_threads_split_torch_threads_and_default_to_two_on_the_cpu(models):
    assert thread_shares(5, 2) == [3, 2] and thread_shares(4, 4) == [1, 1, 1, 1] and thread_shares(8, 1) == [None]
    with pytest.raises(ValueError, match="--model-threads 3 is more than the 2 torch threads"):
        thread_shares(2, 3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert default_model_threads([models["minilm"]]) == 2
        torch.set_num_threads(1)
        assert default_model_threads([models["minilm"]]) == 1
    finally:
        torch.set_num_threads(threads)


class Gates:
    """Holds every model thread that enters `engine.run` until opened, noting which threads."""

    def __init__(self, engine, monkeypatch):
        self.opened, self.inside, self.lock = threading.Event(), set(), threading.Lock()
        real = engine.run

        def held(*args, **kwargs):
            with self.lock:
                self.inside.add(threading.get_ident())
            assert self.opened.wait(WAIT), "the gate was never opened"
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, "run", held)


def test_two_model_threads_run_side_by_side_and_answer_as_one_does(models, monkeypatch):
    """With model_threads=2, a second run starts while the first is held (two threads inside the
    engine at once), and every answer equals the library's for its input alone."""
    engine = models["minilm"].engine
    alone = [embed(engine, [s]) for s in SENTENCES * 2]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    gates = Gates(engine, monkeypatch)
    try:
        with running(Service({"minilm": models["minilm"]}, model_threads=2)) as c, \
                ThreadPoolExecutor(len(alone)) as pool:
            futures = [pool.submit(c.post, "/embed", json={"inputs": s}) for s in SENTENCES * 2]
            until(lambda: len(gates.inside) == 2, "both model threads to be inside a run")
            gates.opened.set()
            results = [f.result(WAIT) for f in futures]
    finally:
        gates.opened.set()
        torch.set_num_threads(threads)
    assert all(r.status_code == 200 for r in results)
    for got, want in zip(results, alone):
        assert (torch.tensor(got.json()) - want).abs().max() <= 1e-5


def test_two_model_threads_never_use_an_engines_tokenizer_at_once(models, monkeypatch):
    """fill-mask, NER and QA tokenize on the model thread with the engine's own tokenizer, whose
    truncation is state: over two model threads their runs on one engine take turns (a run that
    found another inside would be recorded), and each answers as the library does alone."""
    text = "John Smith lives in Paris."
    want = [{k: v for k, v in e.items() if k != "score"} for e in ner(models["ner"].engine, [text])[0]]
    inside, overlaps, lock = [0], [0], threading.Lock()
    real = RUNNERS["ner"]

    def watched(model, key, items):
        with lock:
            inside[0] += 1
            overlaps[0] += inside[0] > 1
        time.sleep(0.02)  # long enough for the other model thread to come in, were it let
        try:
            return real(model, key, items)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setitem(RUNNERS, "ner", watched)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with running(Service({"ner": models["ner"]}, model_threads=2)) as c, ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: c.post("/ner", json={"inputs": text}).json(), range(24)))
    finally:
        torch.set_num_threads(threads)
    assert overlaps[0] == 0
    assert all([{k: v for k, v in e.items() if k != "score"} for e in got] == want for got in results)


def test_a_departed_client_has_its_work_dropped(models, monkeypatch):
    engine = models["minilm"].engine
    service = Service({"minilm": models["minilm"]}, Limits())
    with running(service) as c, Gate(engine, monkeypatch) as gate, ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(c.post, "/embed", json={"inputs": "holds the model thread"})
        assert gate.entered.wait(WAIT)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(str(c.base_url).rstrip("/") + "/embed", json={"inputs": ["left", "early"]}, timeout=0.5)
        until(lambda: service.admission.in_flight == 1, "the departed request's permits to return")
        sequences = engine.stats.sequences
        gate.opened.set()
        assert blocker.result(WAIT).status_code == 200
        until(lambda: not service.scheduler._queue, "the queue to empty")
        assert engine.stats.sequences == sequences + 1  # the blocker only: the other was dropped
    assert service.admission.free == service.admission.capacity


# ---------------------------------------------------------------------------------------------
# the command: default bind, SIGTERM drains, the CLI error contract
# ---------------------------------------------------------------------------------------------
def test_cli_binds_loopback_by_default_and_sigterm_finishes_in_flight(model_dirs):
    """SIGTERM: /ready turns 503 at once while /health stays 200, for --drain-seconds every request
    is still answered (the one in flight and new ones), then the port closes and the process exits 0."""
    parser = cli.command_parsers(cli.build_parser())["serve"]
    assert parser.parse_args([str(model_dirs["minilm"])]).host == "127.0.0.1"
    assert parser.parse_args([str(model_dirs["minilm"])]).drain_seconds == 0
    with serve_process([str(model_dirs["minilm"]), f"mlm={model_dirs['mlm']}", "--port", "0", "--threads", "1",
                        "--drain-seconds", "5"]) as (proc, url):
        assert url.startswith("http://127.0.0.1:")
        long_batch = {"inputs": [" ".join(SENTENCES * 4)] * 32, "truncate": True}
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(httpx.post, f"{url}/embed", json=long_batch, timeout=60)
            # SIGTERM only once the server holds the request (a fixed sleep raced a slow start)
            deadline = time.monotonic() + 30
            while "bertkit_inputs_in_flight 32.0" not in httpx.get(f"{url}/metrics", timeout=30).text:
                assert time.monotonic() < deadline and not in_flight.done(), "the request never got in flight"
                time.sleep(0.02)
            assert httpx.get(f"{url}/ready", timeout=30).status_code == 200
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while (ready := httpx.get(f"{url}/ready", timeout=30)).status_code != 503:
                assert time.monotonic() < deadline, "/ready never said no after SIGTERM"
                time.sleep(0.02)
            assert "draining" in ready.json()["error"]
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
            late = httpx.post(f"{url}/embed", json={"inputs": "sent while draining"}, timeout=60)
            assert late.status_code == 200
            response = in_flight.result(60)
        assert response.status_code == 200 and len(response.json()) == 32
        assert proc.wait(30) == 0


def test_cli_serve_errors_are_one_line(model_dirs, tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path / "missing")]) == 2
    assert "missing is not a local directory (it does not exist)" in capsys.readouterr().err
    assert cli.main(["serve", f"minilm={model_dirs['minilm']}", f"minilm={model_dirs['mlm']}"]) == 2
    assert "two models are named 'minilm'" in capsys.readouterr().err
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        assert cli.main(["serve", str(model_dirs["mlm"]), "--port", str(busy.getsockname()[1])]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        busy.close()
    assert cli.main(["serve", str(model_dirs["mlm"]), "--max-client-batch-size", "600"]) == 2
    assert "more than --max-concurrent-requests 512" in capsys.readouterr().err
    assert cli.main(["serve", str(model_dirs["mlm"]), "--drain-seconds", "-1"]) == 2
    assert "--drain-seconds must be 0 or more, got -1" in capsys.readouterr().err
    assert cli.main(["serve", str(model_dirs["mlm"]), "--model-threads", "0"]) == 2
    assert "--model-threads must be at least 1, got 0" in capsys.readouterr().err
    assert cli.main(["serve", str(model_dirs["mlm"]), "--threads", "2", "--model-threads", "3"]) == 2
    assert "--model-threads 3 is more than the 2 torch threads (--threads)" in capsys.readouterr().err


def test_listening_socket_is_tcp_so_answers_are_sent_without_nagle_delay():
    from bertkit.util.web import listen

    sock = listen("127.0.0.1", 0)
    try:  # asyncio sets TCP_NODELAY on accepted sockets only when proto says TCP
        assert sock.proto == socket.IPPROTO_TCP
        client = socket.create_connection(sock.getsockname())
        accepted, _ = sock.accept()
        assert accepted.proto == socket.IPPROTO_TCP
        accepted.close()
        client.close()
    finally:
        sock.close()


def test_api_key_is_required_except_on_health(models):
    with running(Service({"minilm": models["minilm"]}, Limits(), api_key="s3cret")) as c:
        refused = c.post("/embed", json={"inputs": "x"})
        assert refused.status_code == 401 and refused.json()["error_type"] == "unauthorized"
        assert c.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/metrics").status_code == 401
        assert c.get("/health").status_code == 200
        assert c.get("/ready").status_code == 200  # a balancer's probe carries no key either


def test_freed_heap_memory_is_given_back_between_runs(models, monkeypatch):
    """On glibc the model thread calls malloc_trim at most every TRIM_EVERY seconds, timed in /metrics."""
    from bertkit.serve import scheduler

    if scheduler._trimmer() is None:
        pytest.skip("not glibc: there is no malloc_trim to call")
    monkeypatch.setattr(scheduler, "TRIM_EVERY", 0.0)  # after every run
    service = Service({"minilm": models["minilm"]})

    def trims(c) -> float:
        text = c.get("/metrics").text
        line = next(line for line in text.splitlines() if line.startswith("bertkit_memory_trim_duration_seconds_count"))
        return float(line.split()[-1])

    with running(service) as c:
        for s in SENTENCES[:3]:
            assert c.post("/embed", json={"inputs": s}).status_code == 200
        # The trim follows a run's answers, so the last one may still be under way: wait, bounded.
        deadline = time.monotonic() + 10
        while trims(c) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trims(c) >= 3
