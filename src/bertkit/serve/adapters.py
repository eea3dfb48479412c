"""LoRA adapters in the service: many tasks over one base model in memory, batched together,
loaded and dropped while it serves.

`bertkit serve BASE --adapter NAME=DIR ...` attaches an `adapters.AdapterHost` to the base's
engine and serves each adapter as a model of its own name: a request's `model` field picks it
(names of models, aliases and adapters are one namespace), `/info` and `/v1/models` list it with
its base (`root`). The scheduler merges queued requests for the adapters of one base (and the
base itself) into one engine run (`mixed.run_mixed`): the base's matmuls once over every row, each
adapter's low-rank terms and head on its own rows. Embeddings and classifier logits (predict,
rerank, the OpenAI route) mix in one batch; NER and QA requests run per adapter, over the same
base weights.

With `--adapter-root DIR` (which needs `--api-key`), `POST /adapters` loads an adapter directory
inside DIR (anything that resolves outside it: 403) and `DELETE /adapters/NAME` drops one: the
name leaves the namespace at once (new requests: 404), requests already queued for it finish, then
its terms leave the layers between two batches. A directory that is not a whole adapter for the
base is refused (422) and the others keep serving.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Sequence

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from bertkit.adapters import AdapterError, AdapterHost
from bertkit.adapters.files import read_config, short
from bertkit.encoder import tasks
from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.models import ServedModel
from bertkit.serve.responses import JSONResponse
from bertkit.serve.schemas import Model, read
from bertkit.serve.schemas import Request as RequestModel
from bertkit.serve.service import read_body

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class AdapterRequest(RequestModel):
    name: Annotated[str, Field(pattern=NAME_PATTERN, description="the name requests give in `model`; "
                                                                 "unique among models, aliases and adapters")]
    path: Annotated[str, Field(min_length=1, max_length=4096,
                               description="the adapter directory, relative to --adapter-root (or inside it)")]
    base: Model = None


class AdapterInfo(BaseModel):
    name: str
    base: str
    use: str
    uses: list[str]
    dir: str
    r: int
    lora_alpha: float
    parameters: int
    labels: list[str] | None = None


class AdapterDropped(BaseModel):
    name: str
    dropped: bool


@dataclass
class ServedAdapters:
    """The adapter hosts of a service (one per served base) and the directory POST /adapters may read."""
    hosts: dict[str, AdapterHost]
    models: dict[str, ServedModel]  # the base models by name
    root: Path | None = None
    _reserved: set[str] = field(default_factory=set)

    @classmethod
    def attach(cls, models: dict[str, ServedModel], root: str | os.PathLike | None = None) -> "ServedAdapters":
        """A host on every served model that can take adapters (not ALBERT)."""
        if root is not None and not Path(root).is_dir():
            raise ValueError(f"--adapter-root {root} is not a directory")
        hosts = {name: AdapterHost(m.engine, m.engine.model_dir, name) for name, m in models.items()
                 if not m.engine.config.family.shares_layers}
        if not hosts:
            raise ValueError("no served model can take adapters (ALBERT shares its layers across the depth)")
        return cls(hosts, dict(models), Path(root).resolve() if root is not None else None)

    def host_for(self, directory: Path, base: str | None) -> AdapterHost:
        """The base an adapter belongs to: the one asked for, else the one whose weights its side
        file names, else the only one."""
        if base is not None:
            if base not in self.hosts:
                raise ServeError(ErrorType.NOT_FOUND, f"base {base!r} is not a served model that takes adapters; "
                                 f"bases: {', '.join(map(repr, self.hosts))}")
            return self.hosts[base]
        _, side = read_config(directory)
        wanted = ((side or {}).get("base") or {}).get("fingerprint")
        if wanted:
            for host in self.hosts.values():
                if host.fingerprint == wanted:
                    return host
            raise AdapterError(f"adapter {directory} was made for the base {side['base'].get('path')} (weights "
                               f"{short(wanted)}), which no served model has; served: " + ", ".join(
                                   f"{n} (weights {short(h.fingerprint)})" for n, h in self.hosts.items()))
        if len(self.hosts) == 1:
            return next(iter(self.hosts.values()))
        raise AdapterError(f"adapter {directory} has no bertkit_adapter.json naming its base, and several "
                           f"models are served ({', '.join(self.hosts)}); say which: NAME=DIR@BASE, or "
                           "`base` in POST /adapters")

    def load(self, name: str, directory: str | os.PathLike, base: str | None = None) -> ServedModel:
        """Install an adapter and make the model that serves it (the caller registers the name)."""
        directory = Path(directory)
        host = self.host_for(directory, base)
        adapter = host.add(name, directory)
        config = adapter.engine.config
        routes = [*tasks.COMMON_ROUTES, *tasks.USES[adapter.use].routes]
        if adapter.use in ("classify", "rerank") and tasks.is_cross_encoder(config):
            routes += [r for r in (*tasks.USES["classify"].routes, *tasks.USES["rerank"].routes) if r not in routes]
        # The base's two tokenizers, not copies (a copy per adapter costs memory for nothing): every
        # model's `tokenizer` is used by the one tokenizing thread, `loop_tokenizer` by the event loop.
        base_model = self.models[host.name]
        return ServedModel(name, adapter.engine, base_model.tokenizer, tuple(routes),
                           loop_tokenizer=base_model.loop_tokenizer, base=host.name, adapter=adapter.describe())

    def drop(self, model: ServedModel) -> None:
        self.hosts[model.base].remove(model.name)

    def reserve(self, name: str) -> None:
        if name in self._reserved:
            raise validation(f"an adapter named {name!r} is being loaded already")
        self._reserved.add(name)

    def release(self, name: str) -> None:
        self._reserved.discard(name)

    def inside_root(self, path: str) -> Path:
        """`path` under --adapter-root, resolved (links too); 403 when it leads outside."""
        if self.root is None:
            raise ServeError(ErrorType.FORBIDDEN, "loading adapters at run time is off; start the server "
                             "with --adapter-root DIR and --api-key KEY")
        target = (self.root / path).resolve()
        if target != self.root and self.root not in target.parents:
            raise ServeError(ErrorType.FORBIDDEN, f"path {path!r} is outside the --adapter-root; adapters load "
                             "only from inside it")
        return target


def parse_adapter_args(specs: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """["NAME=DIR", "NAME=DIR@BASE", ...] → [(name, dir, base or None)]."""
    out: list[tuple[str, str, str | None]] = []
    for spec in specs:
        name, sep, rest = spec.partition("=")
        directory, at, base = rest.rpartition("@") if "@" in rest else (rest, "", "")
        if not sep or not name or not directory:
            raise ValueError(f"--adapter {spec!r}: write NAME=ADAPTER_DIR (or NAME=ADAPTER_DIR@BASE_MODEL)")
        if any(name == n for n, _, _ in out):
            raise ValueError(f"--adapter: two adapters are named {name!r}; every name is unique")
        out.append((name, directory, base or None))
    return out


# ---------------------------------------------------------------------------------------------
# the routes
# ---------------------------------------------------------------------------------------------
def _adapters(service) -> ServedAdapters:
    adapters = getattr(service, "adapters", None)
    if adapters is None or adapters.root is None:
        raise ServeError(ErrorType.FORBIDDEN, "loading and dropping adapters at run time is off; start the "
                         "server with --adapter-root DIR and --api-key KEY")
    return adapters


def loaded(service) -> list[str]:
    return [name for name, m in service.models.items() if m.base is not None]


async def route_load(service, request: Request) -> Response:
    """POST /adapters: load an adapter directory under --adapter-root as `name`."""
    adapters = _adapters(service)
    body = read(AdapterRequest, await read_body(request, service.limits.payload_limit), "/adapters")
    if body.name in service.names():
        raise validation(f"`name` {body.name!r} is taken (models, aliases and adapters share one namespace: "
                         f"{', '.join(map(repr, service.names()))})")
    directory = adapters.inside_root(body.path)
    adapters.reserve(body.name)
    try:
        model = await asyncio.to_thread(adapters.load, body.name, directory, body.base)
    except (AdapterError, ValueError) as err:
        raise validation(f"adapter {body.path!r} was not loaded: {err}") from None
    finally:
        adapters.release(body.name)
    service.models[body.name] = model
    return JSONResponse(info(model))


async def route_drop(service, request: Request) -> Response:
    """DELETE /adapters/{name}: new requests for it get 404 now; queued ones finish; then it is dropped."""
    adapters = _adapters(service)
    name = request.path_params["name"]
    model = service.models.get(name)
    if model is None or model.base is None:
        raise ServeError(ErrorType.NOT_FOUND, f"no adapter {name!r} is loaded; loaded adapters: "
                         f"{', '.join(map(repr, loaded(service))) or 'none'}")
    del service.models[name]
    while service.scheduler is not None and service.scheduler.pending(model):
        await asyncio.sleep(0.005)
    await asyncio.to_thread(adapters.drop, model)
    return JSONResponse({"name": name, "dropped": True})


def info(model: ServedModel) -> dict[str, Any]:
    described = model.adapter or {}
    return {"name": model.name, "base": model.base, "use": described.get("use"), "uses": list(model.uses),
            "dir": described.get("dir"), "r": described.get("r"), "lora_alpha": described.get("lora_alpha"),
            "parameters": described.get("parameters"), "labels": described.get("labels")}


__all__ = ["ServedAdapters", "AdapterRequest", "AdapterInfo", "AdapterDropped", "parse_adapter_args", "route_load",
           "route_drop"]
