"""`bertkit serve` fuzzed from its own OpenAPI document: schemathesis generates requests for every
operation (valid ones and ones the document forbids) against a real server on 127.0.0.1, and
checks each answer: never a 5xx, status, content type, headers and body as the document says,
and a request the document forbids refused with a 4xx. Bounded (FUZZ_EXAMPLES per operation and
mode, derandomized) so it runs in seconds; bench/fuzz_serve.py runs the same checks for ~10,000
requests. The regression tests at the end are what earlier runs found, kept as plain requests.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from bertkit.data.tokenizer import BertTokenizer  # noqa: E402
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification  # noqa: E402
from bertkit.encoder.model import BertForMaskedLM  # noqa: E402
from bertkit.serve import Limits, Service, build_app, load_model  # noqa: E402
from bertkit.serve.app import ROUTES  # noqa: E402

from model_fixtures import save_tiny, save_tiny_m3  # noqa: E402
from web_fixtures import fuzz_operation, running_app  # noqa: E402

WAIT = 20.0
FUZZ_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "10"))
# Every check but positive_data_acceptance: a request the document allows may still be refused
# for what only the server knows (a text past the model's length, a route the named model's head
# does not serve, more inputs than --max-client-batch-size), each with its 4xx.
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
          "missing_required_header", "unsupported_method")


def fuzz_models(minilm_dir: Path, root: Path) -> dict:
    """One model of each head (tiny, random) beside MiniLM, so every route has a model to run."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    dirs = {"minilm": Path(minilm_dir),
            "mlm": save_tiny(BertForMaskedLM, tok, root / "mlm"),
            "clf": save_tiny(BertForSequenceClassification, tok, root / "clf", id2label={0: "neg", 1: "pos"}),
            "cross": save_tiny(BertForSequenceClassification, tok, root / "cross", id2label={0: "LABEL_0"}),
            "ner": save_tiny(BertForTokenClassification, tok, root / "ner", id2label={0: "O", 1: "B-PER", 2: "I-PER"}),
            "qa": save_tiny(BertForQuestionAnswering, tok, root / "qa"),
            "m3": save_tiny_m3(tok, root / "m3")}
    return {name: load_model(name, path) for name, path in dirs.items()}


def fuzz_index(minilm_dir: Path, root: Path, models: dict) -> dict:
    """A small MiniLM index (BM25 beside it), so /search runs its retrieval, not only validation."""
    from bertkit.inference import Engine
    from bertkit.retrieval import build_index
    from bertkit.serve.search import load_indexes

    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "text": "{t}"}}\n' for i, t in enumerate(
        ["Stocks fell.", "The team won the cup final.", "Rates rose again.", "A film about jazz opened."])))
    build_index(corpus, Engine.load(minilm_dir, use="embed", max_length=64), root / "index", progress=False)
    return load_indexes([("news", str(root / "index"))], models)


