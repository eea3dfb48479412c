"""The handlers: thin steps over the scheduler (read → admit → tokenize → run → shape).

text-embeddings-inference's routes and JSON (`router/src/http/server.rs`): POST / (dispatched
by the body and the model's head, as TEI's), /embed,
/embed_all, /embed_sparse, /similarity, /rerank, /predict, /tokenize, /decode; GET /health, /info, /metrics;
GET /ready (a replica's readiness, apart from /health's liveness);
and the uses TEI lacks: POST /fill-mask, /ner, /qa, /embed_multi. OpenAI's routes are in openai.py. Request
and answer shapes are declared in schemas.py; app.py lists every route once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from starlette.requests import Request
from starlette.responses import Response

from bertkit import __version__
from bertkit.constants import label_name
from bertkit.inference.classify import score_function
from bertkit.inference.tokens import tokens as pieces_of
from bertkit.serve import schemas
from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.metrics import CONTENT_TYPE_LATEST
from bertkit.serve.models import ServedModel
from bertkit.serve.responses import JSONResponse, array, stacked, unit_rows
from bertkit.serve.service import (
    RAW,
    Service,
    read_body,
    run_admitted,
    run_sliced,
    timing_of,
    tokenized,
    truncate_of,
    with_prompt,
)


async def body(service: Service, request: Request, model: type[schemas.Request], route: str) -> Any:
    raw = request.scope.get(RAW)  # read already by route_compat
    if raw is None:
        raw = await read_body(request, service.limits.payload_limit)
    return schemas.read(model, raw, route)


async def route_compat(service: Service, request: Request) -> Response:
    """TEI's POST /, what huggingface_hub's InferenceClient posts to: /rerank for a body with a
    `query`, /similarity for `inputs` with a `source_sentence`, /predict when the model (named,
    or the default) is a classifier, else /embed."""
    raw = request.scope[RAW] = await read_body(request, service.limits.payload_limit)
    try:
        value = json.loads(raw)
    except ValueError:
        value = None  # /embed's reading says what is wrong with it
    fields = value if isinstance(value, dict) else {}
    if "query" in fields:
        return await route_rerank(service, request)
    if isinstance(fields.get("inputs"), dict):
        return await route_similarity(service, request)
    name = fields.get("model")
    model = service.models.get(service.default if name is None else service.aliases.get(name, name)) \
        if name is None or isinstance(name, str) else None
    if model is not None and "predict" in model.uses:
        return await route_predict(service, request)
    return await route_embed(service, request)


async def vectors_of(service: Service, request: Request, model: ServedModel, texts: list[str],
                     truncate: bool, field_name: str, use: str = "embed") -> list[torch.Tensor]:
    """The runner `use`'s result per text (a pooled vector, or token vectors), admitted in slices."""
    timing = timing_of(request)

    async def work(start: int, stop: int) -> list[torch.Tensor]:
        items, tokens = await tokenized(service, request, model, texts[start:stop], None, truncate,
                                        field_name, offset=start)
        return await service.scheduler.submit(model, use, (), items, tokens, timing)

    return await run_sliced(service, request, len(texts), work)


def shaped(service: Service, model: ServedModel, vectors: np.ndarray, dimensions: int | None,
           normalize: bool) -> np.ndarray:
    """(N, H) → (N, dimensions or H), unit length if asked (after the cut: a Matryoshka prefix
    is re-normalised, as sentence-transformers' truncate_dim does); C-contiguous, as orjson
    writes arrays."""
    service.check_dimensions(model, dimensions)
    if dimensions is not None:
        vectors = np.ascontiguousarray(vectors[:, :dimensions])
    return unit_rows(vectors) if normalize else vectors


async def route_embed(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.EmbedRequest, "/embed")
    model = service.model(req.model, "embed")
    texts, _ = schemas.texts_of(req.inputs)
    service.limits.check_batch("inputs", len(texts))
    service.check_dimensions(model, req.dimensions)
    texts = with_prompt(service.prompt(model, req.prompt_name), texts)
    truncate = truncate_of(service, req.truncate)
    vectors = stacked(await vectors_of(service, request, model, texts, truncate, "inputs"))
    return JSONResponse(shaped(service, model, vectors, req.dimensions, req.normalize))


async def route_embed_all(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.EmbedAllRequest, "/embed_all")
    rows = await prompted_rows(service, request, req, service.model(req.model, "embed"), "token-vectors")
    return JSONResponse([array(row) for row in rows])


async def prompted_rows(service: Service, request: Request, req: schemas.EmbedAllRequest, model: ServedModel,
                        use: str) -> list[Any]:
    """The runner `use`'s result per input of /embed_all, /embed_sparse or /embed_multi, the model's prompt
    put before each."""
    texts, _ = schemas.texts_of(req.inputs)
    service.limits.check_batch("inputs", len(texts))
    texts = with_prompt(service.prompt(model, req.prompt_name), texts)
    return await vectors_of(service, request, model, texts, truncate_of(service, req.truncate), "inputs", use=use)


