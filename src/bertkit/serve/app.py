"""The HTTP routes: thin handlers over the scheduler (parse → admit → tokenize → run → shape).

TEI's routes and JSON (`router/src/http/server.rs`): POST /embed, /rerank, /predict, /tokenize;
GET /health, /info, /metrics; OpenAI's POST /v1/embeddings; and the uses TEI lacks: POST
/fill-mask, /ner, /qa. Every route goes through `_route`, which checks the API key, turns any
`ServeError` into its status and `{error, error_type}` body (errors.py), and counts the outcome.
Limits and admission live in limits.py, request shapes in schemas.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import torch
import torch.nn.functional as F
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSONResponse
from starlette.responses import Response
from starlette.routing import Route

from bertkit import __version__, web
from bertkit.inference.classify import score_function
from bertkit.inference.tokens import tokens
from bertkit.serve import schemas
from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.limits import Admission, Limits
from bertkit.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from bertkit.serve.models import ServedModel
from bertkit.serve.scheduler import Scheduler

log = logging.getLogger(__name__)

try:
    import orjson
except ImportError:  # the serve extra installs it; without it Python's json writes the answers
    orjson = None


class JSONResponse(_StarletteJSONResponse):
    """Starlette's JSONResponse, encoded by orjson when installed: it encodes an embedding about
    twenty times faster than Python's json, on the event loop every request passes through."""

    def render(self, content: Any) -> bytes:
        if orjson is None:
            return super().render(content)
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


@dataclass
class Service:
    """What the handlers share: the models (first = default), limits, admission, queue, metrics."""
    models: dict[str, ServedModel]
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("a service needs at least one model")
        self.default = next(iter(self.models))
        self.metrics = Metrics()
        self.admission = Admission(self.limits)
        self.scheduler: Scheduler | None = None  # made when the app starts (it owns threads)

    def model(self, name: str | None, use: str) -> ServedModel:
        found = self.models.get(name or self.default)
        if found is None:
            raise ServeError(ErrorType.NOT_FOUND, f"model {name!r} is not served here; `model` "
                             f"must be one of {', '.join(map(repr, self.models))}")
        if use not in found.uses:
            raise ServeError(ErrorType.UNSUPPORTED, f"model {found.name!r} does not serve {use} "
                             f"(its head gives {', '.join(found.uses)}); send it to a model that "
                             f"does, with `model`")
        return found


