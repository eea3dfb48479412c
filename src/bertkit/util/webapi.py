"""The HTTP apps' contract: request and response models declared once (pydantic), read by
validation and by the OpenAPI 3.1 document alike, and the `/docs` page that renders it.

The service (`serve/`) and the explorer (`explore/`) each list their operations as `Operation`s:
path, method, request model, response model, the error statuses it can answer. `document` turns
the list into an OpenAPI 3.1 document (pydantic writes JSON Schema 2020-12, the dialect 3.1
uses, so the schemas go in unchanged), `parse` reads a request body into its model and turns the
first validation error into one line that names the field, what it got and what it takes, and
`docs_routes` serves Swagger UI from the files `swagger-ui-bundle-v2` ships (no CDN: a page that
loads its scripts from the network is blank on an offline machine).

Apps never import each other (docs/design.md), so what both need lives here, below them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

# What each error status means, for the document (the body is the app's error model).
STATUS_TEXT = {
    400: "bad request",
    401: "missing or wrong API key",
    403: "an admin route that is off, or a path outside the directory it may read",
    404: "no such model or route",
    413: "request body over the payload limit",
    422: "a field's value is wrong (type, emptiness, length, batch size), or the body is not JSON",
    424: "the model has no head for this route",
    429: "overloaded: too many inputs in flight; retry after Retry-After seconds",
    500: "the model failed (a bug or the machine, not the request)",
    503: "not ready or shutting down; retry after Retry-After seconds",
}


@dataclass(frozen=True)
class Operation:
    """One route of an app, as the document describes it."""

    path: str  # "/embed", "/v1/models/{model}"
    method: str  # "get" or "post"
    name: str  # operationId: "embed"
    summary: str
    request: type[BaseModel] | None = None  # the JSON body's model (None: no body)
    response: type[BaseModel] | None = None  # the 200 answer's model (None: see media_type)
    errors: tuple[int, ...] = ()  # statuses the route can answer besides 200
    media_type: str | None = "application/json"  # of the 200 answer (None: it has no body)
    headers: tuple[str, ...] = ()  # response headers of a 200 answer, described in HEADERS
    parameters: tuple[dict[str, Any], ...] = ()  # path parameters, OpenAPI's shape
    tags: tuple[str, ...] = field(default_factory=tuple)
    error_model: type[BaseModel] | None = None  # the error body, if not the app's own


def document(title: str, version: str, description: str, operations: list[Operation],
             error_model: type[BaseModel], headers: dict[str, str] | None = None,
             security: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations` (schemas under components/schemas, by model name)."""
    models = {error_model}
    for op in operations:
        models.update(m for m in (op.request, op.response, op.error_model) if m is not None)
    keyed = [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)]
    refs, schemas = models_json_schema(keyed, ref_template="#/components/schemas/{model}")
    ref = {model: refs[(model, mode)] for model, mode in keyed}
    headers = headers or {}
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        ok: dict[str, Any] = {"description": "success"}
        if op.response is not None:
            ok["content"] = {op.media_type: {"schema": ref[op.response]}}
        elif op.media_type not in (None, "application/json"):
            ok["content"] = {op.media_type: {"schema": {"type": "string"}}}
        if op.headers:
            ok["headers"] = {h: {"description": headers[h], "schema": {"type": "string"}} for h in op.headers}
        responses: dict[str, Any] = {"200": ok}
        for status in sorted(op.errors):
            responses[str(status)] = {"description": STATUS_TEXT[status], "content": {
                "application/json": {"schema": ref[op.error_model or error_model]}}}
        entry: dict[str, Any] = {"operationId": op.name, "summary": op.summary, "responses": responses}
        if op.tags:
            entry["tags"] = list(op.tags)
        if op.parameters:
            entry["parameters"] = list(op.parameters)
        if op.request is not None:
            entry["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": ref[op.request]}}}
        if security and 401 in op.errors:
            entry["security"] = [{"bearer": []}]
        paths.setdefault(op.path, {})[op.method] = entry
    components: dict[str, Any] = {"schemas": schemas.get("$defs", {})}
    if security:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {"openapi": "3.1.0", "info": {"title": title, "version": version, "description": description},
            "paths": paths, "components": components}


class RequestError(ValueError):
    """A request body that its model refuses; the message names the field and the fix."""


