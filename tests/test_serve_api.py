"""`bertkit serve`'s contract beyond the core routes: one input length whatever the door, OpenAI's
model list and batch sizes, aliases, TEI's remaining routes and options, timing headers, and the
OpenAPI document that describes every route (and only those)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertkit import cli
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertModel
from bertkit.inference import Engine, classify, embed, rerank
from bertkit.serve import Limits, Service, build_app, load_model, openapi, parse_served_names

from model_fixtures import save_tiny
from web_fixtures import running_app

WAIT = 20.0
QUERY = "who plays music on the stage tonight?"
LONG = ["A man is playing a guitar on a small stage while the crowd sings along with every word of the song.",
        "Stocks fell sharply in early trading after the central bank raised interest rates by half a point.",
        "short one"]


@pytest.fixture(scope="module")
def dirs(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve_api")
    tok = BertTokenizer.from_pretrained(minilm_dir)
    # A reranker fine-tuned at 16 pieces: its tokenizer says so (what finetune --task rerank writes).
    trained = save_tiny(BertForSequenceClassification, tok, root / "trained", id2label={0: "LABEL_0"})
    config = json.loads((trained / "tokenizer_config.json").read_text())
    (trained / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 16}))
    # A sentence-transformers model with prompts and a Matryoshka size.
    st = save_tiny(BertModel, tok, root / "st")
    (st / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None, "truncate_dim": 12}))
    return {"minilm": Path(minilm_dir), "trained": trained, "st": st}


@pytest.fixture(scope="module")
def service(dirs) -> Service:
    models = {name: load_model(name, path) for name, path in dirs.items()}
    return Service(models, Limits(max_concurrent_requests=64),
                   aliases=parse_served_names(["text-embedding-3-small,ada", "trained=my-reranker"], list(models)))


@pytest.fixture(scope="module")
def client(service):
    with running_app(build_app(service), WAIT) as url, httpx.Client(base_url=url, timeout=WAIT) as c:
        yield c


# ---------------------------------------------------------------------------------------------
# one input length: the CLI, the library and every route agree past the trained length
# ---------------------------------------------------------------------------------------------
def test_every_door_reads_a_reranker_at_its_trained_length(client, dirs, capsys):
    trained = dirs["trained"]
    assert client.get("/info").json()["models"][1]["max_input_length"] == 16
    assert all(len(e.ids) > 16 for e in BertTokenizer.from_pretrained(dirs["minilm"]).encode_batch(LONG[:2]))
    library = rerank(trained, QUERY, LONG)  # a model dir, loaded as the library loads it
    served = client.post("/rerank", json={"query": QUERY, "texts": LONG, "model": "trained", "truncate": True}).json()
    assert [r["index"] for r in served] == [r["index"] for r in library]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(served, library)) <= 1e-5
    assert cli.main(["rerank", str(trained), *LONG, "--query", QUERY, "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(printed, library)) <= 1e-5
    # /predict on the same pairs and on single texts equals classify over the directory
    pairs = client.post("/predict", json={"inputs": [[QUERY, t] for t in LONG], "model": "my-reranker",
                                          "truncate": True, "raw_scores": True}).json()
    want = classify(trained, [QUERY] * 3, LONG, function="none")
    assert max(abs(p[0]["score"] - w["scores"]["LABEL_0"]) for p, w in zip(pairs, want)) <= 1e-5
    vectors = client.post("/embed", json={"inputs": LONG, "model": "trained", "truncate": True}).json()
    assert (torch.tensor(vectors) - embed(trained, LONG)).abs().max() <= 1e-5
    # without truncation the over-long pair is refused, naming the length
    refused = client.post("/rerank", json={"query": QUERY, "texts": LONG, "model": "trained"})
    assert refused.status_code == 422 and "max_input_length 16" in refused.json()["error"]


# ---------------------------------------------------------------------------------------------
# OpenAI: the model list, aliases, 2,048 inputs, token ids
# ---------------------------------------------------------------------------------------------
def test_v1_models_lists_models_and_aliases_in_openais_shape(client):
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    ids = {card["id"]: card for card in listed["data"]}
    assert set(ids) == {"minilm", "trained", "st", "text-embedding-3-small", "ada", "my-reranker"}
    assert all(c["object"] == "model" and isinstance(c["created"], int) and c["owned_by"] for c in ids.values())
    assert ids["ada"]["root"] == "minilm" and ids["my-reranker"]["root"] == "trained"
    assert client.get("/v1/models/ada").json() == ids["ada"]
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and "'ada'" in missing.json()["error"]["message"]


def test_an_alias_answers_as_its_model(client, dirs):
    body = client.post("/v1/embeddings", json={"input": ["a cat"], "model": "text-embedding-3-small"}).json()
    assert body["model"] == "text-embedding-3-small"
    assert (torch.tensor(body["data"][0]["embedding"]) - embed(dirs["minilm"], ["a cat"])[0]).abs().max() <= 1e-5
    assert client.get("/info").json()["aliases"] == ["text-embedding-3-small", "ada"]


def test_served_model_names_are_unique():
    assert parse_served_names(["x=a,b", "c"], ["x", "y"]) == {"a": "x", "b": "x", "c": "x"}
    with pytest.raises(ValueError, match="the name 'y' is taken"):
        parse_served_names(["y"], ["x", "y"])
    with pytest.raises(ValueError, match="the name 'a' is taken"):
        parse_served_names(["x=a", "y=a"], ["x", "y"])
    with pytest.raises(ValueError, match="no model is named 'z'"):
        parse_served_names(["z=a"], ["x"])


def test_v1_embeddings_takes_2048_inputs_admitted_in_slices(client, service, dirs):
    texts = [f"text number {i}" for i in range(2048)]
    seen = []
    real = service.admission.acquire

    def watched(n):
        seen.append(n)
        return real(n)

    service.admission.acquire = watched
    try:
        got = client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    finally:
        service.admission.acquire = real
    assert got.status_code == 200, got.text
    rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in got.json()["data"]])
    assert [d["index"] for d in got.json()["data"]] == list(range(2048))
    want = embed(dirs["minilm"], [texts[0], texts[777], texts[2047]]).numpy()
    assert np.abs(rows[[0, 777, 2047]] - want).max() <= 1e-5
    assert seen == [32]  # one slice's permits (half of 64) for the whole request
    assert service.admission.free == service.admission.capacity


# ---------------------------------------------------------------------------------------------
# TEI's other routes and options
# ---------------------------------------------------------------------------------------------
def test_embed_all_is_every_tokens_last_state(client, dirs):
    got = client.post("/embed_all", json={"inputs": ["a cat sat", "hello"]}).json()
    engine = Engine.load(dirs["minilm"])
    tokenizer = BertTokenizer.from_pretrained(dirs["minilm"])
    for text, rows in zip(["a cat sat", "hello"], got):
        ids = tokenizer.encode(text).ids
        assert len(rows) == len(ids)
        with torch.inference_mode():
            ref = engine.model(torch.tensor([ids])).last_hidden_state[0]
        assert (torch.tensor(rows) - ref).abs().max() <= 1e-4


def test_similarity_is_the_cosine_with_the_source(client, dirs):
    sentences = ["a man plays guitar", "stocks fell", "someone makes music"]
    got = client.post("/similarity", json={"inputs": {"source_sentence": "a musician performs",
                                                      "sentences": sentences}}).json()
    vectors = embed(dirs["minilm"], ["a musician performs", *sentences])
    want = F.normalize(vectors[1:], dim=-1) @ F.normalize(vectors[0], dim=-1)
    assert np.abs(np.array(got) - want.numpy()).max() <= 1e-5


def test_decode_is_tokenize_reversed(client):
    tokens = client.post("/tokenize", json={"inputs": "Paris is lovely."}).json()[0]
    ids = [t["id"] for t in tokens]
    assert client.post("/decode", json={"ids": ids}).json() == ["paris is lovely."]
    kept = client.post("/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False}).json()
    assert kept[0].startswith("[CLS] paris") and len(kept) == 2


def test_prompt_name_puts_the_models_prompt_first(client, dirs):
    got = client.post("/embed", json={"inputs": ["what is bert?"], "model": "st", "prompt_name": "query"}).json()
    assert (torch.tensor(got) - embed(dirs["st"], ["query: what is bert?"])).abs().max() <= 1e-5
    tokens = client.post("/tokenize", json={"inputs": "x", "model": "st", "prompt_name": "passage"}).json()[0]
    assert [t["text"] for t in tokens[1:-1]] == ["passage", ":", "x"]


def test_default_prompt_name_applies_where_a_request_names_none(dirs):
    model = load_model("st", dirs["st"])
    with pytest.raises(ValueError, match="'nope' is a prompt of no served model"):
        Service({"st": model}, default_prompt_name="nope")
    service = Service({"st": model}, default_prompt_name="query")
    with running_app(build_app(service), WAIT) as url:
        got = httpx.post(f"{url}/embed", json={"inputs": "what is bert?"}, timeout=WAIT).json()
    assert (torch.tensor(got) - embed(dirs["st"], ["query: what is bert?"])).abs().max() <= 1e-5


def test_dimensions_cut_and_renormalise_where_the_model_declares_it(client, dirs):
    full = embed(dirs["st"], ["a cat"], normalize=False)
    got = torch.tensor(client.post("/embed", json={"inputs": "a cat", "model": "st", "dimensions": 12}).json())
    assert got.shape == (1, 12) and (got - F.normalize(full[:, :12], dim=-1)).abs().max() <= 1e-5
    cut = client.post("/embed", json={"inputs": ["a cat", "a dog"], "model": "st", "dimensions": 12,
                                      "normalize": False})
    assert cut.status_code == 200
    both = embed(dirs["st"], ["a cat", "a dog"], normalize=False)
    assert (torch.tensor(cut.json()) - both[:, :12]).abs().max() <= 1e-5
    openai = client.post("/v1/embeddings", json={"input": "a cat", "model": "st", "dimensions": 8}).json()
    assert len(openai["data"][0]["embedding"]) == 8
    refused = client.post("/embed", json={"inputs": "a cat", "dimensions": 12})  # minilm declares none
    assert refused.status_code == 422 and "--allow-truncated-dimensions" in refused.json()["error"]


def test_allow_truncated_dimensions_takes_them_for_any_model(dirs):
    service = Service({"minilm": load_model("minilm", dirs["minilm"])}, allow_truncated_dimensions=True)
    with running_app(build_app(service), WAIT) as url:
        got = httpx.post(f"{url}/embed", json={"inputs": "a cat", "dimensions": 64}, timeout=WAIT)
    assert got.status_code == 200 and len(got.json()[0]) == 64


def test_timing_headers_as_tei_sends_them(client):
    got = client.post("/embed", json={"inputs": ["a cat", "a dog"]})
    headers = got.headers
    for name in ("x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert re.fullmatch(r"\d+", headers[name]), name
    assert headers["x-compute-type"] == "cpu" and headers["x-compute-characters"] == "10"
    assert int(headers["x-compute-tokens"]) == 8  # [CLS] a cat [SEP] twice
    assert "x-compute-time" not in client.get("/info").headers


# ---------------------------------------------------------------------------------------------
# the OpenAPI document and /docs
# ---------------------------------------------------------------------------------------------
def test_openapi_describes_every_route_and_only_those(client, service):
    from starlette.routing import Mount, Route

    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    described = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    app = build_app(service)
    served = {(r.path, m) for r in app.routes if isinstance(r, Route) for m in r.methods if m != "HEAD"}
    # The page's own script is an asset of /docs, like the files under the docs-assets mount.
    served.discard(("/docs/assets/swagger-ui-init.js", "GET"))
    assert [r.path for r in app.routes if isinstance(r, Mount)] == ["/docs/assets"]
    assert described == served
    assert document == openapi(service)
    for path, ops in document["paths"].items():
        for op in ops.values():
            if "requestBody" in op:
                assert {"422", "413"} <= set(op["responses"]), path


def test_docs_page_is_served_from_this_process(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert not re.search(r"(src|href)=\"https?://", page.text)  # nothing from a CDN
    for asset in re.findall(r"(?:src|href)=\"(/docs/assets/[^\"]+)\"", page.text):
        assert client.get(asset).status_code == 200, asset


def test_post_root_dispatches_as_tei_does(client, dirs):
    """huggingface_hub's InferenceClient posts TEI's requests to / ; the body and the model decide."""
    vectors = client.post("/", json={"inputs": ["a cat"]}).json()
    assert (torch.tensor(vectors) - embed(dirs["minilm"], ["a cat"])).abs().max() <= 1e-5
    similarity = client.post("/", json={"inputs": {"source_sentence": "a cat", "sentences": ["a dog"]}}).json()
    assert similarity == client.post("/similarity", json={"inputs": {"source_sentence": "a cat",
                                                                     "sentences": ["a dog"]}}).json()
    ranked = client.post("/", json={"query": "q", "texts": ["a", "b"], "model": "trained"}).json()
    assert [set(r) for r in ranked] == [{"index", "score"}] * 2
    predicted = client.post("/", json={"inputs": "a cat", "model": "trained"}).json()
    assert [p["label"] for p in predicted] == ["LABEL_0"]
    bad = client.post("/", json={"inputs": 5})
    assert bad.status_code == 422 and "`inputs` must be a string or a list" in bad.json()["error"]
