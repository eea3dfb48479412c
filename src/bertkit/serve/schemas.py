"""Request and response models, declared once: validation reads them, and so does /openapi.json.

Fields and defaults are text-embeddings-inference's (`router/src/http/types.rs`) and OpenAI's
(`/v1/embeddings`, `/v1/models`), plus an optional `model` on every request (the name or alias of
one of the served models; absent = the first). Requests are strict (a string is not a number,
"true" is not true) and closed (an unknown key is refused by name, so a typo such as "input" for
"inputs" is not silently ignored). `read` turns the first problem into one line naming the field
(`webapi.parse`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, RootModel, Tag, model_validator
from pydantic_core import PydanticCustomError

from bertkit.serve.errors import ErrorType, validation
from bertkit.util.webapi import RequestError, parse

# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
Text = Annotated[str, Field(pattern=r"\S", description="a non-empty text")]
Model = Annotated[str | None, Field(description="the served model's name or alias (absent: the first model)")]


def _shape(value: Any) -> str:
    return "<texts>" if isinstance(value, list) else "<text>"


# A text or a non-empty list of texts. The branches are tagged so an error names the field, not
# pydantic's union member; TAGS says what each branch takes, for messages.
Texts = Annotated[Union[Annotated[Text, Tag("<text>")],
                        Annotated[list[Text], Field(min_length=1), Tag("<texts>")]], Discriminator(_shape)]


def _pair_shape(value: Any) -> str:
    if isinstance(value, str):
        return "<text>"
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return "<pair>"
    return "<batch>" if isinstance(value, list) else "<text>"


def _item_shape(value: Any) -> str:
    return "<pair>" if isinstance(value, list) else "<text>"


Seq = Annotated[list[Text], Field(min_length=1, max_length=2, description="[text] or [text, pair]")]
Item = Annotated[Union[Annotated[Text, Tag("<text>")], Annotated[Seq, Tag("<pair>")]], Discriminator(_item_shape)]
PredictInputs = Annotated[Union[Annotated[Text, Tag("<text>")],
                                Annotated[Seq, Tag("<pair>")],
                                Annotated[list[Item], Field(min_length=1), Tag("<batch>")]],
                          Discriminator(_pair_shape)]
TAGS = {"<text>": "a string or a list of strings", "<texts>": "a list of strings",
        "<pair>": "a list of one or two strings (a text, or a text and its pair)",
        "<batch>": "a text, a pair or a list of them", "<ids>": "a list of token ids",
        "<id lists>": "a list of lists of token ids"}

Truncate = Annotated[bool | None, Field(description="cut inputs over the model's limit (absent: the "
                                              "server's --auto-truncate); false: refuse them (422)")]
# TEI's enum; only the end of a text is cut here, so "Left" is refused with the field named.
Direction = Annotated[Literal["Right"], Field(description="which end is cut: the right (TEI's \"Left\" is not done)")]
PromptName = Annotated[str | None, Field(description="a key of the model's sentence-transformers `prompts`: "
                                                 "its text is put before each input (absent: the "
                                                 "server's --default-prompt-name, or the model's own default)")]
Dimensions = Annotated[int | None, Field(ge=1, le=1 << 20, description="keep the first N dimensions "
                                         "(Matryoshka) and re-normalise; allowed where the model declares it "
                                         "or the server runs with --allow-truncated-dimensions")]


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class EmbedRequest(Request):
    inputs: Texts
    normalize: bool = True
    truncate: Truncate = None
    truncation_direction: Direction = "Right"
    prompt_name: PromptName = None
    dimensions: Dimensions = None
    model: Model = None


class EmbedAllRequest(Request):
    inputs: Texts
    truncate: Truncate = None
    truncation_direction: Direction = "Right"
    prompt_name: PromptName = None
    model: Model = None


def _token_ids(value: Any) -> bool:
    """A list of integers, or of lists of integers (OpenAI's token-id inputs)."""
    def ints(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)

    return ints(value) or (isinstance(value, list) and bool(value) and all(ints(v) for v in value))


TOKEN_IDS = ("`input` holds token ids; this server reads text: send the strings themselves (a string "
             "or a list of strings). LangChain's OpenAIEmbeddings sends token ids by default: "
             "construct it with check_embedding_ctx_length=False")


class OpenAIEmbeddingRequest(Request):
    input: Texts
    model: Model = None
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    dimensions: Dimensions = None

    @model_validator(mode="before")
    @classmethod
    def _no_token_ids(cls, data: Any) -> Any:
        # OpenAI's API takes token ids too (a list of integers, or of lists of them); the answer
        # to a client that sends them says how to send text instead.
        if isinstance(data, dict) and _token_ids(data.get("input")):
            raise PydanticCustomError("bertkit", TOKEN_IDS)
        return data


class RerankRequest(Request):
    query: Text
    texts: Annotated[list[Text], Field(min_length=1)]
    raw_scores: bool = False
    return_text: bool = False
    truncate: Truncate = None
    truncation_direction: Direction = "Right"
    model: Model = None


class PredictRequest(Request):
    """TEI's `inputs`: "text" | ["text", "pair"] (one pair) | a list of "text" / ["text"] /
    ["text", "pair"] (a batch). A list of exactly two strings is one pair, as in TEI."""
    inputs: PredictInputs
    raw_scores: bool = False
    truncate: Truncate = None
    truncation_direction: Direction = "Right"
    model: Model = None

    def sequences(self) -> tuple[list[tuple[str, str | None]], bool]:
        """[(text, pair or None)] and whether one sequence was sent (then one answer, not a list)."""
        value = self.inputs
        if isinstance(value, str):
            return [(value, None)], True
        if len(value) == 2 and all(isinstance(v, str) for v in value):
            return [(value[0], value[1])], True
        return [((v, None) if isinstance(v, str) else (v[0], v[1] if len(v) == 2 else None)) for v in value], False


class TokenizeRequest(Request):
    inputs: Texts
    add_special_tokens: bool = True
    prompt_name: PromptName = None
    model: Model = None


TokenId = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]