async def route_embed_sparse(service: Service, request: Request) -> Response:
    """TEI's /embed_sparse: per input [{"index", "value"}], its SPLADE term weights (a model
    with a masked-LM head) or BGE-M3's lexical weights (a model with M3's heads); any other is
    refused, 424, as TEI refuses a model without SPLADE pooling and as every head route here does."""
    req = await body(service, request, schemas.EmbedSparseRequest, "/embed_sparse")
    model = service.model(req.model, "embed_sparse")
    runner = "m3-sparse" if model.engine.m3 is not None else "embed-sparse"
    rows = await prompted_rows(service, request, req, model, runner)
    return JSONResponse([[{"index": i, "value": v} for i, v in zip(ix.tolist(), values.tolist())]
                         for ix, values in rows])


async def route_embed_multi(service: Service, request: Request) -> Response:
    """Multi-vector (late-interaction) embeddings: per input one unit vector per token, as the
    model's multi-vector head gives them (BGE-M3's ColBERT vectors: every token after [CLS]); a
    model without one is refused, 424."""
    req = await body(service, request, schemas.EmbedMultiRequest, "/embed_multi")
    rows = await prompted_rows(service, request, req, service.model(req.model, "embed_multi"), "multi-vector")
    return JSONResponse([array(row) for row in rows])


async def route_similarity(service: Service, request: Request) -> Response:
    """TEI's /similarity: the cosine of each sentence's embedding with the source sentence's."""
    req = await body(service, request, schemas.SimilarityRequest, "/similarity")
    model = service.model(req.model, "embed")
    params = req.parameters or schemas.SimilarityParameters()
    texts = [req.inputs.source_sentence, *req.inputs.sentences]
    service.limits.check_batch("inputs.sentences", len(texts) - 1)
    texts = with_prompt(service.prompt(model, params.prompt_name), texts)
    vectors = F.normalize(torch.stack(await vectors_of(service, request, model, texts,
                                                       truncate_of(service, params.truncate), "inputs")), dim=-1)
    return JSONResponse(array(vectors[1:] @ vectors[0]))


async def classifier_logits(service: Service, request: Request, model: ServedModel, texts: list[str],
                            pairs: list[str] | None, truncate: bool, field_name: str) -> torch.Tensor:
    timing = timing_of(request)

    async def work():
        items, tokens = await tokenized(service, request, model, texts, pairs, truncate, field_name)
        return torch.stack(await service.scheduler.submit(model, "logits", (), items, tokens, timing))

    return await run_admitted(service, request, len(texts), work)


async def route_predict(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.PredictRequest, "/predict")
    model = service.model(req.model, "predict")
    inputs, single = req.sequences()
    service.limits.check_batch("inputs", len(inputs))
    truncate = truncate_of(service, req.truncate)
    singles = [i for i, (_, b) in enumerate(inputs) if b is None]
    pairs = [i for i, (_, b) in enumerate(inputs) if b is not None]
    logits = torch.empty(len(inputs), model.engine.config.num_labels)
    # Texts and pairs tokenize separately (the tokenizer takes one kind per call) but share a run.
    parts = []
    if singles:
        parts.append((singles, classifier_logits(service, request, model, [inputs[i][0] for i in singles],
                                                 None, truncate, "inputs")))
    if pairs:
        parts.append((pairs, classifier_logits(service, request, model, [inputs[i][0] for i in pairs],
                                               [inputs[i][1] for i in pairs], truncate, "inputs")))
    for index, rows in zip([p[0] for p in parts], await asyncio.gather(*[p[1] for p in parts])):
        logits[index] = rows
    config = model.engine.config
    function = "none" if req.raw_scores else score_function(config)
    scores = logits.softmax(-1) if function == "softmax" else logits.sigmoid() if function == "sigmoid" else logits
    labels = config.id2label or {i: label_name(i) for i in range(config.num_labels)}
    out = [sorted(({"score": s, "label": labels[k]} for k, s in enumerate(row)), key=lambda p: -p["score"])
           for row in scores.tolist()]
    return JSONResponse(out[0] if single else out)


