"""Request shapes: JSON bodies checked field by field into small dataclasses.

The fields and their defaults are text-embeddings-inference's (`router/src/http/types.rs`) and
OpenAI's (`/v1/embeddings`), plus an optional `model` (the name of one of the served models;
absent = the first). Every check names the field and what it got, and raises a validation
error (422); keys a route does not know are refused by name, so a typo ("input" for "inputs")
is not silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertkit.serve.errors import validation

JSON = Any


# ---------------------------------------------------------------------------------------------
# field readers
# ---------------------------------------------------------------------------------------------
def _object(body: JSON, route: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise validation(f"the body of {route} must be a JSON object, got {_kind(body)}")
    unknown = sorted(set(body) - allowed - {"model"})
    if unknown:
        raise validation(f"unknown field `{unknown[0]}` for {route}; it takes "
                         f"{', '.join(f'`{k}`' for k in sorted(allowed | {'model'}))}")
    return body


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _required(body: dict, key: str) -> Any:
    if key not in body or body[key] is None:
        raise validation(f"missing field `{key}`")
    return body[key]


def _bool(body: dict, key: str, default: bool | None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise validation(f"`{key}` must be true or false, got {_kind(value)}")
    return value


def _int(body: dict, key: str, default: int, minimum: int = 1) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise validation(f"`{key}` must be an integer of at least {minimum}, got {value!r}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise validation(f"{where} must be a string, got {_kind(value)}")
    if not value.strip():
        raise validation(f"{where} is empty")
    return value


def _texts(body: dict, key: str) -> tuple[list[str], bool]:
    """A string or a non-empty list of strings → (texts, whether a single string was sent)."""
    value = _required(body, key)
    if isinstance(value, str):
        return [_text(value, f"`{key}`")], True
    if not isinstance(value, list):
        raise validation(f"`{key}` must be a string or a list of strings, got {_kind(value)}")
    if not value:
        raise validation(f"`{key}` is an empty list; send at least one text")
    return [_text(v, f"`{key}[{i}]`") for i, v in enumerate(value)], False


def _model(body: dict) -> str | None:
    value = body.get("model")
    if value is not None and not isinstance(value, str):
        raise validation(f"`model` must be a string (a served model's name), got {_kind(value)}")
    return value


def _tei_extras(body: dict) -> None:
    """TEI fields accepted with their neutral value only: anything else is not done here."""
    direction = body.get("truncation_direction")
    if direction is not None and str(direction).lower() != "right":
        raise validation(f"`truncation_direction` {direction!r} is not supported; only \"Right\" "
                         "(the end of a text is cut)")
    for key in ("prompt_name", "dimensions"):
        if body.get(key) is not None:
            raise validation(f"`{key}` is not supported by this server; leave it out")


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------
@dataclass
class EmbedRequest:
    inputs: list[str]
    normalize: bool = True
    truncate: bool | None = None  # None: the server's --auto-truncate
    model: str | None = None


def embed_request(body: JSON) -> EmbedRequest:
    body = _object(body, "/embed", {"inputs", "normalize", "truncate", "truncation_direction",
                                    "prompt_name", "dimensions"})
    _tei_extras(body)
    inputs, _ = _texts(body, "inputs")
    return EmbedRequest(inputs, _bool(body, "normalize", True), _bool(body, "truncate", None),
                        _model(body))


@dataclass
class OpenAIEmbedRequest:
    inputs: list[str]
    base64: bool
    model: str | None = None


def openai_embed_request(body: JSON) -> OpenAIEmbedRequest:
    body = _object(body, "/v1/embeddings", {"input", "encoding_format", "user", "dimensions"})
    if body.get("dimensions") is not None:
        raise validation("`dimensions` is not supported by this server; leave it out")
    value = _required(body, "input")
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        raise validation("`input` as token ids is not supported; send the text")
    inputs, _ = _texts(body, "input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise validation(f"`encoding_format` must be \"float\" or \"base64\", got {fmt!r}")
    return OpenAIEmbedRequest(inputs, fmt == "base64", _model(body))


@dataclass
class RerankRequest:
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    model: str | None = None


def rerank_request(body: JSON) -> RerankRequest:
    body = _object(body, "/rerank", {"query", "texts", "raw_scores", "return_text", "truncate",
                                     "truncation_direction"})
    _tei_extras(body)
    query = _text(_required(body, "query"), "`query`")
    texts, _ = _texts(body, "texts")
    return RerankRequest(query, texts, _bool(body, "raw_scores", False),
                         _bool(body, "return_text", False), _bool(body, "truncate", None), _model(body))


@dataclass
class PredictRequest:
    inputs: list[tuple[str, str | None]]  # (text, second text of a pair or None)
    single: bool  # one sequence sent: the answer is one list of labels, not a list of them
    raw_scores: bool = False
    truncate: bool | None = None
    model: str | None = None


def predict_request(body: JSON) -> PredictRequest:
    """TEI's `inputs`: "text" | ["text", "pair"] (one pair) | a list of "text" / ["text"] /
    ["text", "pair"] (a batch). A list of exactly two strings is one pair, as in TEI."""
    body = _object(body, "/predict", {"inputs", "raw_scores", "truncate", "truncation_direction"})
    _tei_extras(body)
    value = _required(body, "inputs")

    def sequence(item: Any, where: str) -> tuple[str, str | None]:
        if isinstance(item, str):
            return _text(item, where), None
        if isinstance(item, list) and len(item) in (1, 2):
            first = _text(item[0], f"{where}[0]")
            return first, (_text(item[1], f"{where}[1]") if len(item) == 2 else None)
        raise validation(f"{where} must be a text or a list of one or two texts (a pair), "
                         f"got {_kind(item) if not isinstance(item, list) else f'a list of {len(item)}'}")

    if isinstance(value, str) or (isinstance(value, list) and len(value) == 2
                                  and all(isinstance(v, str) for v in value)):
        inputs, single = [sequence(value, "`inputs`")], True
    elif isinstance(value, list):
        if not value:
            raise validation("`inputs` is an empty list; send at least one text")
        inputs, single = [sequence(v, f"`inputs[{i}]`") for i, v in enumerate(value)], False
    else:
        raise validation(f"`inputs` must be a text, a pair or a list of them, got {_kind(value)}")
    return PredictRequest(inputs, single, _bool(body, "raw_scores", False), _bool(body, "truncate", None),
                          _model(body))


@dataclass
class TokenizeRequest:
    inputs: list[str]
    add_special_tokens: bool = True
    model: str | None = None


def tokenize_request(body: JSON) -> TokenizeRequest:
    body = _object(body, "/tokenize", {"inputs", "add_special_tokens", "prompt_name"})
    _tei_extras(body)
    inputs, _ = _texts(body, "inputs")
    return TokenizeRequest(inputs, _bool(body, "add_special_tokens", True), _model(body))


@dataclass
class FillMaskRequest:
    inputs: list[str]
    single: bool
    top_k: int = 5
    targets: tuple[str, ...] | None = None
    model: str | None = None


def fill_mask_request(body: JSON) -> FillMaskRequest:
    body = _object(body, "/fill-mask", {"inputs", "top_k", "targets"})
    inputs, single = _texts(body, "inputs")
    targets = None
    if body.get("targets") is not None:
        targets = tuple(_texts(body, "targets")[0])
    return FillMaskRequest(inputs, single, _int(body, "top_k", 5), targets, _model(body))


@dataclass
class NerRequest:
    inputs: list[str]
    single: bool
    model: str | None = None


def ner_request(body: JSON) -> NerRequest:
    body = _object(body, "/ner", {"inputs"})
    inputs, single = _texts(body, "inputs")
    return NerRequest(inputs, single, _model(body))


@dataclass
class QARequest:
    questions: list[str]
    contexts: list[str]
    single: bool
    top_k: int = 1
    max_answer_length: int = 30
    allow_no_answer: bool = False
    model: str | None = None


def qa_request(body: JSON) -> QARequest:
    body = _object(body, "/qa", {"question", "context", "top_k", "max_answer_length", "allow_no_answer"})
    questions, single = _texts(body, "question")
    contexts, _ = _texts(body, "context")
    if len(contexts) == 1 and len(questions) > 1:
        contexts = contexts * len(questions)
    if len(contexts) != len(questions):
        raise validation(f"`context` has {len(contexts)} texts for {len(questions)} questions; send "
                         "one context per question, or one for all")
    return QARequest(questions, contexts, single, _int(body, "top_k", 1),
                     _int(body, "max_answer_length", 30), bool(_bool(body, "allow_no_answer", False)),
                     _model(body))
