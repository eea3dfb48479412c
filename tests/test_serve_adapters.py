"""Adapters in `bertkit serve`: named like models, answered as their merged twins answer, batched
together over one base, loaded and dropped at run time inside --adapter-root only; the two
admin routes fuzzed from the OpenAPI document against a temporary adapter root."""

from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertModel
from bertkit.inference import Engine, classify, embed
from bertkit.serve import Limits, Service, build_app, load_model
from bertkit.serve.adapters import ServedAdapters, parse_adapter_args

from adapter_fixtures import make_adapter
from model_fixtures import save_tiny
from web_fixtures import hold_runs, running_app

WAIT = 20.0
KEY = {"Authorization": "Bearer s3cret"}
TEXTS = ["Shares fell sharply in early trading.", "The striker scored twice", "new phones"]


@pytest.fixture(scope="module")
def root(tmp_path_factory, minilm_dir):
    """An adapter root holding a tiny base's adapters (and their merged twins beside it)."""
    top = tmp_path_factory.mktemp("adapters")
    base = save_tiny(BertModel, BertTokenizer.from_pretrained(minilm_dir), top / "base", seed=3)
    (top / "root").mkdir()
    made = {"topics": make_adapter(base, top / "root" / "topics", BertForSequenceClassification, seed=1,
                                   labels=["business", "sport", "politics"]),
            "sentiment": make_adapter(base, top / "root" / "sentiment", BertForSequenceClassification, seed=2,
                                      targets=("query", "value"), labels=["neg", "pos"]),
            "vectors": make_adapter(base, top / "root" / "vectors", BertModel, seed=7, use="embed")}
    return top, base, made


def make_service(root, **options) -> Service:
    top, base, made = root
    models = {"base": load_model("base", base)}
    adapters = ServedAdapters.attach(models, top / "root")
    for name in ("topics", "sentiment", "vectors"):
        models[name] = adapters.load(name, made[name][0])
    return Service(models, Limits(), adapters=adapters, **options)


def client_for(service: Service):
    class Running:
        def __enter__(self):
            self._app = running_app(build_app(service), WAIT)
            url = self._app.__enter__()
            self.client = httpx.Client(base_url=url, timeout=WAIT, headers=KEY if service.api_key else None)
            return self.client

        def __exit__(self, *exc):
            self.client.close()
            self._app.__exit__(*exc)

    return Running()


def test_adapters_answer_as_their_merged_twins(root):
    _, _, made = root
    service = make_service(root)
    with client_for(service) as client:
        for name in ("topics", "sentiment"):
            got = client.post("/predict", json={"inputs": TEXTS, "model": name})
            assert got.status_code == 200, got.text
            twin = classify(Engine.load(made[name][1], use="classify"), TEXTS)
            for ours, theirs in zip(got.json(), twin):
                best = max(ours, key=lambda s: s["score"])
                assert best["label"] == theirs["label"] and abs(best["score"] - theirs["score"]) < 1e-5
        got = client.post("/v1/embeddings", json={"input": TEXTS, "model": "vectors"})
        assert got.status_code == 200, got.text
        twin = embed(Engine.load(made["vectors"][1], use="embed"), TEXTS)
        ours = np.array([row["embedding"] for row in got.json()["data"]])
        assert np.allclose(ours, twin.numpy(), atol=1e-5)
        info = client.get("/info").json()
        adapters = {m["name"]: m for m in info["models"] if m.get("base")}
        assert set(adapters) == {"topics", "sentiment", "vectors"} and adapters["topics"]["base"] == "base"
        assert adapters["sentiment"]["adapter"]["labels"] == ["neg", "pos"]
        cards = {c["id"]: c["root"] for c in client.get("/v1/models").json()["data"]}
        assert cards["topics"] == "base" and cards["base"] == "base"
        missing = client.post("/predict", json={"inputs": "x", "model": "nope"})
        assert missing.status_code == 404 and "adapters loaded: 'topics', 'sentiment', 'vectors'" in missing.text


def test_requests_for_several_adapters_share_one_run(root, monkeypatch):
    _, _, made = root
    service = make_service(root)
    base_engine = service.models["base"].engine
    opened, entered = hold_runs(monkeypatch, base_engine, WAIT)
    with client_for(service) as client, ThreadPoolExecutor(4) as pool:
        first = pool.submit(client.post, "/embed", json={"inputs": "hold the model thread", "model": "base"})
        assert entered.wait(WAIT)
        runs = service.scheduler.runs
        asked = {name: pool.submit(client.post, "/predict", json={"inputs": TEXTS, "model": name})
                 for name in ("topics", "sentiment")}
        time.sleep(0.3)  # both queued behind the held run
        opened.set()
        assert first.result(WAIT).status_code == 200
        answers = {name: f.result(WAIT) for name, f in asked.items()}
        assert service.scheduler.runs - runs == 2  # the held embed run, then one run for both adapters
        for name, got in answers.items():
            twin = classify(Engine.load(made[name][1], use="classify"), TEXTS)
            assert [max(r, key=lambda s: s["score"])["label"] for r in got.json()] == [t["label"] for t in twin]


