"""The explorer's HTTP side: the page and its assets, and one JSON route per view.

GET / serves static/index.html; GET /static/<file> the page's scripts and styles (everything the
page loads comes from here: no CDN, no build step). POST /api/<view> parses the JSON body, calls
the view's function in views.py on a worker thread (the model must not block the event loop) and
answers its dict; a `ViewError` (or any ValueError from the library) answers 422 with
`{error, error_type}`, the service's error shape. The views and their fields:

    GET  /api/info                                 model, parameter table, examples, task models
    POST /api/visibility {text, pair?, position}
    POST /api/assembly   {text, pair?, position}
    POST /api/masking    {text, seed?, whole_word?, mlm_probability?}
    POST /api/fill-mask  {texts, top_k?}
    POST /api/attention  {text, pair?, pad?, layer?, head?}
    POST /api/task       {model, ...its use's fields}
"""

from __future__ import annotations

import json
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

from bertkit import web
from bertkit.explore import views
from bertkit.explore.views import Explorer, ViewError

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
PAYLOAD_LIMIT = 1_000_000  # bytes of request body: a page sends a few sentences

# view name → (function, the fields it accepts)
VIEWS: dict[str, tuple[Callable[..., dict[str, Any]], tuple[str, ...]]] = {
    "visibility": (views.visibility, ("text", "pair", "position")),
    "assembly": (views.assembly, ("text", "pair", "position")),
    "masking": (views.masking, ("text", "seed", "whole_word", "mlm_probability")),
    "fill-mask": (views.fill, ("texts", "top_k")),
    "attention": (views.attention, ("text", "pair", "pad", "layer", "head")),
    "task": (views.task, ("model", "text", "pair", "question", "context", "texts", "query")),
}


def _error(status: int, message: str, kind: str = "validation") -> JSONResponse:
    return JSONResponse({"error": message, "error_type": kind}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > PAYLOAD_LIMIT:
        raise ViewError(f"request body of {len(raw):,} bytes is over the explorer's limit of "
                        f"{PAYLOAD_LIMIT:,}; send shorter texts")
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ViewError(f"the body is not JSON ({err}); send a JSON object") from None
    if not isinstance(body, dict):
        raise ViewError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def build_app(explorer: Explorer) -> Starlette:
    """The explorer's ASGI app over loaded models."""
    # One model, one request at a time: torch already uses every core for one forward, and
    # the views read shared tokenizer state.
    lock = threading.Lock()

    def locked(function: Callable[..., dict[str, Any]], **fields: Any) -> dict[str, Any]:
        with lock:
            return function(explorer, **fields)

    def view_route(name: str) -> Callable:
        function, accepted = VIEWS[name]

        async def endpoint(request: Request) -> Response:
            try:
                body = await _body(request)
                unknown = sorted(set(body) - set(accepted))
                if unknown:
                    raise ViewError(f"unknown field {unknown[0]!r} for /api/{name}; it takes "
                                    f"{', '.join(accepted)}")
                return JSONResponse(await run_in_threadpool(locked, function, **body))
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
        routes = ", ".join(["GET /", "GET /api/info"] + [f"POST /api/{n}" for n in VIEWS])
        return _error(exc.status_code, f"no route {request.method} {request.url.path}; routes: {routes}",
                      "not_found" if exc.status_code == 404 else "validation")

    routes = [Route("/", page), Route("/api/info", info),
              *[Route(f"/api/{name}", view_route(name), methods=["POST"]) for name in VIEWS],
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})


def run(explorer: Explorer, host: str = "127.0.0.1", port: int = 8000, *, sockets=None) -> None:
    """Serve the explorer under uvicorn until Ctrl-C / SIGTERM, then return (exit 0)."""
    web.run(build_app(explorer), sockets=sockets, host=host, port=port)