# ---------------------------------------------------------------------------------------------
# shared steps
# ---------------------------------------------------------------------------------------------
async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON; 413 past `limit` bytes (checked before reading when the length is sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ServeError(ErrorType.PAYLOAD_TOO_LARGE, f"request body of {int(declared):,} bytes is over "
                         f"the payload limit of {limit:,} bytes (--payload-limit); send fewer or "
                         "shorter inputs per request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServeError(ErrorType.PAYLOAD_TOO_LARGE, f"request body is over the payload limit "
                             f"of {limit:,} bytes (--payload-limit); send fewer or shorter inputs")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        raise validation("the request has no body; send a JSON object")
    try:
        return json.loads(raw)
    except ValueError as err:  # UnicodeDecodeError too
        raise validation(f"the body is not valid JSON: {err}") from None


# Below this many characters a request is tokenized on the event loop: tens of microseconds,
# less than the two thread switches of the tokenizing thread (which, on a busy CPU, cost
# milliseconds each). Longer requests go to the tokenizing thread so the loop stays responsive.
INLINE_CHARS = 2048


async def tokenized(service: Service, model: ServedModel, texts: list[str], pairs: list[str] | None,
                    truncate: bool, field_name: str) -> tuple[list[tuple[list[int], list[int]]], int]:
    chars = sum(map(len, texts)) + (sum(map(len, pairs)) if pairs else 0)
    if chars <= INLINE_CHARS:
        return encode(model.loop_tokenizer, model, texts, pairs, truncate, field_name)
    return await service.scheduler.tokenize(encode, model.tokenizer, model, texts, pairs, truncate, field_name)


def encode(tokenizer, model: ServedModel, texts: list[str], pairs: list[str] | None, truncate: bool,
           field_name: str) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(ids, type_ids) per input and their token count; over-long inputs cut or refused (422).
    `tokenizer`: the copy owned by the calling thread (see ServedModel)."""
    encodings = tokenizer.encode_raw(texts, pairs, max_length=model.max_length)
    if not truncate:
        for i, e in enumerate(encodings):
            if e.overflowing:
                raise validation(f"`{field_name}[{i}]` is longer than max_input_length {model.max_length} "
                                 "tokens; shorten it, send \"truncate\": true, or start the server "
                                 "with --auto-truncate")
    items = [(e.ids, e.type_ids) for e in encodings]
    return items, sum(len(ids) for ids, _ in items)


async def until_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def answer(service: Service, request: Request, work: Awaitable[Any]) -> Any:
    """`work`'s result, or CancelledError when the client goes away first (its job is dropped)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        raise asyncio.CancelledError("client disconnected")
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()


async def run_admitted(service: Service, request: Request, n: int, work: Callable[[], Awaitable[Any]]) -> Any:
    """Admit `n` inputs (or 429), run `work`, give the permits back however it ends."""
    with service.admission.acquire(n):
        service.metrics.in_flight.set(service.admission.in_flight)
        try:
            return await answer(service, request, work())
        finally:
            service.metrics.in_flight.set(service.admission.in_flight - n)


def _truncate(service: Service, asked: bool | None) -> bool:
    return service.limits.auto_truncate if asked is None else asked


# ---------------------------------------------------------------------------------------------
# routes
# ---------------------------------------------------------------------------------------------
async def embed_vectors(service: Service, request: Request, model: ServedModel, texts: list[str],
                        truncate: bool, field_name: str) -> tuple[torch.Tensor, int]:
    async def work():
        items, tokens = await tokenized(service, model, texts, None, truncate, field_name)
        return torch.stack(await service.scheduler.submit(model, "embed", (), items, tokens)), tokens

    return await run_admitted(service, request, len(texts), work)


async def route_embed(service: Service, request: Request) -> Response:
    req = schemas.embed_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "embed")
    service.limits.check_batch("inputs", len(req.inputs))
    vectors, _ = await embed_vectors(service, request, model, req.inputs,
                                     _truncate(service, req.truncate), "inputs")
    if req.normalize:
        vectors = F.normalize(vectors, dim=-1)
    return JSONResponse(vectors.tolist())


