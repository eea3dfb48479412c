"""POST /search: indexes made by `bertkit index`, searched over HTTP (`bertkit serve --index NAME=DIR`).

A request's queries are tokenized and embedded like any /embed request: on the service's model
thread, in the same runs as the other routes' inputs (`Scheduler.submit`), by a served model
whose fingerprint (weights, config, pooling files, tokenizer: `retrieval.model_fingerprint`)
equals the index's, or, where none does, by the index's own model, loaded for it at start-up. The
index's backend and BM25 then run on a worker thread (`Searcher.first_hits`), so the event loop
never scans vectors; a reranker named in the request (a served cross-encoder) scores each
(query, passage) pair on the model thread too, at the length it was trained at, as `bertkit
search --rerank` does (`Searcher.reranked` orders them). The answer equals the library's
`Searcher.search` for the same settings: the same vectors, passages and order.

An index built with --multi-vector has its side opened at start-up with a model of its own, whose
query tokens are encoded on the worker thread (one call at a time: a lock); `systems` and
`hybrid` (rrf, zscore, BGE-M3's weighted) read or fuse it as `bertkit search --multi-vector` does.

Queries longer than the length the index was built at are refused (422) unless the request or
the server says to cut them (`truncate`, --auto-truncate), as on /embed.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from starlette.requests import Request
from starlette.responses import Response

from bertkit.retrieval import Searcher, model_fingerprint, open_index
from bertkit.retrieval.bm25 import BM25
from bertkit.retrieval.index import BM25_DIR, MV_DIR
from bertkit.retrieval.multivector import MV_FILE, MultiVectorSearcher
from bertkit.serve import schemas
from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.models import ServedModel, load_model, parse_named_dirs
from bertkit.serve.responses import JSONResponse
from bertkit.serve.routes import body
from bertkit.serve.service import Service, run_admitted, run_sliced, timing_of, tokenized, truncate_of

__all__ = ["ServedIndex", "load_indexes", "parse_index_args", "route_search"]


@dataclass
class ServedIndex:
    """One index of the service: its name, the Searcher over it, and the model that embeds its queries."""
    name: str
    searcher: Searcher
    model: ServedModel  # a served model with the index's fingerprint, or the index's own (own_model)
    own_model: bool
    pooling: str  # how the index's vectors were pooled and normalised; queries are made the same way
    normalize: bool

    @property
    def max_length(self) -> int:
        """Pieces per query: the length the index was built at (within the model's)."""
        return min(int(self.searcher.index.meta["max_length"]), self.model.max_length)

    @property
    def run_key(self) -> tuple:
        """The embed runner's key: () is the model's own pooling (then these queries share runs
        with /embed's requests), else the index's mode."""
        own = self.model.engine.pooling
        return () if self.pooling == (own.mode if own else "mean") else (self.pooling,)

    def describe(self) -> dict[str, Any]:
        meta = self.searcher.index.meta
        return {"name": self.name, "path": str(self.searcher.index.path), "model": self.model.name,
                "model_dir": meta["model"], "own_model": self.own_model,
                "backend": self.searcher.backend.name, "documents": meta["documents"], "passages": meta["rows"],
                "dim": meta["dim"], "max_length": self.max_length, "hybrid": bool(meta.get("bm25")),
                "multivector": self.searcher.multivector is not None,
                "passage_tokens": (meta.get("passages") or {}).get("tokens", 0)}


class LockedEncoder:
    """A multi-vector side whose query encoder runs one call at a time (worker threads share it)."""

    def __init__(self, side: MultiVectorSearcher):
        self.side, self.index, self.lock = side, side.index, threading.Lock()

    def encode(self, queries: list[str]) -> list[np.ndarray]:
        with self.lock:
            return self.side.encode(queries)


def parse_index_args(specs: list[str]) -> list[tuple[str, str]]:
    """["NAME=DIR" or "DIR", ...] → [(name, dir)]; a bare DIR is named after its last part."""
    return parse_named_dirs(specs, what="--index", plural="indexes", form="NAME=INDEX_DIR", flag="--index ")


def load_indexes(specs: list[tuple[str, str]], models: dict[str, ServedModel],
                 **engine_options: Any) -> dict[str, ServedIndex]:
    """Open each (name, index dir); its queries go to the first served model with its fingerprint,
    else to its own model, loaded here (engine_options: precision, device, max_batch_tokens)."""
    prints: dict[str, dict[str, str]] = {}
    out: dict[str, ServedIndex] = {}
    for name, directory in specs:
        index = open_index(directory)
        meta = index.meta
        saved = meta["fingerprint"]
        model = None
        for served in models.values():
            if "embed" not in served.uses or served.engine.model_dir is None:
                continue
            if served.name not in prints:
                prints[served.name] = model_fingerprint(served.engine.model_dir, served.engine.tokenizer)
            if prints[served.name] == saved:
                model = served
                break
        own = model is None
        if own:
            if not os.path.isdir(meta["model"]):
                raise FileNotFoundError(f"--index {name}: the index's model {meta['model']} is not there any "
                                        "more, and no served model has its fingerprint; serve the same model "
                                        "beside it, or rebuild the index")
            index.check_model(meta["model"])  # before loading weights
            options = {**engine_options, "max_length": meta["max_length"]}
            model = load_model(f"index/{name}", meta["model"], **options)
            index.check_model(model.engine.model_dir, model.engine.tokenizer)
        searcher = Searcher(index, model.engine)
        if meta.get("bm25") and (index.path / BM25_DIR).is_dir():  # now, not on the first hybrid request
            searcher.bm25 = BM25.load(index.path / BM25_DIR)
        if (index.path / MV_DIR / MV_FILE).is_file():
            # Its own engine: the served one runs on the model thread, this one on the worker thread.
            options = {k: v for k, v in engine_options.items() if k != "max_length"}
            searcher.multivector = LockedEncoder(MultiVectorSearcher.open(index.path, rows=meta["rows"], **options))
        out[name] = ServedIndex(name, searcher, model, own, meta["pooling"], bool(meta["normalize"]))
    return out


def index_of(service: Service, name: str | None) -> ServedIndex:
    if not service.indexes:
        raise ServeError(ErrorType.NOT_FOUND, "no index is served here; start the server with "
                         "--index NAME=INDEX_DIR (an index made by `bertkit index`)")
    found = service.indexes.get(next(iter(service.indexes)) if name is None else name)
    if found is None:
        raise ServeError(ErrorType.NOT_FOUND, f"index {name!r} is not served here; `index` must be one of "
                         f"{', '.join(map(repr, service.indexes))}")
    return found


async def query_vectors(service: Service, request: Request, index: ServedIndex, queries: list[str],
                        truncate: bool) -> np.ndarray:
    """(Q, H) the queries' vectors, pooled and normalised as the index's, from the model thread."""
    timing = timing_of(request)

    async def work():
        items, tokens = await tokenized(service, request, index.model, queries, None, truncate, "query",
                                        max_length=index.max_length,
                                        why=f"the length index {index.name!r} was built at")
        return await service.scheduler.submit(index.model, "embed", index.run_key, items, tokens, timing)

    vectors = torch.stack(await run_admitted(service, request, len(queries), work)).float()  # (Q, H)
    return (F.normalize(vectors, dim=-1) if index.normalize else vectors).numpy()


async def rerank_scores(service: Service, request: Request, reranker: ServedModel, queries: list[str],
                        passages: list[list[str]]) -> list[np.ndarray]:
    """Per query, (C,) the cross-encoder's raw scores of its (query, passage) pairs, cut at the
    length it was trained at (its tokenizer's model_max_length, as `retrieval.load_reranker`);
    every query's pairs in the same runs, admitted in slices as /v1/embeddings' inputs."""
    timing = timing_of(request)
    length = max(3, min(reranker.tokenizer.model_max_length, reranker.max_length))
    firsts = [q for q, ps in zip(queries, passages) for _ in ps]
    seconds = [p for ps in passages for p in ps]

    async def work(start: int, stop: int) -> list[Any]:
        items, tokens = await tokenized(service, request, reranker, firsts[start:stop], seconds[start:stop],
                                        True, "query", max_length=length)
        return await service.scheduler.submit(reranker, "logits", (), items, tokens, timing)

    rows = await run_sliced(service, request, len(seconds), work) if seconds else []
    scores = np.array([float(r[0]) for r in rows], dtype=np.float32)
    bounds = np.cumsum([0] + [len(ps) for ps in passages])
    return [scores[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def hit_json(hit: Any, return_text: bool) -> dict[str, Any]:
    out = {"rank": hit.rank, "id": str(hit.id), "score": hit.score, "passage": hit.passage, "start": hit.start,
           "end": hit.end, "passage_number": hit.passage_number, "first_stage_score": hit.first_stage_score,
           "rerank_score": hit.rerank_score, "dense_score": hit.dense_score, "bm25_score": hit.bm25_score,
           "multivector_score": hit.multivector_score}
    if return_text:
        out["text"] = hit.text
    return out


async def route_search(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.SearchRequest, "/search")
    started = time.perf_counter()
    index = index_of(service, req.index)
    queries, single = schemas.texts_of(req.query)
    service.limits.check_batch("query", len(queries))
    reranker = service.model(req.rerank, "rerank") if req.rerank is not None else None
    searcher = index.searcher
    try:
        systems = searcher.check(top_k=req.top_k, candidates=req.candidates, rerank_weight=req.rerank_weight,
                                 hybrid=req.hybrid, rerank=reranker is not None, systems=req.systems)
    except ValueError as err:
        raise validation(str(err).replace("--rerank CROSS_ENCODER", "`rerank` (a served cross-encoder)")
                         .replace("--candidates", "`candidates`")
                         .replace("(--multi-vector; Searcher.open(..., multi_vector=True))",
                                  f"(index {index.name!r} has none; build it with `bertkit index --multi-vector`)")
                         .replace("--hybrid", "`hybrid`")) from None
    vectors = None
    if "dense" in systems:
        vectors = await query_vectors(service, request, index, queries, truncate_of(service, req.truncate))
    embedded = time.perf_counter()
    found = await asyncio.to_thread(searcher.first_hits, queries, vectors, top_k=req.top_k,
                                    candidates=req.candidates, hybrid=req.hybrid, ef=req.ef, nprobe=req.nprobe,
                                    rerank=reranker is not None, systems=systems)
    retrieved = time.perf_counter()
    if reranker is not None:
        logits = await rerank_scores(service, request, reranker, queries, [[h.passage for h in hits] for hits in found])
        found = [Searcher.reranked(hits, scores, top_k=req.top_k, rerank_weight=req.rerank_weight)
                 for hits, scores in zip(found, logits)]
    done = time.perf_counter()
    documents = [[hit_json(h, req.return_text) for h in hits] for hits in found]
    return JSONResponse({"index": index.name, "model": index.model.name,
                         "reranker": reranker.name if reranker is not None else None,
                         "documents": documents[0] if single else documents,
                         "timings": {"embed_ms": round((embedded - started) * 1000, 3),
                                     "retrieve_ms": round((retrieved - embedded) * 1000, 3),
                                     "rerank_ms": round((done - retrieved) * 1000, 3),
                                     "total_ms": round((done - started) * 1000, 3)}})