def _ids_shape(value: Any) -> str:
    return "<id lists>" if isinstance(value, list) and value and isinstance(value[0], list) else "<ids>"


class DecodeRequest(Request):
    ids: Annotated[Union[Annotated[list[TokenId], Tag("<ids>")],
                         Annotated[list[list[TokenId]], Field(min_length=1), Tag("<id lists>")]],
                   Discriminator(_ids_shape)]
    skip_special_tokens: bool = True
    model: Model = None


class SimilarityInput(Request):
    source_sentence: Text
    sentences: Annotated[list[Text], Field(min_length=1)]


class SimilarityParameters(Request):
    truncate: Truncate = None
    truncation_direction: Direction = "Right"
    prompt_name: PromptName = None


class SimilarityRequest(Request):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    model: Model = None


class FillMaskRequest(Request):
    inputs: Texts
    top_k: Annotated[int, Field(ge=1, le=1000)] = 5
    targets: Texts | None = None
    model: Model = None


class EmbedSparseRequest(EmbedAllRequest):
    """TEI's /embed_sparse: SPLADE term weights from a masked-LM head, or BGE-M3's lexical weights."""


class EmbedMultiRequest(EmbedAllRequest):
    """/embed_multi: a multi-vector head's token vectors (BGE-M3's ColBERT vectors)."""


class NerRequest(Request):
    inputs: Texts
    model: Model = None


class QARequest(Request):
    question: Texts
    context: Texts
    top_k: Annotated[int, Field(ge=1, le=100)] = 1
    max_answer_length: Annotated[int, Field(ge=1, le=100_000)] = 30
    allow_no_answer: bool = False
    model: Model = None


class SearchRequest(Request):
    """POST /search: documents of a served index (`--index NAME=DIR`) for one query or a list."""
    query: Texts
    index: Annotated[str | None, Field(description="the served index's name (absent: the first)")] = None
    top_k: Annotated[int, Field(ge=1, le=1000, description="documents per query")] = 10
    candidates: Annotated[int, Field(ge=1, le=1000, description="first-stage documents the reranker "
                                     "orders, or each side of a hybrid fusion brings")] = 100
    rerank: Annotated[str | None, Field(description="a served cross-encoder's name: it orders the "
                                        "candidates by their best passage")] = None
    rerank_weight: Annotated[float, Field(ge=0, le=1, description="order by W · reranker + (1 − W) · first "
                                          "stage, each standardised (1: the reranker alone)")] = 1.0
    hybrid: Annotated[Literal["rrf", "zscore", "weighted"] | None, Field(
        description="fuse the dense ranking with BM25's (the index's own), or the `systems` named: "
        "reciprocal ranks, z-scores, or BGE-M3's weighted sum")] = None
    systems: Annotated[list[Literal["dense", "bm25", "multivector"]] | None, Field(
        min_length=1, max_length=3, description="the rankings read (one) or fused (several, with `hybrid`); "
        "multivector needs an index built with --multi-vector (absent: dense; dense and bm25 under hybrid)")] = None
    ef: Annotated[int | None, Field(ge=1, le=100_000, description="faiss-hnsw search beam "
                                    "(absent: the index's)")] = None
    nprobe: Annotated[int | None, Field(ge=1, le=1_000_000, description="faiss-ivfpq lists searched "
                                        "(absent: the index's)")] = None
    truncate: Truncate = None
    return_text: bool = False


def read(model: type[Request], raw: bytes, route: str) -> Any:
    """The body read into `model`; a validation error (422) naming the field otherwise."""
    try:
        return parse(model, raw, route, TAGS)
    except RequestError as err:
        raise validation(str(err)) from None


