"""The explorer's request and answer models, declared once: the routes validate with them and
GET /openapi.json describes them (`bertkit.util.webapi`).

Requests are strict and closed, as the service's: a string is not a number, an unknown key is
refused by name. What depends on the model (a layer past its depth, a position past the text)
is checked by the view, with the same 422 and error shape.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from bertkit.explore.views import MAX_PAD, TOP_K

Text = Annotated[str, Field(pattern=r"\S", description="a non-empty text")]
Pair = Annotated[str | None, Field(description="a second text (segment B), or none")]


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class VisibilityRequest(Request):
    text: Text
    pair: Pair = None
    position: Annotated[int, Field(ge=0, le=1 << 20, description="the token whose view is shown")] = 1


class AssemblyRequest(Request):
    text: Text
    pair: Pair = None
    position: Annotated[int, Field(ge=0, le=1 << 20)] = 0


class MaskingRequest(Request):
    text: Text
    seed: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] = 0
    whole_word: bool = False
    mlm_probability: Annotated[float, Field(gt=0, le=1)] = 0.15


class FillMaskRequest(Request):
    texts: Annotated[list[Text], Field(min_length=1)]
    top_k: Annotated[int, Field(ge=1, le=50)] = TOP_K


class AttentionRequest(Request):
    text: Text
    pair: Pair = None
    pad: Annotated[int, Field(ge=0, le=MAX_PAD)] = 4
    layer: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    head: Annotated[int, Field(ge=0, le=1 << 20)] = 0


class TaskRequest(Request):
    """`model`: a task model's name (GET /api/info lists them); the other fields as its use needs:
    text (+ pair) for a classifier, text for NER, question + context for QA, texts for an
    encoder, query + texts for a reranker."""
    model: str
    text: str | None = None
    pair: str | None = None
    question: str | None = None
    context: str | None = None
    texts: list[str] | None = None
    query: str | None = None


class ErrorResponse(BaseModel):
    error: str
    error_type: str


class InfoResponse(BaseModel):
    model: dict[str, Any]
    examples: dict[str, Any]
    tasks: list[dict[str, Any]]


class VisibilityResponse(BaseModel):
    tokens: list[str]
    segments: list[int]
    position: int
    special: list[bool]
    bert: list[list[int]]
    gpt: list[list[int]]
    objectives: Any


class AssemblyResponse(BaseModel):
    tokens: list[str]
    ids: list[int]
    segments: list[int]
    positions: Any
    position: int
    dims: int
    vectors: dict[str, list[float] | None]
    norms: dict[str, float | None]


class MaskingResponse(BaseModel):
    tokens: list[str]
    special: list[bool]
    word_starts: list[bool]
    words: Any
    kinds: list[str]
    input_tokens: list[str]
    labels: list[int]
    counts: Any
    predictions: list[dict[str, Any]]
    loss: float | None


class Candidate(BaseModel):
    token: str
    token_id: int
    score: float  # the softmax probability, named as every fill-mask answer names it


class FillMaskResponse(BaseModel):
    results: list[list[list[Candidate]]]  # per text, per [MASK], the candidates


class AttentionResponse(BaseModel):
    tokens: list[str]
    special: list[bool]
    layers: int
    heads: int
    attention: list[list[list[list[float]]]]  # (L, nh, T, T)
    padding: dict[str, Any]


class TaskResponse(BaseModel):
    use: str  # classify, ner, qa, embed or rerank; the other keys are that use's answer
    model_config = ConfigDict(extra="allow")
