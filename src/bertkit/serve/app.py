"""The app: every route listed once (`ROUTES`: path, method, handler and what the OpenAPI
document says of it), the API key, one error shape, timing headers, /openapi.json and /docs.

Handlers live in routes.py (TEI's routes and ours) and openai.py (OpenAI's); request and answer
models in schemas.py, from which validation and the document are both made (`webapi`). Every
route goes through `_route`, which checks the API key, turns any `ServeError` into its status and
`{error, error_type}` body (errors.py), adds text-embeddings-inference's timing headers to a
computed answer, and counts the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bertkit import __version__
from bertkit.serve import adapters, openai, routes, schemas, search
from bertkit.serve.errors import ErrorType, ServeError
from bertkit.serve.responses import JSONResponse
from bertkit.serve.scheduler import Scheduler
from bertkit.serve.service import ARRIVED, TIMING, Service
from bertkit.util import web
from bertkit.util.webapi import Operation, docs_routes, document

log = logging.getLogger(__name__)

# TEI's timing headers, on every answer that ran a model or the tokenizer (milliseconds).
HEADERS = {
    "x-compute-type": "where the model ran: cpu or cuda",
    "x-compute-time": "milliseconds from the request's arrival to its answer",
    "x-compute-characters": "characters of the inputs",
    "x-compute-tokens": "tokens of the inputs (an estimate from characters for fill-mask, ner and qa)",
    "x-total-time": "milliseconds from the request's arrival to its answer",
    "x-tokenization-time": "milliseconds spent tokenizing",
    "x-queue-time": "milliseconds its inputs waited for the model thread",
    "x-inference-time": "milliseconds of the model runs its inputs were part of",
}
TIMED = tuple(HEADERS)
RAW_TIMED = tuple(name.encode("latin-1") for name in TIMED)

BODY_ERRORS = (401, 404, 413, 422, 424, 429, 500, 503)  # a model route: every way it can fail
GET_ERRORS = (401,)


@dataclass(frozen=True)
class RouteSpec:
    handler: Callable[[Service, Request], Any]
    operation: Operation
    open_route: bool = False  # answered without the API key


def _op(path: str, method: str, name: str, summary: str, request=None, response=None,
        errors=BODY_ERRORS, timed: bool = True, **more: Any) -> Operation:
    if path.startswith("/v1/"):
        more["error_model"] = schemas.OpenAIErrorResponse
    return Operation(path, method, name, summary, request, response, errors, headers=TIMED if timed else (), **more)


ROUTES: list[RouteSpec] = [
    RouteSpec(routes.route_compat, _op("/", "post", "compat", "TEI's catch-all: /embed, /predict, /rerank or "
                                       "/similarity, by the body and the model's head", schemas.CompatRequest,
                                       schemas.CompatResponse)),
    RouteSpec(routes.route_embed, _op("/embed", "post", "embed", "Sentence embeddings (TEI)",
                                      schemas.EmbedRequest, schemas.EmbedResponse)),
    RouteSpec(routes.route_embed_all, _op("/embed_all", "post", "embed_all", "Every token's vector, "
                                          "not pooled (TEI)", schemas.EmbedAllRequest, schemas.EmbedAllResponse)),
    RouteSpec(routes.route_embed_sparse, _op("/embed_sparse", "post", "embed_sparse", "SPLADE sparse "
                                             "embeddings from a masked-LM head, or BGE-M3's lexical weights (TEI)",
                                             schemas.EmbedSparseRequest, schemas.EmbedSparseResponse)),
    RouteSpec(routes.route_embed_multi, _op("/embed_multi", "post", "embed_multi", "Multi-vector embeddings: "
                                            "a unit vector per token from a multi-vector head (BGE-M3's "
                                            "ColBERT vectors)", schemas.EmbedMultiRequest,
                                            schemas.EmbedMultiResponse)),
    RouteSpec(routes.route_similarity, _op("/similarity", "post", "similarity", "Cosine similarity of "
                                           "sentences to a source sentence (TEI)", schemas.SimilarityRequest,
                                           schemas.SimilarityResponse)),
    RouteSpec(openai.route_embeddings, _op("/v1/embeddings", "post", "openai_embeddings", "Embeddings in "
                                           "OpenAI's shape", schemas.OpenAIEmbeddingRequest,
                                           schemas.OpenAIEmbeddingResponse)),
    RouteSpec(openai.route_models, _op("/v1/models", "get", "openai_models", "The served models and "
                                       "aliases, in OpenAI's shape", response=schemas.ModelList,
                                       errors=GET_ERRORS, timed=False)),
    RouteSpec(openai.route_model, _op("/v1/models/{model}", "get", "openai_model", "One served model or "
                                      "alias, in OpenAI's shape", response=schemas.ModelCard,
                                      errors=(401, 404), timed=False,
                                      parameters=({"name": "model", "in": "path", "required": True,
                                                   "schema": {"type": "string"}},))),
    RouteSpec(routes.route_rerank, _op("/rerank", "post", "rerank", "Texts ordered by a cross-encoder's "
                                       "relevance to a query (TEI)", schemas.RerankRequest, schemas.RerankResponse)),
    RouteSpec(routes.route_predict, _op("/predict", "post", "predict", "Labels of texts or pairs (TEI)",
                                        schemas.PredictRequest, schemas.PredictResponse)),
    RouteSpec(routes.route_tokenize, _op("/tokenize", "post", "tokenize", "Tokens with ids and character "
                                         "spans (TEI)", schemas.TokenizeRequest, schemas.TokenizeResponse,
                                         timed=False)),
    RouteSpec(routes.route_decode, _op("/decode", "post", "decode", "Token ids back to text (TEI)",
                                       schemas.DecodeRequest, schemas.DecodeResponse, timed=False)),
    RouteSpec(routes.route_fill_mask, _op("/fill-mask", "post", "fill_mask", "Candidates for each [MASK]",
                                          schemas.FillMaskRequest, schemas.FillMaskResponse)),
    RouteSpec(routes.route_ner, _op("/ner", "post", "ner", "Named entities", schemas.NerRequest,
                                    schemas.NerResponse)),
    RouteSpec(routes.route_qa, _op("/qa", "post", "qa", "Answer spans of questions in contexts",
                                   schemas.QARequest, schemas.QAResponse)),
    RouteSpec(search.route_search, _op("/search", "post", "search", "Documents of a served index (--index) "
                                       "for queries, with the passage that matched", schemas.SearchRequest,
                                       schemas.SearchResponse)),
    RouteSpec(routes.route_health, _op("/health", "get", "health", "200 when the model thread runs",
                                       errors=(503,), timed=False, media_type=None), open_route=True),
    # for a load balancer: 200 only while new work is welcome (model thread up, not draining, a
    # permit free), so /health stays a liveness check that a full or stopping replica still passes
    RouteSpec(routes.route_ready, _op("/ready", "get", "ready", "200 while this replica takes new work: the "
                                      "model thread runs, no SIGTERM yet, an admission permit free",
                                      errors=(429, 503), timed=False, media_type=None), open_route=True),
    RouteSpec(routes.route_info, _op("/info", "get", "info", "The default model, every model and index, the "
                                     "limits (TEI)",
                                     response=schemas.Info, errors=GET_ERRORS, timed=False)),
    RouteSpec(routes.route_metrics, _op("/metrics", "get", "metrics", "Prometheus metrics", errors=GET_ERRORS,
                                        timed=False, media_type="text/plain")),
    # LoRA adapters at run time (serve/adapters.py): on with --adapter-root and --api-key, else 403
    RouteSpec(adapters.route_load, _op("/adapters", "post", "load_adapter", "Load a LoRA adapter directory "
                                       "under --adapter-root as a model name", adapters.AdapterRequest,
                                       adapters.AdapterInfo, errors=(401, 403, 404, 413, 422, 500), timed=False)),
    RouteSpec(adapters.route_drop, _op("/adapters/{name}", "delete", "drop_adapter", "Drop a loaded adapter "
                                       "(requests queued for it finish first)", response=adapters.AdapterDropped,
                                       errors=(401, 403, 404), timed=False,
                                       parameters=({"name": "name", "in": "path", "required": True,
                                                    "schema": {"type": "string"}},))),
]


def openapi(service: Service | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the service: every route of ROUTES, /openapi.json and /docs."""
    own = [Operation("/openapi.json", "get", "openapi", "This document (OpenAPI 3.1)"),
           Operation("/docs", "get", "docs", "This document, rendered (Swagger UI, served from this "
                     "process)", media_type="text/html")]
    description = ("BERT models over HTTP: text-embeddings-inference's routes and JSON, OpenAI's "
                   "/v1/embeddings and /v1/models, and fill-mask, NER and QA. Every error answers "
                   "{error, error_type}.")
    out = document("bertkit serve", __version__, description, [r.operation for r in ROUTES] + own,
                   schemas.ErrorResponse, HEADERS, security=service is not None and service.api_key is not None)
    # the names `model` takes here, so clients and gateways can check them (not while adapters come and go)
    if service is not None and (service.adapters is None or service.adapters.root is None):
        names = service.names()
        for schema in out["components"]["schemas"].values():
            field = schema.get("properties", {}).get("model")
            if field is not None and "anyOf" in field and schema.get("additionalProperties") is False:
                field["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
    return out


def error_response(err: ServeError, openai: bool = False) -> JSONResponse:
    """TEI's `{error, error_type}`; on OpenAI's routes OpenAI's `{error: {message, type, param, code}}`."""
    body = ({"error": {"message": err.message, "type": err.error_type.value, "param": None, "code": err.status}}
            if openai else err.body())
    return JSONResponse(body, status_code=err.status, headers=err.headers())


def timing_headers(service: Service, request: Request, response: Response) -> None:
    timing = request.scope.get(TIMING)
    if timing is None:
        return
    total = round((time.perf_counter() - timing.start) * 1000)
    device = next(iter(service.models.values())).engine.device.type
    values = (device, total, timing.characters, timing.tokens, total, round(timing.tokenization * 1000),
              round(timing.queue * 1000), round(timing.inference * 1000))
    # appended as raw pairs: none of them is set yet, and MutableHeaders scans the list per name
    response.raw_headers.extend((name, str(value).encode("latin-1")) for name, value in zip(RAW_TIMED, values))


def _route(service: Service, name: str, handler, open_route: bool = False):
    openai = name.startswith("/v1/")
    # the route's metric series, looked up once (prometheus_client's labels() hashes and locks)
    seconds = service.metrics.request_seconds.labels(name)
    answered: dict[str, Any] = {}

    async def endpoint(request: Request) -> Response:
        start = request.scope[ARRIVED] = time.perf_counter()
        outcome = "success"
        try:
            if service.api_key and not open_route:
                sent = request.headers.get("authorization", "")
                if not hmac.compare_digest(sent.encode(), f"Bearer {service.api_key}".encode()):
                    raise ServeError(ErrorType.UNAUTHORIZED, "missing or wrong API key; send the "
                                     "header `Authorization: Bearer <key>` given to --api-key")
            response = await handler(service, request)
            timing_headers(service, request, response)
            return response
        except ServeError as err:
            outcome = err.error_type.value
            return error_response(err, openai)
        except asyncio.CancelledError:
            outcome = "disconnected"
            raise
        except Exception as err:  # noqa: BLE001  a bug must answer 500, not drop the connection
            outcome = ErrorType.BACKEND.value
            log.exception("%s failed", name)
            return error_response(ServeError(ErrorType.BACKEND, f"{name} failed: {type(err).__name__}: {err}"), openai)
        finally:
            counter = answered.get(outcome)
            if counter is None:
                counter = answered[outcome] = service.metrics.requests.labels(name, outcome)
            counter.inc()
            seconds.observe(time.perf_counter() - start)

    return endpoint


class ExactRoutes:
    """The ASGI app in front of Starlette's: a request whose method and path are a route's exactly
    goes straight to its endpoint (`_route`'s, which answers every error itself); the rest (the
    lifespan, /docs, routes with path parameters, 404s and 405s) goes through Starlette.

    Why: every request's event-loop work is time the model threads' cores lose. Starlette's
    stack (two middlewares, the router trying each route's pattern in turn, the exception
    wrappers around `send`) was a quarter of the event loop's time per /embed request under load.
    """

    def __init__(self, app: Starlette, endpoints: dict[tuple[str, str], Callable[[Request], Any]]):
        self.app, self.endpoints = app, endpoints

    @property
    def routes(self) -> list:
        """Every route served (Starlette's table: the exact ones are in it too)."""
        return self.app.routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            endpoint = self.endpoints.get((scope["method"], scope["path"]))
            if endpoint is not None:
                scope["app"] = self.app
                response = await endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(service: Service) -> ExactRoutes:
    """The ASGI app over `service`; its model thread starts and stops with the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.scheduler = Scheduler(service.limits.max_batch_tokens, service.metrics, service.model_threads)
        try:
            yield
        finally:  # uvicorn has stopped taking connections and waited for the open ones
            await service.scheduler.stop()

    listed = [f"{r.operation.method.upper()} {r.operation.path}" for r in ROUTES]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = ErrorType.NOT_FOUND if exc.status_code == 404 else ErrorType.VALIDATION
        message = (f"no route {request.method} {request.url.path}; routes: {', '.join(listed)}, "
                   "GET /openapi.json, GET /docs")
        response = error_response(ServeError(kind, message))
        response.status_code = exc.status_code
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    document_json = JSONResponse(openapi(service)).body

    async def openapi_json(request: Request) -> Response:
        return Response(document_json, media_type="application/json")

    endpoints = {(r.operation.method.upper(), r.operation.path): _route(service, r.operation.path, r.handler,
                                                                          r.open_route) for r in ROUTES}
    app_routes = [Route(path, endpoint, methods=[method]) for (method, path), endpoint in endpoints.items()]
    app_routes += [Route("/openapi.json", openapi_json, methods=["GET"]),
                   *docs_routes("/openapi.json", "bertkit serve")]
    app = Starlette(routes=app_routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    return ExactRoutes(app, {key: endpoint for key, endpoint in endpoints.items() if "{" not in key[1]})


def serve(service: Service, host: str = "127.0.0.1", port: int = 8080, *, sockets=None,
          graceful_timeout: float = 30.0, drain_seconds: float = 0.0) -> None:
    """Run the service under uvicorn until SIGINT/SIGTERM: then /ready answers 503 while every
    request is still served for `drain_seconds` (a balancer's probes take the replica out of its
    pool), then stop taking connections, finish the requests in flight (up to `graceful_timeout`
    s), drain the model thread, return (exit 0)."""

    def draining() -> None:
        service.draining = True

    web.run(build_app(service), sockets=sockets, host=host, port=port, graceful_timeout=graceful_timeout,
            lifespan="on", drain=drain_seconds, on_signal=draining)