def parse(model: type[BaseModel], raw: bytes, route: str, tags: dict[str, str] | None = None) -> Any:
    """`raw` (a JSON body) read into `model`, or RequestError with one line about the first problem.

    tags: the names of the branches of tagged unions (pydantic `Tag`) → what the field takes,
    for messages ("`inputs` must be a string or a list of strings, got a number").
    """
    if not raw:
        raise RequestError("the request has no body; send a JSON object")
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        errors = err.errors()
        # An unknown key first: a misspelt field ("input" for "inputs") is also a missing one,
        # and the misspelling is the thing to fix.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        raise RequestError(message(first, model, route, tags or {})) from None


def kind(value: Any) -> str:
    """A JSON value's kind, for messages."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def message(error: dict[str, Any], model: type[BaseModel], route: str, tags: dict[str, str]) -> str:
    """One pydantic error as a line naming the field (`inputs[1]`), the value's kind and the fix."""
    loc = list(error["loc"])
    expected = None
    while loc and isinstance(loc[-1], str) and loc[-1] in tags:  # the union branch it was read as
        expected = tags[loc.pop()]
    path = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(
        p for p in loc if not (isinstance(p, str) and p in tags)))
    where = f"`{path}`" if path else f"the body of {route}"
    kind_of, got = error["type"], kind(error.get("input"))
    if kind_of == "bertkit":  # a model's own check, worded in full where it is raised
        return error["msg"]
    if kind_of == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    if kind_of in ("model_type", "model_attributes_type", "dict_type") and not path:
        return f"the body of {route} must be a JSON object, got {got}"
    if kind_of == "missing":
        return f"missing field {where}"
    if kind_of == "extra_forbidden":
        if len(loc) > 1:
            return f"unknown field {where}"
        fields = sorted(model.model_fields)
        close = difflib.get_close_matches(str(loc[0]), fields, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return f"unknown field {where} for {route}{hint}; it takes {', '.join(f'`{k}`' for k in fields)}"
    if expected is not None and kind_of.endswith("_type"):
        return f"{where} must be {expected}, got {got}"
    if kind_of == "string_pattern_mismatch":
        return f"{where} is empty; send some text"
    if kind_of == "too_short" and isinstance(error.get("input"), list):
        return f"{where} is an empty list; send at least one"
    if kind_of == "too_long" and isinstance(error.get("input"), list):
        return f"{where} has {len(error['input'])} items, more than {error['ctx']['max_length']}"
    if kind_of == "string_type":
        return f"{where} must be a string, got {got}"
    if kind_of == "bool_type":
        return f"{where} must be true or false, got {got}"
    if kind_of in ("int_type", "int_from_float"):
        return f"{where} must be an integer, got {got}"
    if kind_of in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        what = "an integer" if isinstance(error.get("input"), int) else "a number"
        return f"{where} must be {what} {error['msg'].removeprefix('Input should be ')}, got {error.get('input')!r}"
    if kind_of in ("literal_error", "enum"):
        return f"{where} must be {error['msg'].removeprefix('Input should be ')}, got {error.get('input')!r}"
    if kind_of == "list_type":
        return f"{where} must be a list, got {got}"
    if kind_of in ("float_type", "float_parsing", "finite_number"):
        return f"{where} must be a number, got {got}"
    return f"{where}: {error['msg']}"


def docs_routes(openapi_url: str, title: str, prefix: str = "/docs") -> list[Any]:
    """Starlette routes: `prefix` (Swagger UI over `openapi_url`) and its files under `prefix`/assets."""
    from starlette.responses import HTMLResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<link rel="stylesheet" href="{prefix}/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{prefix}/assets/swagger-ui-bundle.js"></script>
<script src="{prefix}/assets/swagger-ui-init.js"></script>
</body></html>"""
    init = f'window.ui = SwaggerUIBundle({{url: "{openapi_url}", dom_id: "#swagger-ui"}});\n'

    async def docs(request) -> HTMLResponse:
        return HTMLResponse(page)

    async def init_script(request):
        from starlette.responses import Response
        return Response(init, media_type="text/javascript")

    # The init script is its own file, not inline, so a Content-Security-Policy without
    # 'unsafe-inline' still runs it.
    return [Route(prefix, docs, methods=["GET"]),
            Route(f"{prefix}/assets/swagger-ui-init.js", init_script, methods=["GET"]),
            Mount(f"{prefix}/assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")]
