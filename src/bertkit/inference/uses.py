"""The uses of the engine, one record each (`common.Use`): the table jobs, the service and export read.

    use           function       a file's chunk       a service's merged run    exported outputs
    embed         embed          (n, H) array / rows  pooled vectors            last_hidden_state
    embed-sparse  embed_sparse   {indices, values}    SPLADE weights            —
    fill-mask     fill_mask      {masks}              candidates per [MASK]     logits (B, T, V)
    classify      classify       {label, score, ...}  logits                    logits (B, K)
    ner           ner            {entities}, tags     entities                  logits (B, T, K)
    qa            qa             {answers}            answers                   start_logits, end_logits
    rerank        rerank         {score}              logits                    logits (B, 1)
    embed-m3      encode_m3      {dense, sparse,      BGE-M3's outputs          —
                                  colbert}

Each record lives beside its function (embed.py, classify.py, ...). The head a use loads, what a
checkpoint needs for it and the routes it adds are the head table's (`encoder.tasks.USES`); the
names are `constants.USES`. A new use is a module with its function and record, and a line here.
"""

from __future__ import annotations

from bertkit.inference.classify import RERANK_USE
from bertkit.inference.classify import USE as CLASSIFY
from bertkit.inference.common import Use
from bertkit.inference.embed import USE as EMBED
from bertkit.inference.fill_mask import USE as FILL_MASK
from bertkit.inference.m3 import USE as EMBED_M3
from bertkit.inference.ner import USE as NER
from bertkit.inference.qa import USE as QA
from bertkit.inference.sparse import USE as EMBED_SPARSE

USES: dict[str, Use] = {use.name: use for use in (EMBED, EMBED_SPARSE, FILL_MASK, CLASSIFY, NER, QA, RERANK_USE,
                                                        EMBED_M3)}


def use_row(name: str) -> Use:
    """The record of use `name`, or a ValueError naming the uses there are."""
    if name not in USES:
        raise ValueError(f"unknown use {name!r}; choose one of {', '.join(USES)}")
    return USES[name]
