"""Late interaction (ColBERT's MaxSim): a query and a document as one vector per token, scored by
matching each query token to its most similar document token.

    MaxSim(q, d) = sum over query tokens i of max over document tokens j of <q_i, d_j>

(Khattab & Zaharia, SIGIR 2020, eq. 3.) ColBERT and PyLate score with the plain sum; BGE-M3's
`colbert_score` divides it by the number of query tokens, so its scores lie in [-1, 1] beside the
dense and lexical ones (`normalize=True`). The vectors are normalised by the model that made them;
this module only scores.
"""

from __future__ import annotations

from typing import Sequence

import torch


def maxsim(query: torch.Tensor, document: torch.Tensor, *, normalize: bool = False) -> float:
    """One score. query (Q, D) and document (T, D) token vectors, any float dtype (scored in
    fp32); normalize: divide by Q, as BGE-M3 does."""
    if query.ndim != 2 or document.ndim != 2 or query.shape[1] != document.shape[1]:
        raise ValueError(f"MaxSim needs (Q, D) and (T, D) token vectors with one D, "
                         f"got {tuple(query.shape)} and {tuple(document.shape)}")
    if len(query) == 0 or len(document) == 0:
        raise ValueError("MaxSim needs at least one query token and one document token")
    similarity = query.float() @ document.float().T                 # (Q, T)
    score = similarity.max(dim=1).values.sum()                      # best document token per query token
    return float(score / len(query)) if normalize else float(score)


def maxsim_scores(query: torch.Tensor, documents: Sequence[torch.Tensor], *,
                  normalize: bool = False) -> torch.Tensor:
    """A query (Q, D) against many documents, each (T_k, D): float32 (K,) scores in the documents'
    order. The documents are stacked into one (ΣT, D) matrix, so one GEMM scores them all and the
    per-document maximum is a segment reduction, with no padding to the longest document."""
    if not documents:
        return torch.zeros(0)
    lengths = torch.tensor([len(document) for document in documents])
    if bool((lengths == 0).any()):
        raise ValueError("MaxSim needs at least one token in every document")
    stacked = torch.cat([document.float() for document in documents])  # (ΣT, D)
    return maxsim_packed(query, stacked, lengths, normalize=normalize)


def maxsim_packed(query: torch.Tensor, stacked: torch.Tensor, lengths: torch.Tensor, *,
                  normalize: bool = False) -> torch.Tensor:
    """`maxsim_scores` of documents already stacked end to end: stacked (ΣT, D), lengths (K,)
    int64 tokens of each (all > 0), in order. float32 (K,) scores."""
    similarity = query.float() @ stacked.float().T                      # (Q, ΣT)
    segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (ΣT,) document of each column
    best = torch.full((len(query), len(lengths)), float("-inf"))        # (Q, K)
    best = best.scatter_reduce(1, segment.expand(len(query), -1), similarity, reduce="amax")
    scores = best.sum(dim=0)                                            # (K,)
    return scores / len(query) if normalize else scores
