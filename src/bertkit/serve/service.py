"""What every handler shares: the `Service` (models and their names, limits, admission, queue,
metrics) and the steps of a request: read the body, admit, tokenize, run, time.

A request's timing (`Timing`) is filled in as it goes (tokenizing here, queue and inference by
the model thread) and sent back in text-embeddings-inference's headers (`x-total-time`,
`x-tokenization-time`, `x-queue-time`, `x-inference-time`, in milliseconds, ...).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.requests import Request

from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.limits import Admission, Limits
from bertkit.serve.metrics import Metrics
from bertkit.serve.models import ServedModel
from bertkit.serve.scheduler import Scheduler, Timing

__all__ = ["Service", "Timing", "STARTED", "ARRIVED", "TIMING", "RAW", "read_body", "tokenized", "encode",
           "run_admitted", "run_sliced", "timing_of", "truncate_of", "with_prompt"]

# What a request's steps share, kept in its ASGI scope under these keys: when it arrived (set by
# the app), its Timing, and its body once read (route_compat reads it before the route it picks).
# A dict lookup each, where Starlette's request.state raises and catches an AttributeError for
# every name not set yet, on the event loop every request passes through.
ARRIVED, TIMING, RAW = "bertkit.arrived", "bertkit.timing", "bertkit.raw"

# What created (a Unix time) the /v1/models cards report: when the process started serving.
STARTED = int(time.time())


@dataclass
class Service:
    """The models (first = default) under their names and aliases, limits, admission, queue, metrics.

    aliases: {alias: model name}: more names a model answers to (`--served-model-name`); model
    names, aliases and adapters share one namespace, so every name is unique.
    default_prompt_name: the prompt put before texts of requests that name none
    (`--default-prompt-name`), for every model that declares it.
    allow_truncated_dimensions: a request's `dimensions` is taken for any model, not only
    those that declare a Matryoshka `truncate_dim` (`--allow-truncated-dimensions`).
    """
    models: dict[str, ServedModel]
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    allow_truncated_dimensions: bool = False
    adapters: Any = None  # serve.adapters.ServedAdapters: the bases' adapter hosts, --adapter-root
    # --index NAME=DIR: {name: serve.search.ServedIndex}, searched by POST /search (first = default)
    indexes: dict[str, Any] = field(default_factory=dict)
    # threads running the models, each with its share of torch's threads (`serve.scheduler`);
    # `bertkit serve` takes `default_model_threads` unless told (--model-threads)
    model_threads: int = 1

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("a service needs at least one model")
        for alias, target in self.aliases.items():
            if alias in self.models:
                raise ValueError(f"the alias {alias!r} is also a model's name; names must be unique")
            if target not in self.models:
                raise ValueError(f"the alias {alias!r} names no served model ({target!r})")
        if self.default_prompt_name is not None and not any(
                self.default_prompt_name in m.prompts for m in self.models.values()):
            declared = sorted({p for m in self.models.values() for p in m.prompts})
            raise ValueError(f"--default-prompt-name {self.default_prompt_name!r} is a prompt of no "
                             f"served model (their config_sentence_transformers.json declare "
                             f"{', '.join(map(repr, declared)) or 'none'})")
        self.default = next(iter(self.models))
        self.metrics = Metrics()
        self.admission = Admission(self.limits)
        self.scheduler: Scheduler | None = None  # made when the app starts (it owns threads)
        self.draining = False  # set at SIGTERM: still answering, no longer asking for work (/ready)

    def unready(self) -> ServeError | None:
        """Why a load balancer should send this process no new work now, or None when it may:
        the model thread is not running (starting or stopped), the process is draining after a
        SIGTERM, or every admission permit is taken (a new input would be refused with 429)."""
        if self.scheduler is None or not self.scheduler.alive:
            return ServeError(ErrorType.UNHEALTHY, "the model thread is not running (starting or shutting "
                              "down)", retry_after=1)
        if self.draining:
            return ServeError(ErrorType.UNHEALTHY, "draining: the server was asked to stop and answers "
                              "only what it is sent until it closes; send new work to another replica",
                              retry_after=1)
        if self.admission.free == 0:
            return ServeError(ErrorType.OVERLOADED, f"all max_concurrent_requests {self.admission.capacity} "
                              "inputs are in flight; send new work to another replica or retry after "
                              f"{self.limits.retry_after} s", retry_after=self.limits.retry_after)
        return None

    def names(self) -> list[str]:
        return [*self.models, *self.aliases]

    def model(self, name: str | None, use: str) -> ServedModel:
        found = self.models.get(self.default if name is None else self.aliases.get(name, name))
        if found is None:
            adapters = [n for n, m in self.models.items() if m.base is not None]
            raise ServeError(ErrorType.NOT_FOUND, f"model {name!r} is not served here; `model` "
                             f"must be one of {', '.join(map(repr, self.names()))}"
                             + (f" (adapters loaded: {', '.join(map(repr, adapters))})" if adapters else ""))
        if use not in found.uses:
            raise ServeError(ErrorType.UNSUPPORTED, f"model {found.name!r} does not serve {use} "
                             f"(its head gives {', '.join(found.uses)}); send it to a model that "
                             f"does, with `model`")
        return found

    def prompt(self, model: ServedModel, name: str | None) -> str:
        """The text put before each input: the named prompt, else the server's, else the model's default."""
        if name is not None:
            if name not in model.prompts:
                raise validation(f"`prompt_name` {name!r} is not a prompt of model {model.name!r}; it has "
                                 f"{', '.join(map(repr, model.prompts)) or 'none'} "
                                 "(config_sentence_transformers.json)")
            return model.prompts[name]
        for fallback in (self.default_prompt_name, model.default_prompt_name):
            if fallback is not None and fallback in model.prompts:
                return model.prompts[fallback]
        return ""

    def check_dimensions(self, model: ServedModel, dimensions: int | None) -> None:
        if dimensions is None:
            return
        hidden = model.engine.config.hidden_size
        if dimensions > hidden:
            raise validation(f"`dimensions` {dimensions} is more than model {model.name!r}'s {hidden}")
        if model.truncate_dim is None and not self.allow_truncated_dimensions:
            raise validation(f"model {model.name!r} was not trained for truncated embeddings (its "
                             "config_sentence_transformers.json declares no truncate_dim), so its first "
                             f"{dimensions} dimensions are not an embedding of their own; leave "
                             "`dimensions` out, or start the server with --allow-truncated-dimensions")


def with_prompt(prompt: str, texts: list[str]) -> list[str]:
    return [prompt + t for t in texts] if prompt else texts


def truncate_of(service: Service, asked: bool | None) -> bool:
    return service.limits.auto_truncate if asked is None else asked


def timing_of(request: Request) -> Timing:
    """The request's Timing, made by the first step that computes (so only those answers carry
    timing headers), counted from the request's arrival (set by the app)."""
    scope = request.scope
    timing = scope.get(TIMING)
    if timing is None:
        arrived = scope.get(ARRIVED)
        timing = scope[TIMING] = Timing() if arrived is None else Timing(start=arrived)
    return timing