@pytest.fixture(scope="module")
def server(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    models = fuzz_models(minilm_dir, root)
    service = Service(models, Limits(payload_limit=200_000), aliases={"text-embedding-3-small": "minilm"},
                      indexes=fuzz_index(minilm_dir, root, models))
    with running_app(build_app(service), WAIT) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


OPERATIONS = [(r.operation.method, r.operation.path) for r in ROUTES] + [("get", "/openapi.json"), ("get", "/docs")]


# A valid request that names no model goes to the default (MiniLM), which serves embed and
# tokenize only: 424 elsewhere. So valid requests to a head's route are sent to a model with that
# head, and fill-mask's texts get a [MASK], so that the model code runs, not only validation.
HEAD_OF = {"/rerank": "cross", "/predict": "clf", "/fill-mask": "mlm", "/ner": "ner", "/qa": "qa",
           "/embed_sparse": "mlm", "/embed_multi": "m3"}


def steer(case, path: str, mode: str) -> None:
    if path == "/v1/models/{model}" and mode == "positive" and len(case.path_parameters["model"]) % 2:
        case.path_parameters["model"] = "text-embedding-3-small"  # half the names exist
    body = case.body
    if path == "/search" and mode == "positive" and isinstance(body, dict):
        body.pop("index", None)  # the served index, and the served cross-encoder when one is named
        if body.get("rerank") is not None:
            body["rerank"] = "cross"
            body["candidates"] = max(body.get("candidates", 100), body.get("top_k", 10))
        elif "rerank_weight" in body:
            body["rerank_weight"] = 1.0
        return
    if mode != "positive" or not isinstance(body, dict) or path not in HEAD_OF or body.get("model") is not None:
        return
    body["model"] = HEAD_OF[path]
    if path == "/fill-mask":
        inputs = body["inputs"]
        body["inputs"] = inputs + " [MASK]" if isinstance(inputs, str) else [t + " [MASK]" for t in inputs]


def fuzz(api_schema, method: str, path: str, mode: str, examples: int, statuses: Counter) -> None:
    """`examples` generated requests (`mode`: positive or negative) to one operation, each checked."""
    fuzz_operation(api_schema, method, path, mode, examples=examples, checks=CHECKS,
                   steer=lambda case: steer(case, path, mode), statuses=statuses, wait=WAIT)


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_every_operation_answers_as_documented(api_schema, method, path, mode):
    operation = api_schema[path][method]
    if mode == "negative" and not operation.body:
        pytest.skip("no body to make invalid (a path's `model` is any string)")
    statuses: Counter = Counter()
    fuzz(api_schema, method, path, mode, FUZZ_EXAMPLES, statuses)
    print(f"{method.upper()} {path} ({mode}): {dict(sorted(statuses.items()))}")  # shown with -s
    assert statuses and not any(s >= 500 for s in statuses)


def test_the_server_still_answers_after_the_fuzzing(server):
    assert httpx.get(f"{server}/health", timeout=WAIT).status_code == 200


# ---------------------------------------------------------------------------------------------
# what the fuzzing found, kept as plain requests
# ---------------------------------------------------------------------------------------------
def test_an_empty_model_name_is_not_the_default_model(server):
    """Found: `"model": ""` answered as the default model, though no model has that name."""
    got = httpx.post(f"{server}/embed", json={"inputs": "x", "model": ""}, timeout=WAIT)
    assert got.status_code == 404 and "model '' is not served here" in got.json()["error"]
    assert httpx.post(f"{server}/embed", json={"inputs": "x", "model": None}, timeout=WAIT).status_code == 200


def test_the_document_asks_for_a_key_only_when_the_server_has_one(minilm_dir):
    """Found: every route was documented as needing `Authorization` on a server without --api-key."""
    from bertkit.serve import openapi

    model = {"minilm": load_model("minilm", minilm_dir)}
    open_doc = openapi(Service(model))
    assert "securitySchemes" not in open_doc["components"]
    assert not any("security" in op for ops in open_doc["paths"].values() for op in ops.values())
    keyed = openapi(Service(model, api_key="k"))
    assert keyed["paths"]["/embed"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in keyed["paths"]["/health"]["get"]  # /health never needs the key


def test_health_is_documented_as_an_empty_answer(server):
    """Found: /health was documented as text/plain, and answers 200 with no body or Content-Type."""
    document = httpx.get(f"{server}/openapi.json", timeout=WAIT).json()
    assert "content" not in document["paths"]["/health"]["get"]["responses"]["200"]
    got = httpx.get(f"{server}/health", timeout=WAIT)
    assert got.status_code == 200 and got.content == b""


def test_no_enum_of_the_document_spells_one_value_twice():
    """Found (by generating a client): `truncation_direction` listed "Right" and "right", and
    openapi-python-client refused the document (two constants named RIGHT)."""
    from bertkit.serve import openapi

    def enums(node):
        if isinstance(node, dict):
            if "enum" in node:
                yield node["enum"]
            for value in node.values():
                yield from enums(value)
        elif isinstance(node, list):
            for value in node:
                yield from enums(value)

    for values in enums(openapi()):
        names = [str(v).upper() for v in values]
        assert len(set(names)) == len(names), values