async def route_rerank(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.RerankRequest, "/rerank")
    model = service.model(req.model, "rerank")
    service.limits.check_batch("texts", len(req.texts))
    logits = await classifier_logits(service, request, model, [req.query] * len(req.texts), req.texts,
                                     truncate_of(service, req.truncate), "texts")
    raw = logits[:, 0]
    scores = (raw if req.raw_scores else raw.sigmoid()).tolist()
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return JSONResponse([{"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
                         for i in order])


def tokens_of(model: ServedModel, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    """TEI's /tokenize answer: per token its id, text, special flag and character span."""
    return pieces_of(model.engine, texts, add_special_tokens=add_special_tokens, tokenizer=model.tokenizer)


async def route_tokenize(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.TokenizeRequest, "/tokenize")
    model = service.model(req.model, "tokenize")
    texts, _ = schemas.texts_of(req.inputs)
    service.limits.check_batch("inputs", len(texts))
    texts = with_prompt(service.prompt(model, req.prompt_name), texts)
    return JSONResponse(await service.scheduler.tokenize(tokens_of, model, texts, req.add_special_tokens))


def decoded(model: ServedModel, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
    vocab = model.tokenizer.vocab_size
    for i, row in enumerate(ids):
        for j, token in enumerate(row):
            if token >= vocab:
                where = f"ids[{i}][{j}]" if len(ids) > 1 else f"ids[{j}]"
                raise validation(f"`{where}` is {token}, past the vocabulary of model {model.name!r} "
                                 f"({vocab} tokens: ids 0..{vocab - 1})")
    return [model.tokenizer.decode(row, skip_special_tokens=skip_special_tokens) for row in ids]


async def route_decode(service: Service, request: Request) -> Response:
    """TEI's /decode: token ids back to text, one string per list of ids."""
    req = await body(service, request, schemas.DecodeRequest, "/decode")
    model = service.model(req.model, "tokenize")
    ids = req.ids if req.ids and isinstance(req.ids[0], list) else [req.ids]
    service.limits.check_batch("ids", len(ids))
    return JSONResponse(await service.scheduler.tokenize(decoded, model, ids, req.skip_special_tokens))


async def library_use(service: Service, request: Request, model: ServedModel, use: str, key: tuple,
                      items: list[Any], chars: int) -> list[Any]:
    """A use run by the library on merged inputs; tokens estimated from characters (~4 a token)."""
    timing = timing_of(request)
    timing.characters += chars
    return await run_admitted(service, request, len(items), lambda: service.scheduler.submit(
        model, use, key, items, chars // 4 + 2 * len(items), timing))


async def route_fill_mask(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.FillMaskRequest, "/fill-mask")
    model = service.model(req.model, "fill-mask")
    texts, single = schemas.texts_of(req.inputs)
    service.limits.check_batch("inputs", len(texts))
    targets = tuple(schemas.texts_of(req.targets)[0]) if req.targets is not None else None
    out = await library_use(service, request, model, "fill-mask", (req.top_k, targets), texts,
                            sum(map(len, texts)))
    return JSONResponse(out[0] if single else out)


async def route_ner(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.NerRequest, "/ner")
    model = service.model(req.model, "ner")
    texts, single = schemas.texts_of(req.inputs)
    service.limits.check_batch("inputs", len(texts))
    out = await library_use(service, request, model, "ner", (), texts, sum(map(len, texts)))
    return JSONResponse(out[0] if single else out)


async def route_qa(service: Service, request: Request) -> Response:
    req = await body(service, request, schemas.QARequest, "/qa")
    model = service.model(req.model, "qa")
    questions, single = schemas.texts_of(req.question)
    contexts, _ = schemas.texts_of(req.context)
    if len(contexts) == 1 and len(questions) > 1:
        contexts = contexts * len(questions)
    if len(contexts) != len(questions):
        raise validation(f"`context` has {len(contexts)} texts for {len(questions)} questions; send "
                         "one context per question, or one for all")
    service.limits.check_batch("question", len(questions))
    items = list(zip(questions, contexts))
    out = await library_use(service, request, model, "qa", (req.top_k, req.max_answer_length, req.allow_no_answer),
                            items, sum(len(q) + len(c) for q, c in items))
    return JSONResponse(out[0] if single else out)


async def route_health(service: Service, request: Request) -> Response:
    if service.scheduler is None or not service.scheduler.alive:
        raise ServeError(ErrorType.UNHEALTHY, "the model thread is not running (starting or shutting down)",
                         retry_after=1)
    return Response(status_code=200)


async def route_ready(service: Service, request: Request) -> Response:
    """Readiness, apart from liveness (/health): 200 while this process takes new work."""
    problem = service.unready()
    if problem is not None:
        raise problem
    return Response(status_code=200)


def model_info(service: Service, model: ServedModel) -> dict[str, Any]:
    return {**model.describe(), "aliases": [a for a, m in service.aliases.items() if m == model.name]}


async def route_info(service: Service, request: Request) -> Response:
    limits = service.limits
    return JSONResponse({**model_info(service, service.models[service.default]),
                         "max_concurrent_requests": limits.max_concurrent_requests,
                         "max_batch_tokens": limits.max_batch_tokens, "max_batch_requests": None,
                         "max_client_batch_size": limits.max_client_batch_size,
                         "openai_max_batch_size": limits.openai_max_batch_size,
                         "payload_limit": limits.payload_limit, "auto_truncate": limits.auto_truncate,
                         "tokenization_workers": 1, "version": __version__,
                         "models": [model_info(service, m) for m in service.models.values()],
                         "indexes": [i.describe() for i in service.indexes.values()]})


async def route_metrics(service: Service, request: Request) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