# ---------------------------------------------------------------------------------------------
# the steps of a request
# ---------------------------------------------------------------------------------------------
async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 past `limit` bytes (checked before reading when the length is sent)."""
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
    return b"".join(chunks)


# Below this many characters a request is tokenized on the event loop: tens of microseconds,
# less than the two thread switches of the tokenizing thread (which, on a busy CPU, cost
# milliseconds each). Longer requests go to the tokenizing thread so the loop stays responsive.
INLINE_CHARS = 2048


async def tokenized(service: Service, request: Request, model: ServedModel, texts: list[str],
                    pairs: list[str] | None, truncate: bool, field_name: str, offset: int = 0, *,
                    max_length: int | None = None, why: str | None = None
                    ) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(ids, type_ids) per input and their token count (see `encode`), on the event loop for short
    inputs, else on the tokenizing thread; timed into the request's Timing. max_length: the
    model's unless given (an index built at another length, `why` saying so in the 422)."""
    start = time.perf_counter()
    chars = sum(map(len, texts)) + (sum(map(len, pairs)) if pairs else 0)
    limit = max_length or model.max_length
    if chars <= INLINE_CHARS:
        out = encode(model.loop_tokenizer, texts, pairs, limit, truncate, field_name, offset, why)
    else:
        out = await service.scheduler.tokenize(encode, model.tokenizer, texts, pairs, limit, truncate,
                                               field_name, offset, why)
    timing = timing_of(request)
    timing.tokenization += time.perf_counter() - start
    timing.characters += chars
    timing.tokens += out[1]
    return out


def encode(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int, truncate: bool,
           field_name: str, offset: int = 0, why: str | None = None
           ) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(ids, type_ids) per input cut at max_length pieces, and their token count; an over-long
    input without `truncate` is refused (422), naming the field and the limit (`why` it is what it
    is, when not the model's max_input_length). `tokenizer`: the copy owned by the calling thread
    (see ServedModel); `offset`: the index of texts[0] in the request, for messages."""
    encodings = tokenizer.encode_raw(texts, pairs, max_length=max_length)
    if not truncate:
        limit = f"{max_length} tokens ({why})" if why else f"max_input_length {max_length} tokens"
        for i, e in enumerate(encodings):
            if e.overflowing:
                raise validation(f"`{field_name}[{offset + i}]` is longer than {limit}; shorten it, send "
                                 "\"truncate\": true, or start the server with --auto-truncate")
    items = [(e.ids, e.type_ids) for e in encodings]
    return items, sum(len(ids) for ids, _ in items)


async def until_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def answer(request: Request, work: Awaitable[Any]) -> Any:
    """`work`'s result, or CancelledError when the client goes away first (its job is dropped).

    `work` runs in the request's own task; one more task watches the connection and cancels that
    one when the client leaves (one task and no `asyncio.wait` per request, on the event loop)."""
    task = asyncio.current_task()
    watch = asyncio.ensure_future(until_disconnected(request))

    def gone(watched: asyncio.Future) -> None:
        if not watched.cancelled():
            task.cancel("client disconnected")

    watch.add_done_callback(gone)
    try:
        return await work
    finally:
        watch.remove_done_callback(gone)
        watch.cancel()


async def run_admitted(service: Service, request: Request, n: int, work: Callable[[], Awaitable[Any]]) -> Any:
    """Admit `n` inputs (or 429), run `work`, give the permits back however it ends."""
    with service.admission.acquire(n):
        service.metrics.in_flight.set(service.admission.in_flight)
        try:
            return await answer(request, work())
        finally:
            service.metrics.in_flight.set(service.admission.in_flight - n)


async def run_sliced(service: Service, request: Request, n: int,
                     work: Callable[[int, int], Awaitable[list[Any]]]) -> list[Any]:
    """`work(start, stop)` over consecutive slices of `n` inputs, one slice in flight at a time,
    holding the permits of one slice (`Limits.slice_size`) from the first to the last."""
    size = min(n, service.limits.slice_size)

    async def slices() -> list[Any]:
        out: list[Any] = []
        for start in range(0, n, size):
            out.extend(await work(start, min(n, start + size)))
        return out

    return await run_admitted(service, request, size, slices)
