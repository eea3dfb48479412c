"""bertkit.util.webapi: one line per bad request naming the field, and an OpenAPI 3.1 document made
from the same models."""

from __future__ import annotations

from typing import Annotated

import pytest

pytest.importorskip("pydantic")
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from bertkit.util.webapi import Operation, RequestError, document, parse  # noqa: E402


class Inner(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: Annotated[str, Field(pattern=r"\S")]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    inputs: Annotated[list[Annotated[str, Field(pattern=r"\S")]], Field(min_length=1, max_length=3)]
    top_k: Annotated[int, Field(ge=1, le=50)] = 5
    ratio: Annotated[float, Field(gt=0, le=1)] = 0.5
    flag: bool = False
    inner: Inner | None = None


class Error(BaseModel):
    error: str
    error_type: str


@pytest.mark.parametrize("raw,message", [
    (b"", "the request has no body; send a JSON object"),
    (b"{nope", "the body is not valid JSON"),
    (b"[1]", "the body of /x must be a JSON object, got a list"),
    (b'{"input": ["a"]}', "unknown field `input` for /x (did you mean `inputs`?); it takes `flag`, `inner`, "
                          "`inputs`, `ratio`, `top_k`"),
    (b'{"top_k": 2}', "missing field `inputs`"),
    (b'{"inputs": []}', "`inputs` is an empty list; send at least one"),
    (b'{"inputs": ["a", "b", "c", "d"]}', "`inputs` has 4 items, more than 3"),
    (b'{"inputs": ["a", " "]}', "`inputs[1]` is empty; send some text"),
    (b'{"inputs": ["a", 3]}', "`inputs[1]` must be a string, got a number"),
    (b'{"inputs": ["a"], "top_k": "5"}', "`top_k` must be an integer, got a string"),
    (b'{"inputs": ["a"], "top_k": 0}', "`top_k` must be an integer greater than or equal to 1, got 0"),
    (b'{"inputs": ["a"], "ratio": 0.0}', "`ratio` must be a number greater than 0, got 0.0"),
    (b'{"inputs": ["a"], "flag": 1}', "`flag` must be true or false, got a number"),
    (b'{"inputs": ["a"], "inner": {"name": "x", "z": 1}}', "unknown field `inner.z`"),
])
def test_a_bad_body_is_one_line_naming_the_field(raw, message):
    with pytest.raises(RequestError) as caught:
        parse(Body, raw, "/x")
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_document_is_openapi_3_1_from_the_models():
    doc = document("t", "1", "d", [Operation("/x", "post", "x", "X", Body, Body, (422,)),
                                   Operation("/h", "get", "h", "H", media_type=None, errors=(503,))], Error)
    assert doc["openapi"] == "3.1.0"
    post = doc["paths"]["/x"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Body"}
    assert post["responses"]["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "content" not in doc["paths"]["/h"]["get"]["responses"]["200"]
    schema = doc["components"]["schemas"]["Body"]
    assert schema["additionalProperties"] is False and schema["required"] == ["inputs"]
    assert schema["properties"]["top_k"] == {"default": 5, "maximum": 50, "minimum": 1, "title": "Top K",
                                             "type": "integer"}
    assert "Inner" in doc["components"]["schemas"]
