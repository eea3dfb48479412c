"""The explorer's API described and fuzzed as the service's is: GET /openapi.json lists every
route of the app (and only those), and schemathesis drives each operation from the document
against a real server on 127.0.0.1 (valid requests and ones the document forbids), checking
every answer: never a 5xx, status, content type and body as documented, a forbidden request
refused with a 4xx. Bounded by BERTKIT_FUZZ_EXAMPLES (10) per operation and mode."""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from bertkit.data.tokenizer import BertTokenizer  # noqa: E402
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification  # noqa: E402
from bertkit.encoder.model import BertForMaskedLM  # noqa: E402
from bertkit.explore import Explorer, build_app  # noqa: E402
from bertkit.explore.app import openapi  # noqa: E402

from model_fixtures import save_tiny  # noqa: E402
from web_fixtures import fuzz_operation, running_app  # noqa: E402

WAIT = 30.0
FUZZ_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "10"))
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "negative_data_rejection", "unsupported_method")
OPERATIONS = [(method, path) for path, ops in openapi()["paths"].items() for method in ops]


@pytest.fixture(scope="module")
def explorer(minilm_dir, tmp_path_factory) -> Explorer:
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    root = tmp_path_factory.mktemp("explore_fuzz")
    mlm = save_tiny(BertForMaskedLM, tokenizer, root / "mlm")
    return Explorer.load(mlm, [("sentiment", save_tiny(BertForSequenceClassification, tokenizer, root / "clf",
                                                       id2label={0: "neg", 1: "pos"})),
                               ("reader", save_tiny(BertForQuestionAnswering, tokenizer, root / "qa"))])


@pytest.fixture(scope="module")
def server(explorer):
    with running_app(build_app(explorer), WAIT) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


def test_openapi_describes_every_route_and_only_those(explorer):
    from starlette.routing import Mount, Route

    app = build_app(explorer)
    served = {(r.path, m) for r in app.routes if isinstance(r, Route) for m in r.methods if m != "HEAD"}
    served.discard(("/docs/assets/swagger-ui-init.js", "GET"))  # the page's script, an asset of /docs
    assert sorted(r.path for r in app.routes if isinstance(r, Mount)) == ["/docs/assets", "/static"]
    assert {(path, method.upper()) for method, path in OPERATIONS} == served


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_every_operation_answers_as_documented(api_schema, method, path, mode):
    operation = api_schema[path][method]
    if mode == "negative" and not operation.body:
        pytest.skip("no body to make invalid")
    statuses: Counter = Counter()

    def steer(case) -> None:
        """Valid requests reach the model: fill-mask's texts get a [MASK], a task gets its fields."""
        body = case.body
        if mode != "positive" or not isinstance(body, dict):
            return
        if path == "/api/fill-mask":
            body["texts"] = [t + " [MASK]" for t in body["texts"]]
        if path == "/api/task":
            for key in ("text", "question", "context"):
                if not (isinstance(body.get(key), str) and body[key].strip()):
                    body[key] = "the bank raised rates"
            body.pop("texts", None)
            body.pop("query", None)

    fuzz_operation(api_schema, method, path, mode, examples=FUZZ_EXAMPLES, checks=CHECKS, steer=steer,
                   statuses=statuses, wait=WAIT)
    print(f"{method.upper()} {path} ({mode}): {dict(sorted(statuses.items()))}")  # shown with -s
    assert statuses and not any(s >= 500 for s in statuses)


def test_the_explorer_still_answers_after_the_fuzzing(server):
    assert httpx.get(f"{server}/api/info", timeout=WAIT).status_code == 200
