"""`bertkit serve`: BERT models behind HTTP, speaking text-embeddings-inference's and OpenAI's APIs.

    from bertkit.serve import Service, Limits, load_model, serve
    service = Service({"minilm": load_model("minilm", "path/to/minilm")}, Limits())
    serve(service, host="127.0.0.1", port=8080)

One file per concern: `app.py` the list of routes and the app (API key, error shape, timing
headers, /openapi.json, /docs), `routes.py` and `openai.py` the thin handlers, `service.py` what
they share and the steps of a request, `scheduler.py` the queue that batches across requests on
one model thread, `runners.py` how each use runs a merged batch, `limits.py` admission and
back-pressure, `errors.py` the one error type and its status map, `schemas.py` the request and
answer models (validation and the OpenAPI document both read them), `metrics.py` Prometheus,
`models.py` what a directory serves, `search.py` POST /search over the indexes of `--index`.
Needs the `serve` extra (starlette, uvicorn, pydantic, prometheus-client, swagger-ui-bundle-v2).
"""

from bertkit.serve.app import build_app, openapi, serve
from bertkit.serve.errors import ErrorType, ServeError
from bertkit.serve.limits import Limits
from bertkit.serve.models import ServedModel, load_model, parse_model_args, parse_served_names
from bertkit.serve.service import Service

__all__ = ["Service", "build_app", "openapi", "serve", "Limits", "ErrorType", "ServeError", "ServedModel",
           "load_model", "parse_model_args", "parse_served_names"]
