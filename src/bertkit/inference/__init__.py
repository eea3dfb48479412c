"""Using a model: one inference engine (`Engine`) and the uses built on it.

    from bertkit.inference import Engine, embed, fill_mask, classify, ner, qa, rerank
    engine = Engine.load("my-model", use="embed", precision="int8")
    vectors = embed(engine, ["a text", "another"])          # (2, H), unit length

Each use takes an Engine or a model directory, works on any number of texts, and returns results
in input order, equal to running each text alone. See `engine.py` for batching and precision.
"""

from bertkit.encoder.sentence_transformers import Pooling
from bertkit.inference.classify import classify, rerank
from bertkit.inference.embed import embed, similarity
from bertkit.inference.engine import Batch, Engine, token_budget_batches
from bertkit.inference.fill_mask import Candidate, fill_mask, load_masked_lm
from bertkit.inference.m3 import compute_score, encode_m3
from bertkit.inference.ner import ner
from bertkit.inference.qa import qa
from bertkit.inference.tokens import tokens

__all__ = ["Engine", "Batch", "Pooling", "token_budget_batches", "embed", "similarity", "fill_mask",
           "Candidate", "load_masked_lm", "classify", "rerank", "ner", "qa", "tokens", "encode_m3",
           "compute_score"]
