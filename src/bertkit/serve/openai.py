"""OpenAI's routes: POST /v1/embeddings, GET /v1/models and /v1/models/{model}.

/v1/embeddings is /embed in OpenAI's shape: unit vectors (optionally cut to `dimensions`), as
floats or base64 of little-endian float32, with token usage. It takes up to
`--openai-max-batch-size` (2,048, OpenAI's own limit) inputs, admitted a slice at a time
(`Limits.slice_size`). Token-id inputs, which some client libraries send by default, are refused
with the way to send text (schemas.TOKEN_IDS).

/v1/models lists every name a request's `model` may take: each served model, each alias
(`--served-model-name`) with the model it answers with as `root`, in one namespace.
"""

from __future__ import annotations

import base64

from starlette.requests import Request
from starlette.responses import Response

from bertkit.serve import schemas
from bertkit.serve.errors import ErrorType, ServeError
from bertkit.serve.responses import JSONResponse, stacked
from bertkit.serve.routes import body, shaped, vectors_of
from bertkit.serve.service import STARTED, Service, timing_of, with_prompt

OWNER = "bertkit"


async def route_embeddings(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.OpenAIEmbeddingRequest, "/v1/embeddings")
    model = service.model(req.model, "embed")
    texts, _ = schemas.texts_of(req.input)
    service.limits.check_batch("input", len(texts), openai=True)
    service.check_dimensions(model, req.dimensions)
    texts = with_prompt(service.prompt(model, None), texts)
    vectors = stacked(await vectors_of(service, request, model, texts, service.limits.auto_truncate, "input"))
    vectors = shaped(service, model, vectors, req.dimensions, normalize=True)  # OpenAI's are unit length
    if req.encoding_format == "base64":  # little-endian float32 bytes, as OpenAI's clients decode them
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        rows = list(vectors)
    tokens = timing_of(request).tokens
    return JSONResponse({"object": "list", "model": req.model or model.name,
                         "data": [{"object": "embedding", "embedding": row, "index": i}
                                  for i, row in enumerate(rows)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def cards(service: Service) -> list[dict]:
    out = [{"id": name, "object": "model", "created": STARTED, "owned_by": OWNER, "root": model.base or name}
           for name, model in service.models.items()]
    out += [{"id": alias, "object": "model", "created": STARTED, "owned_by": OWNER, "root": target}
            for alias, target in service.aliases.items()]
    return out


async def route_models(service: Service, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": cards(service)})


async def route_model(service: Service, request: Request) -> Response:
    name = request.path_params["model"]
    for card in cards(service):
        if card["id"] == name:
            return JSONResponse(card)
    raise ServeError(ErrorType.NOT_FOUND, f"model {name!r} is not served here; GET /v1/models lists "
                     f"{', '.join(map(repr, service.names()))}")