async def route_openai_embeddings(service: Service, request: Request) -> Response:
    req = schemas.openai_embed_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "embed")
    service.limits.check_batch("input", len(req.inputs))
    vectors, tokens = await embed_vectors(service, request, model, req.inputs,
                                          service.limits.auto_truncate, "input")
    vectors = F.normalize(vectors, dim=-1)  # OpenAI's embeddings are unit length
    if req.base64:  # little-endian float32 bytes, as OpenAI's clients decode them
        rows = [base64.b64encode(v.numpy().astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        rows = vectors.tolist()
    return JSONResponse({"object": "list", "model": model.name,
                         "data": [{"object": "embedding", "embedding": row, "index": i}
                                  for i, row in enumerate(rows)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def classifier_logits(service: Service, request: Request, model: ServedModel, texts: list[str],
                            pairs: list[str] | None, truncate: bool, field_name: str) -> torch.Tensor:
    async def work():
        items, tokens = await tokenized(service, model, texts, pairs, truncate, field_name)
        return torch.stack(await service.scheduler.submit(model, "logits", (), items, tokens))

    return await run_admitted(service, request, len(texts), work)


async def route_predict(service: Service, request: Request) -> Response:
    req = schemas.predict_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "predict")
    service.limits.check_batch("inputs", len(req.inputs))
    truncate = _truncate(service, req.truncate)
    singles = [i for i, (_, b) in enumerate(req.inputs) if b is None]
    pairs = [i for i, (_, b) in enumerate(req.inputs) if b is not None]
    logits = torch.empty(len(req.inputs), model.engine.config.num_labels)
    # Texts and pairs tokenize separately (the tokenizer takes one kind per call) but share a run.
    parts = []
    if singles:
        parts.append((singles, classifier_logits(service, request, model, [req.inputs[i][0] for i in singles],
                                                 None, truncate, "inputs")))
    if pairs:
        parts.append((pairs, classifier_logits(service, request, model, [req.inputs[i][0] for i in pairs],
                                               [req.inputs[i][1] for i in pairs], truncate, "inputs")))
    for index, rows in zip([p[0] for p in parts], await asyncio.gather(*[p[1] for p in parts])):
        logits[index] = rows
    config = model.engine.config
    function = "none" if req.raw_scores else score_function(config)
    scores = logits.softmax(-1) if function == "softmax" else logits.sigmoid() if function == "sigmoid" else logits
    labels = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    out = [sorted(({"score": s, "label": labels[k]} for k, s in enumerate(row)), key=lambda p: -p["score"])
           for row in scores.tolist()]
    return JSONResponse(out[0] if req.single else out)


async def route_rerank(service: Service, request: Request) -> Response:
    req = schemas.rerank_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "rerank")
    service.limits.check_batch("texts", len(req.texts))
    logits = await classifier_logits(service, request, model, [req.query] * len(req.texts), req.texts,
                                     _truncate(service, req.truncate), "texts")
    raw = logits[:, 0]
    scores = (raw if req.raw_scores else raw.sigmoid()).tolist()
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return JSONResponse([{"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
                         for i in order])


def tokens_of(model: ServedModel, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    """TEI's /tokenize answer: per token its id, text, special flag and character span."""
    return tokens(model.engine, texts, add_special_tokens=add_special_tokens, tokenizer=model.tokenizer)


async def route_tokenize(service: Service, request: Request) -> Response:
    req = schemas.tokenize_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "tokenize")
    service.limits.check_batch("inputs", len(req.inputs))
    return JSONResponse(await service.scheduler.tokenize(tokens_of, model, req.inputs, req.add_special_tokens))


async def library_use(service: Service, request: Request, model: ServedModel, use: str, key: tuple,
                      items: list[Any], chars: int) -> list[Any]:
    """A use run by the library on merged inputs; tokens estimated from characters (~4 a token)."""
    return await run_admitted(service, request, len(items),
                              lambda: service.scheduler.submit(model, use, key, items, chars // 4 + 2 * len(items)))


async def route_fill_mask(service: Service, request: Request) -> Response:
    req = schemas.fill_mask_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "fill-mask")
    service.limits.check_batch("inputs", len(req.inputs))
    out = await library_use(service, request, model, "fill-mask", (req.top_k, req.targets), req.inputs,
                            sum(map(len, req.inputs)))
    return JSONResponse(out[0] if req.single else out)


async def route_ner(service: Service, request: Request) -> Response:
    req = schemas.ner_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "ner")
    service.limits.check_batch("inputs", len(req.inputs))
    out = await library_use(service, request, model, "ner", (), req.inputs, sum(map(len, req.inputs)))
    return JSONResponse(out[0] if req.single else out)


async def route_qa(service: Service, request: Request) -> Response:
    req = schemas.qa_request(await read_json(request, service.limits.payload_limit))
    model = service.model(req.model, "qa")
    service.limits.check_batch("question", len(req.questions))
    items = list(zip(req.questions, req.contexts))
    out = await library_use(service, request, model, "qa", (req.top_k, req.max_answer_length, req.allow_no_answer),
                            items, sum(len(q) + len(c) for q, c in items))
    return JSONResponse(out[0] if req.single else out)


async def route_health(service: Service, request: Request) -> Response:
    if service.scheduler is None or not service.scheduler.alive:
        raise ServeError(ErrorType.UNHEALTHY, "the model thread is not running (starting or shutting down)",
                         retry_after=1)
    return Response(status_code=200)


async def route_info(service: Service, request: Request) -> Response:
    default = service.models[service.default]
    limits = service.limits
    return JSONResponse({**default.describe(), "max_concurrent_requests": limits.max_concurrent_requests,
                         "max_batch_tokens": limits.max_batch_tokens, "max_batch_requests": None,
                         "max_client_batch_size": limits.max_client_batch_size,
                         "payload_limit": limits.payload_limit, "auto_truncate": limits.auto_truncate,
                         "tokenization_workers": 1, "version": __version__,
                         "models": [m.describe() for m in service.models.values()]})


async def route_metrics(service: Service, request: Request) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ---------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------
def error_response(err: ServeError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


def _route(service: Service, name: str, handler, open_route: bool = False):
    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        outcome = "success"
        try:
            if service.api_key and not open_route:
                sent = request.headers.get("authorization", "")
                if not hmac.compare_digest(sent.encode(), f"Bearer {service.api_key}".encode()):
                    raise ServeError(ErrorType.UNAUTHORIZED, "missing or wrong API key; send the "
                                     "header `Authorization: Bearer <key>` given to --api-key")
            return await handler(service, request)
        except ServeError as err:
            outcome = err.error_type.value
            return error_response(err)
        except asyncio.CancelledError:
            outcome = "disconnected"
            raise
        except Exception as err:  # noqa: BLE001  a bug must answer 500, not drop the connection
            outcome = ErrorType.BACKEND.value
            log.exception("%s failed", name)
            return error_response(ServeError(ErrorType.BACKEND, f"{name} failed: {type(err).__name__}: {err}"))
        finally:
            service.metrics.requests.labels(name, outcome).inc()
            service.metrics.request_seconds.labels(name).observe(time.perf_counter() - start)

    return endpoint


ROUTES = [("/embed", "POST", route_embed), ("/v1/embeddings", "POST", route_openai_embeddings),
          ("/rerank", "POST", route_rerank), ("/predict", "POST", route_predict),
          ("/tokenize", "POST", route_tokenize), ("/fill-mask", "POST", route_fill_mask),
          ("/ner", "POST", route_ner), ("/qa", "POST", route_qa), ("/health", "GET", route_health),
          ("/info", "GET", route_info), ("/metrics", "GET", route_metrics)]


def build_app(service: Service) -> Starlette:
    """The ASGI app over `service`; its model thread starts and stops with the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.scheduler = Scheduler(service.limits.max_batch_tokens, service.metrics)
        try:
            yield
        finally:  # uvicorn has stopped taking connections and waited for the open ones
            await service.scheduler.stop()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = ErrorType.NOT_FOUND if exc.status_code == 404 else ErrorType.VALIDATION
        message = (f"no route {request.method} {request.url.path}; routes: "
                   f"{', '.join(f'{m} {p}' for p, m, _ in ROUTES)}")
        response = error_response(ServeError(kind, message))
        response.status_code = exc.status_code
        return response

    routes = [Route(path, _route(service, path, handler, open_route=path == "/health"), methods=[method])
              for path, method, handler in ROUTES]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})


def serve(service: Service, host: str = "127.0.0.1", port: int = 8080, *, sockets=None,
          graceful_timeout: float = 30.0) -> None:
    """Run the service under uvicorn until SIGINT/SIGTERM: then stop taking connections, finish
    the requests in flight (up to `graceful_timeout` s), drain the model thread, return (exit 0)."""
    web.run(build_app(service), sockets=sockets, host=host, port=port, graceful_timeout=graceful_timeout,
            lifespan="on")