def texts_of(value: str | list[str]) -> tuple[list[str], bool]:
    """A Texts field → (texts, whether one string was sent)."""
    return ([value], True) if isinstance(value, str) else (list(value), False)


# ---------------------------------------------------------------------------------------------
# answers
# ---------------------------------------------------------------------------------------------
class ErrorResponse(BaseModel):
    error: str
    error_type: ErrorType


class OpenAIError(BaseModel):
    message: str
    type: ErrorType
    param: str | None = None
    code: int


class OpenAIErrorResponse(BaseModel):
    """OpenAI's error shape, on the /v1 routes, so OpenAI's clients show the message."""
    error: OpenAIError


class EmbedResponse(RootModel[list[list[float]]]):
    """One vector per input."""


class EmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token (specials included), not pooled nor normalised."""


class EmbedMultiResponse(RootModel[list[list[list[float]]]]):
    """Per input, one unit vector per token of the model's multi-vector head (BGE-M3: every
    token after [CLS])."""


class SparseValue(BaseModel):
    index: int  # a vocabulary id
    value: float  # its weight, > 0


class EmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """Per input, its non-zero term weights in increasing vocabulary order (TEI's shape)."""


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | str  # str: base64 of little-endian float32
    index: int


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = None  # the served model an alias or adapter answers with


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


class RerankResponse(RootModel[list[Rank]]):
    """Best first."""


class Prediction(BaseModel):
    score: float
    label: str


class PredictResponse(RootModel[Union[list[Prediction], list[list[Prediction]]]]):
    """Labels by score; a list of them per sequence when a batch was sent."""


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TokenizeResponse(RootModel[list[list[SimpleToken]]]):
    pass


class DecodeResponse(RootModel[list[str]]):
    pass


class SimilarityResponse(RootModel[list[float]]):
    """Cosine similarity of each sentence to the source sentence."""


class Candidate(BaseModel):
    token: str
    token_id: int
    score: float


class FillMaskResponse(RootModel[Union[list[list[Candidate]], list[list[list[Candidate]]]]]):
    """Per [MASK], its candidates; a list of them per text when a list was sent."""


class Entity(BaseModel):
    type: str
    text: str
    start: int
    end: int
    score: float


class NerResponse(RootModel[Union[list[Entity], list[list[Entity]]]]):
    pass


class Answer(BaseModel):
    text: str
    start: int
    end: int
    score: float


class QAResponse(RootModel[Union[list[Answer], list[list[Answer]]]]):
    pass


class SearchHit(BaseModel):
    rank: int
    id: str
    score: float  # the order's: inner product, fused first stage, the reranker's or both fused
    passage: str  # the passage that matched: the document's text[start:end]
    start: int
    end: int
    passage_number: int  # the passage's place among its document's passages (0: the first)
    first_stage_score: float | None = None  # reranked: the retrieval score
    rerank_score: float | None = None  # reranked: the cross-encoder's (sigmoid)
    dense_score: float | None = None  # hybrid: the best inner product
    bm25_score: float | None = None  # hybrid: the best BM25 score
    text: str | None = None  # the whole document, with return_text


class SearchTimings(BaseModel):
    embed_ms: float  # the queries tokenized and embedded (queue included)
    retrieve_ms: float  # the index's backend (and BM25)
    rerank_ms: float
    total_ms: float


class SearchResponse(BaseModel):
    """The best documents, best first: a list for one query, a list of them for a list of queries."""
    index: str
    model: str  # the model that embedded the queries
    reranker: str | None
    documents: Union[list[SearchHit], list[list[SearchHit]]]
    timings: SearchTimings


class CompatRequest(RootModel[Union[EmbedRequest, PredictRequest, RerankRequest, SimilarityRequest]]):
    """POST /: a body of /rerank (it has `query`), /similarity (`inputs` is an object), /predict
    (the model is a classifier) or /embed."""


class CompatResponse(RootModel[Union[list[list[float]], list[Prediction], list[list[Prediction]], list[Rank],
                                     list[float]]]):
    """The answer of the route the body went to."""


class ModelInfo(BaseModel):
    name: str
    model_id: str
    model_dtype: str
    model_type: dict[str, Any]
    max_input_length: int
    uses: list[str]
    aliases: list[str] = []
    base: str | None = None  # a LoRA adapter's base model
    adapter: dict[str, Any] | None = None  # a LoRA adapter's directory, use, rank, labels


class IndexInfo(BaseModel):
    name: str
    path: str
    model: str  # the model that embeds its queries (a served one, or index/NAME: the index's own)
    model_dir: str
    own_model: bool
    backend: str
    documents: int
    passages: int
    dim: int
    max_length: int
    hybrid: bool
    passage_tokens: int


class Info(ModelInfo):
    """TEI's /info for the default model, with every served model under `models`."""
    max_concurrent_requests: int
    max_batch_tokens: int
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    models: list[ModelInfo]
    indexes: list[IndexInfo] = []