def test_load_and_drop_at_run_time_inside_the_root_only(root, tmp_path, monkeypatch):
    top, _, made = root
    service = make_service(root, api_key="s3cret")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = top / "root" / "link"
    if not link.exists():
        os.symlink(outside, link)
    half = top / "root" / "half"
    half.mkdir(exist_ok=True)
    (half / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    with client_for(service) as client:
        keyless = httpx.post(f"{client.base_url}/adapters", json={"name": "x", "path": "topics/adapter"})
        assert keyless.status_code == 401
        got = client.post("/adapters", json={"name": "topics2", "path": "topics/adapter"})
        assert got.status_code == 200, got.text
        assert got.json()["base"] == "base" and got.json()["labels"] == ["business", "sport", "politics"]
        assert client.post("/predict", json={"inputs": "x", "model": "topics2"}).status_code == 200
        assert "topics2" in {c["id"] for c in client.get("/v1/models").json()["data"]}
        for path in ("../base", str(outside), "link"):
            refused = client.post("/adapters", json={"name": "evil", "path": path})
            assert refused.status_code == 403 and "outside the --adapter-root" in refused.json()["error"], path
        refused = client.post("/adapters", json={"name": "half", "path": "half"})
        assert refused.status_code == 422 and "adapter_config.json is missing" in refused.json()["error"]
        taken = client.post("/adapters", json={"name": "base", "path": "topics/adapter"})
        assert taken.status_code == 422 and "is taken" in taken.json()["error"]
        # a drop waits for the requests queued for the adapter, then refuses new ones by name
        opened, entered = hold_runs(monkeypatch, service.models["base"].engine, WAIT)
        with ThreadPoolExecutor(3) as pool:
            hold = pool.submit(client.post, "/embed", json={"inputs": "hold", "model": "base"})
            assert entered.wait(WAIT)
            queued = pool.submit(client.post, "/predict", json={"inputs": TEXTS, "model": "topics2"})
            time.sleep(0.2)
            dropped = pool.submit(client.delete, "/adapters/topics2")
            time.sleep(0.2)
            assert not dropped.done()  # waits for the queued request
            opened.set()
            assert hold.result(WAIT).status_code == 200
            assert queued.result(WAIT).status_code == 200
            assert dropped.result(WAIT).json() == {"name": "topics2", "dropped": True}
        gone = client.post("/predict", json={"inputs": "x", "model": "topics2"})
        assert gone.status_code == 404
        again = client.delete("/adapters/topics2")
        assert again.status_code == 404 and "loaded adapters: 'topics', 'sentiment', 'vectors'" in again.text
        assert client.post("/predict", json={"inputs": "x", "model": "topics"}).status_code == 200


def test_adapter_arguments():
    assert parse_adapter_args(["a=dir", "b=x/y@base"]) == [("a", "dir", None), ("b", "x/y", "base")]
    with pytest.raises(ValueError, match="NAME=ADAPTER_DIR"):
        parse_adapter_args(["nodir"])
    with pytest.raises(ValueError, match="two adapters are named 'a'"):
        parse_adapter_args(["a=x", "a=y"])


def test_admin_routes_fuzzed_against_a_temporary_root(root):
    """schemathesis on POST /adapters and DELETE /adapters/{name} (everything else is fuzzed in
    test_serve_fuzz.py): never a 5xx, every answer as the document says."""
    schemathesis = pytest.importorskip("schemathesis")
    from test_serve_fuzz import FUZZ_EXAMPLES, fuzz

    service = make_service(root)
    with running_app(build_app(service), WAIT) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        for method, path in (("post", "/adapters"), ("delete", "/adapters/{name}")):
            for mode in ("positive", "negative") if method == "post" else ("positive",):
                statuses: Counter = Counter()
                fuzz(schema, method, path, mode, FUZZ_EXAMPLES, statuses)
                assert statuses and not any(s >= 500 for s in statuses), statuses
        assert httpx.get(f"{url}/health", timeout=WAIT).status_code == 200
