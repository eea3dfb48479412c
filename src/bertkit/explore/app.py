"""The explorer's HTTP side: the page and its assets, and one JSON route per view.

GET / serves static/index.html; GET /static/<file> the page's scripts and styles (everything the
page loads comes from here: no CDN, no build step). POST /api/<view> reads the JSON body into the
view's model (schemas.py), calls the view's function in views.py on a worker thread (the model
must not block the event loop) and answers its dict; a bad body, a `ViewError` or any ValueError
from the library answers 422 with `{error, error_type}`, the service's error shape. GET
/openapi.json describes every route (OpenAPI 3.1, from the same models), GET /docs renders it.

    GET  /api/info                                 model, parameter table, examples, task models
    POST /api/visibility {text, pair?, position}
    POST /api/assembly   {text, pair?, position}
    POST /api/masking    {text, seed?, whole_word?, mlm_probability?}
    POST /api/fill-mask  {texts, top_k?}
    POST /api/attention  {text, pair?, pad?, layer?, head?}
    POST /api/task       {model, ...its use's fields}
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from bertkit import __version__
from bertkit.explore import schemas, views
from bertkit.explore.views import Explorer, ViewError
from bertkit.util import web
from bertkit.util.webapi import Operation, RequestError, docs_routes, document, parse

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
PAYLOAD_LIMIT = 1_000_000  # bytes of request body: a page sends a few sentences

# view name → (function, request model, answer model, summary)
VIEWS: dict[str, tuple[Callable[..., dict[str, Any]], type, type, str]] = {
    "visibility": (views.visibility, schemas.VisibilityRequest, schemas.VisibilityResponse,
                   "Who sees whom: BERT's attention mask against GPT's, and the training objectives"),
    "assembly": (views.assembly, schemas.AssemblyRequest, schemas.AssemblyResponse,
                 "A token's input vector: token + position + segment, then LayerNorm"),
    "masking": (views.masking, schemas.MaskingRequest, schemas.MaskingResponse,
                "The pre-training mask of a text and the model's guesses"),
    "fill-mask": (views.fill, schemas.FillMaskRequest, schemas.FillMaskResponse, "Candidates for each [MASK]"),
    "attention": (views.attention, schemas.AttentionRequest, schemas.AttentionResponse,
                  "Every layer's and head's attention, and what padding does without a mask"),
    "task": (views.task, schemas.TaskRequest, schemas.TaskResponse, "A fine-tuned model on the page's input"),
}
ERRORS = (413, 422, 500)


def openapi(explorer: Explorer | None = None) -> dict[str, Any]:
    """The explorer's OpenAPI 3.1 document (with `explorer`: the names its task models take)."""
    operations = [Operation("/", "get", "page", "The page", media_type="text/html"),
                  Operation("/api/info", "get", "info", "The model, its parameters, examples and task models",
                            response=schemas.InfoResponse, errors=(500,)),
                  *[Operation(f"/api/{name}", "post", name.replace("-", "_"), summary, request, response, ERRORS)
                    for name, (_, request, response, summary) in VIEWS.items()],
                  Operation("/openapi.json", "get", "openapi", "This document (OpenAPI 3.1)"),
                  Operation("/docs", "get", "docs", "This document, rendered (Swagger UI, served from this "
                            "process)", media_type="text/html")]
    out = document("bertkit explore", __version__, "The explorer's API: every number the page shows.",
                   operations, schemas.ErrorResponse)
    if explorer is not None:
        out["components"]["schemas"]["TaskRequest"]["properties"]["model"]["enum"] = list(explorer.tasks)
    return out


def _error(status: int, message: str, kind: str = "validation") -> JSONResponse:
    return JSONResponse({"error": message, "error_type": kind}, status_code=status)


async def _body(request: Request, model: type, route: str) -> dict[str, Any]:
    """The body read into `model`: the fields the request set (the view's defaults do the rest)."""
    raw = await request.body()
    if len(raw) > PAYLOAD_LIMIT:
        return _error(413, f"request body of {len(raw):,} bytes is over the explorer's limit of "
                      f"{PAYLOAD_LIMIT:,}; send shorter texts", "payload_too_large")
    try:
        return parse(model, raw, route).model_dump(exclude_unset=True)
    except RequestError as err:
        raise ViewError(str(err)) from None


def build_app(explorer: Explorer) -> Starlette:
    """The explorer's ASGI app over loaded models."""
    # One model, one request at a time: torch already uses every core for one forward, and
    # the views read shared tokenizer state.
    lock = threading.Lock()

    def locked(function: Callable[..., dict[str, Any]], **fields: Any) -> dict[str, Any]:
        with lock:
            return function(explorer, **fields)

    def view_route(name: str) -> Callable:
        function, model, _, _ = VIEWS[name]

        async def endpoint(request: Request) -> Response:
            try:
                fields = await _body(request, model, f"/api/{name}")
                if isinstance(fields, Response):
                    return fields
                return JSONResponse(await run_in_threadpool(locked, function, **fields))
            except ViewError as err:
                return _error(422, str(err))
            except (ValueError, TypeError) as err:
                return _error(422, f"/api/{name}: {err}")
            except Exception as err:  # noqa: BLE001  a bug answers 500 with its name, not a hang-up
                log.exception("/api/%s failed", name)
                return _error(500, f"/api/{name} failed: {type(err).__name__}: {err}", "backend")

        return endpoint

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def info(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(locked, views.info))

    async def not_found(request: Request, exc: HTTPException) -> Response:
        routes = ", ".join(["GET /", "GET /api/info"] + [f"POST /api/{n}" for n in VIEWS]
                           + ["GET /openapi.json", "GET /docs"])
        return _error(exc.status_code, f"no route {request.method} {request.url.path}; routes: {routes}",
                      "not_found" if exc.status_code == 404 else "validation")

    described = JSONResponse(openapi(explorer)).body

    async def openapi_json(request: Request) -> Response:
        return Response(described, media_type="application/json")

    routes = [Route("/", page), Route("/api/info", info),
              *[Route(f"/api/{name}", view_route(name), methods=["POST"]) for name in VIEWS],
              Route("/openapi.json", openapi_json), *docs_routes("/openapi.json", "bertkit explore"),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})


def run(explorer: Explorer, host: str = "127.0.0.1", port: int = 8000, *, sockets=None) -> None:
    """Serve the explorer under uvicorn until Ctrl-C / SIGTERM, then return (exit 0)."""
    web.run(build_app(explorer), sockets=sockets, host=host, port=port)
