"""The pieces a text becomes, with where each came from: TEI's /tokenize answer."""

from __future__ import annotations

from typing import Any, Sequence

from bertkit.inference.engine import Engine


def tokens(engine: Engine, texts: Sequence[str], *, add_special_tokens: bool = True,
           tokenizer: Any = None) -> list[list[dict[str, Any]]]:
    """Per text, per token: {"id", "text", "special", "start", "stop"}, cut at the engine's
    max_length as every use cuts. A piece's text is its span of the input (start / stop:
    character offsets); [CLS] / [SEP] carry their own text and no span, and are left out with
    add_special_tokens=False. tokenizer: a copy of the engine's to use instead (the service's
    threads each own one)."""
    tokenizer = tokenizer or engine.tokenizer
    out = []
    for text, e in zip(texts, tokenizer.encode_raw(list(texts), max_length=engine.max_length)):
        row = []
        for token_id, token, special, (start, stop) in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets):
            if special:
                if add_special_tokens:
                    row.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                row.append({"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop})
        out.append(row)
    return out
