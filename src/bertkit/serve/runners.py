"""How each use runs the inputs of several requests as one call of the engine.

A runner takes a model, the options its requests share (`key`) and the inputs of all of them
in order, and returns one result per input. Each use's runner is its record's
(`inference.uses`, beside the use's function): embeddings and classifier logits start from token
ids made on the tokenizing thread and go through `Engine.run` with the same head the library's
`embed` / `classify` use; fill-mask, NER and QA call the library functions on the merged texts
(their windows and word handling live there). Either way the engine makes each sequence's
result independent of its neighbours, so a request's answer equals the library's for it alone.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from bertkit.inference.embed import run_token_vectors
from bertkit.inference.m3 import run_m3
from bertkit.inference.uses import USES
from bertkit.serve.models import ServedModel

Runner = Callable[[ServedModel, tuple, Sequence[Any]], list[Any]]


def on_engine(run: Callable[..., list[Any]]) -> Runner:
    """A use's runner over an engine, run on a served model's."""
    return lambda model, key, items: run(model.engine, key, items)


def m3_output(name: str) -> Runner:
    """One of BGE-M3's outputs alone, per input (`inference.m3`)."""
    return lambda model, key, items: [row[name] for row in run_m3(model.engine, (name,), items)]


# The uses whose runners take texts and tokenize them on the model thread with the engine's own
# tokenizer (the library's functions: windows, words and spans live there); the others take the
# token ids made on the event loop or the tokenizing thread.
LIBRARY_USES = frozenset({"fill-mask", "ner", "qa"})

# A job names its runner: a use, or one that several routes share — a classifier's logits
# (/predict and /rerank, `classify`'s runner) and every token's vector (/embed_all) — or one
# output of a use (BGE-M3's).
RUNNERS: dict[str, Runner] = {name: on_engine(use.runner) for name, use in USES.items()}
RUNNERS["logits"] = RUNNERS["classify"]
RUNNERS["token-vectors"] = on_engine(run_token_vectors)
# BGE-M3's lexical weights (/embed_sparse) and ColBERT vectors (/embed_multi), each alone.
RUNNERS["m3-sparse"] = m3_output("sparse")
RUNNERS["multi-vector"] = m3_output("colbert")
# SPLADE's settings as the served model read them once (its /info shows the same).
RUNNERS["embed-sparse"] = lambda model, key, items: USES["embed-sparse"].runner(model.engine, key or (model.splade,),
                                                                               items)
