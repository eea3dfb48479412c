"""The bi-encoder's losses, one table: `bertkit finetune --task embed --loss NAME`.

    name         data                                          what it optimises
    mnrl         (query, positive, negatives?)                 in-batch negatives + hard negatives (default)
    cached-mnrl  (query, positive, negatives?)                 the same, embedded by GradCache (`gradcache.py`)
    cosent       (sentence1, sentence2, score)                 the order of the pairs' cosines follows the scores
    angle        (sentence1, sentence2, score)                 cosent on AnglE's angle similarity
    margin-mse   (query, positive, negatives) + a teacher      student margins = the teacher's margins
    kl           (query, positive, negatives) + a teacher      student softmax = the teacher's softmax

Each is sentence-transformers' loss of the same name (MultipleNegativesRankingLoss,
CachedMultipleNegativesRankingLoss, CoSENTLoss, AnglELoss, MarginMSELoss, DistillKLDivLoss) on
the same embeddings, and `matryoshka_dims` wraps any of them as its MatryoshkaLoss does (the loss
summed, with weight 1, over the embeddings' first d dimensions, re-normalised). tests/test_losses.py
checks each against sentence-transformers' own.

Embeddings arrive as `biencoder.loss` computes them, pooled and not yet normalised:
queries (B, H), row i's query; candidates (C, H), the B positives first (row i's at i), then each
row's hard negatives, row by row (margin-mse and kl: exactly K per row, so C = B(1 + K); cosent
and angle: C = B, row i's second sentence). Every similarity is a cosine (the model ends in a
Normalize module, so sentence-transformers' dot product is this cosine) times `scale`, the one
inverse temperature of `--scale`: 20 as sentence-transformers' MultipleNegativesRankingLoss,
CoSENTLoss and AnglELoss. Where we differ on purpose: sentence-transformers' MarginMSELoss and
DistillKLDivLoss score with the plain dot product, scale 1; here they read `scale` × cosine (their
`similarity_fct=scale·pairwise_cos_sim`), so a student's margins can reach a cross-encoder's
logit margins (tens) that a cosine (±2) cannot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# What a row of each kind of data must carry (the `data` of the table).
PAIRS, SCORED, TEACHER = "pairs", "scored", "teacher"


# Query rows whose logits one chunk of the in-batch loss holds: 2^18 logits (1 MiB in float32),
# so the loss's memory stops growing with batch × candidates (a (1,024, 1,024) batch is 4 chunks of
# 256 rows, each still one matrix product of hundreds of rows).
CHUNK_LOGITS = 1 << 18


def multiple_negatives_ranking_loss(queries: torch.Tensor, candidates: torch.Tensor,
                                    scale: float = 20.0) -> torch.Tensor:
    """queries (B, H), candidates (C, H) with C ≥ B, candidate i the positive of query i and the
    rest (other positives, hard negatives) its negatives → mean cross-entropy of scale × cosine.

    The (B, C) logits are never held whole: `_InBatchCrossEntropy` computes them a chunk of query
    rows at a time, forward and backward. Where we differ from sentence-transformers (which
    builds the whole matrix and calls cross_entropy): the same value and gradients up to float
    rounding, the softmax of 16-bit embeddings taken in float32."""
    rows = max(1, CHUNK_LOGITS // max(1, len(candidates)))
    return _InBatchCrossEntropy.apply(F.normalize(queries, dim=-1), F.normalize(candidates, dim=-1), scale, rows)


class _InBatchCrossEntropy(torch.autograd.Function):
    """mean over i of −log softmax(scale · q_i · cᵀ)[i] for unit vectors q (B, H), c (C, H),
    `rows` query rows at a time. Holds only q and c for the backward, which builds each chunk's
    logits again (one more (rows, H) × (H, C) product per chunk) instead of keeping the (B, C)
    logits, their softmax and its gradient (sentence-transformers' CachedMultipleNegativesRankingLoss
    likewise computes its loss a mini-batch of rows at a time). Each chunk's log-softmax is
    torch's, as cross_entropy's: a near-zero loss keeps its precision."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, c: torch.Tensor, scale: float, rows: int) -> torch.Tensor:
        qw, cw = q.to(_wide(q.dtype)), c.to(_wide(c.dtype))
        total = qw.new_zeros(())
        for start in range(0, len(q), rows):
            logits = scale * qw[start:start + rows] @ cw.T  # (r, C)
            total -= torch.log_softmax(logits, dim=1).diagonal(offset=start).sum()  # row i's target: column start + i
        ctx.save_for_backward(q, c)
        ctx.scale, ctx.rows = scale, rows
        return (total / len(q)).to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, c = ctx.saved_tensors
        qw, cw = q.to(_wide(q.dtype)), c.to(_wide(c.dtype))
        dq, dc = torch.empty_like(qw), torch.zeros_like(cw)  # (B, H), (C, H)
        weight = grad.to(qw.dtype) * ctx.scale / len(q)  # d loss / d (q_i · c_j) = weight · (softmax − one-hot)
        for start in range(0, len(q), ctx.rows):
            end = min(start + ctx.rows, len(q))
            delta = torch.softmax(ctx.scale * qw[start:end] @ cw.T, dim=1)  # (r, C) the softmax ...
            delta.diagonal(offset=start).sub_(1)  # ... minus each row's one-hot target
            delta *= weight
            dq[start:end] = delta @ cw  # (r, H)
            dc += delta.T @ qw[start:end]  # (C, H)
        return dq.to(q.dtype), dc.to(c.dtype), None, None


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype a softmax is taken in: float32 for 16-bit inputs (exp of logits up to ±scale)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def ranked_pairs_loss(similarities: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT (Su 2022; text2vec's loss): similarities (B,) of B pairs, scores (B,) their gold
    scores → log(1 + Σ exp(scale · (s_kl − s_ij))) over every two pairs where (i, j) is scored
    above (k, l): each pair out of order costs, pairs of equal score are not compared."""
    if similarities.dtype in (torch.float16, torch.bfloat16):  # exp of scaled gaps needs float32's range
        similarities = similarities.float()
    s = scale * similarities  # (B,)
    above = scores[:, None] > scores[None, :]  # (B, B) pair i scored above pair j
    gaps = (s[None, :] - s[:, None]).masked_fill(~above, float("-inf"))  # (B, B) s_j − s_i
    return torch.logsumexp(torch.cat([s.new_zeros(1), gaps.flatten()]), dim=0)


def cosent_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """first, second (B, H): the two sides of B scored pairs; scores (B,) → CoSENT on cosines."""
    return ranked_pairs_loss(F.cosine_similarity(first, second, dim=-1), scores, scale)


def angle_similarity(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(B, H), (B, H) → (B,) AnglE's similarity (Li & Li 2024) as sentence-transformers'
    `pairwise_angle_sim` writes it: |cos + sin| of the normalised vectors, the sine pairing
    dimension i with i + H/2 (an odd H padded with a zero)."""
    if first.shape[-1] % 2:
        first, second = F.pad(first, (0, 1)), F.pad(second, (0, 1))
    x, y = F.normalize(first, dim=-1), F.normalize(second, dim=-1)
    x_re, x_im = x.chunk(2, dim=-1)  # (B, H/2) each: the vector as H/2 complex numbers
    y_re, y_im = y.chunk(2, dim=-1)
    return ((x * y).sum(-1) + (x_im * y_re - x_re * y_im).sum(-1)).abs()


def angle_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """first, second (B, H); scores (B,) → CoSENT's ranking on AnglE's similarity."""
    return ranked_pairs_loss(angle_similarity(first, second), scores, scale)


def student_scores(queries: torch.Tensor, candidates: torch.Tensor, scale: float) -> torch.Tensor:
    """queries (B, H), candidates (B(1 + K), H) laid out as the module docstring says →
    (B, 1 + K) scale × cosine of each query with its positive (column 0) and its K negatives."""
    batch = len(queries)
    k = len(candidates) // batch - 1
    dim = candidates.shape[-1]
    own = torch.cat([candidates[:batch, None], candidates[batch:].view(batch, k, dim)], dim=1)  # (B, 1 + K, H)
    q = F.normalize(queries, dim=-1)[:, None]  # (B, 1, H)
    return scale * (q * F.normalize(own, dim=-1)).sum(-1)  # (B, 1 + K)


def margin_mse_loss(queries: torch.Tensor, candidates: torch.Tensor, teacher: torch.Tensor,
                    scale: float = 20.0) -> torch.Tensor:
    """Margin-MSE (Hofstätter et al. 2020): teacher (B, 1 + K) scores of each query's positive and
    K negatives → mean over (B, K) of (student margin − teacher margin)², margin = positive − negative."""
    student = student_scores(queries, candidates, scale)  # (B, 1 + K)
    teacher = teacher.detach().to(student.dtype)
    return F.mse_loss(student[:, :1] - student[:, 1:], teacher[:, :1] - teacher[:, 1:])


def kl_loss(queries: torch.Tensor, candidates: torch.Tensor, teacher: torch.Tensor, scale: float = 20.0,
            temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher ‖ student) of the softmaxes over each query's positive and K negatives, both
    scores divided by `temperature`, times temperature² (Hinton et al. 2015), batch mean."""
    student = student_scores(queries, candidates, scale) / temperature  # (B, 1 + K)
    target = torch.softmax(teacher.detach().to(student.dtype) / temperature, dim=-1)
    return F.kl_div(torch.log_softmax(student, dim=-1), target, reduction="batchmean") * temperature ** 2


@dataclass(frozen=True)
class EmbedLoss:
    """One row of the table."""

    name: str
    data: str  # PAIRS | SCORED | TEACHER: what a training row must carry
    # (queries (B, H), candidates (C, H), targets, settings) → the scalar loss; targets: None,
    # (B,) gold scores, or (B, 1 + K) teacher scores; settings: the run's RetrievalTrainConfig
    compute: Callable[[torch.Tensor, torch.Tensor, Any, Any], torch.Tensor]
    cached: bool = False  # the embeddings come from GradCache (`gradcache.cached_embeddings`)
    in_batch: bool = False  # a softmax over the batch: a uniform guess costs ln(batch)


EMBED_LOSSES: dict[str, EmbedLoss] = {row.name: row for row in (
    EmbedLoss("mnrl", PAIRS, lambda q, c, t, s: multiple_negatives_ranking_loss(q, c, s.scale), in_batch=True),
    EmbedLoss("cached-mnrl", PAIRS, lambda q, c, t, s: multiple_negatives_ranking_loss(q, c, s.scale),
              cached=True, in_batch=True),
    EmbedLoss("cosent", SCORED, lambda q, c, t, s: cosent_loss(q, c, t, s.scale)),
    EmbedLoss("angle", SCORED, lambda q, c, t, s: angle_loss(q, c, t, s.scale)),
    EmbedLoss("margin-mse", TEACHER, lambda q, c, t, s: margin_mse_loss(q, c, t, s.scale)),
    EmbedLoss("kl", TEACHER, lambda q, c, t, s: kl_loss(q, c, t, s.scale, s.temperature)),
)}


def matryoshka(compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], queries: torch.Tensor,
               candidates: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """MatryoshkaLoss (Kusupati et al. 2022): Σ over d in dims of compute(first d dimensions of
    queries and candidates, each re-normalised), weight 1 each, as sentence-transformers sums."""
    total = queries.new_zeros(())
    for d in dims:
        total = total + compute(F.normalize(queries[:, :d], dim=-1), F.normalize(candidates[:, :d], dim=-1))
    return total


def embed_loss(queries: torch.Tensor, candidates: torch.Tensor, targets: Any, settings: Any) -> torch.Tensor:
    """settings.loss's loss of a batch (wrapped by MatryoshkaLoss where settings.matryoshka_dims)."""
    row = EMBED_LOSSES[settings.loss]
    if not settings.matryoshka_dims:
        return row.compute(queries, candidates, targets, settings)
    return matryoshka(lambda q, c: row.compute(q, c, targets, settings), queries, candidates,
                      settings.matryoshka_dims)


def targets(rows: Sequence[Any], settings: Any, device) -> torch.Tensor | None:
    """What the loss compares the embeddings with, from the rows: (B,) gold scores (cosent,
    angle), (B, 1 + K) teacher scores of the positive and the first K = hard_negatives negatives
    (margin-mse, kl), or None."""
    data = EMBED_LOSSES[settings.loss].data
    if data == SCORED:
        return torch.tensor([r.score for r in rows], dtype=torch.float32, device=device)  # (B,)
    if data == TEACHER:
        k = settings.hard_negatives
        return torch.tensor([r.teacher[:1 + k] for r in rows], dtype=torch.float32, device=device)  # (B, 1 + K)
    return None


def check_dims(dims: Sequence[int] | None, hidden_size: int) -> None:
    """ValueError naming a Matryoshka dimension the model's embeddings do not have."""
    too_wide = [d for d in dims or () if d > hidden_size]
    if too_wide:
        raise ValueError(f"--matryoshka-dims {too_wide[0]} exceeds the model's embedding size {hidden_size}; "
                         f"give dimensions ≤ {hidden_size}, e.g. {hidden_size},{max(1, hidden_size // 4)}")
    if dims and hidden_size not in dims:
        log.warning(
            "--matryoshka-dims leaves out the full size %d: the whole embedding is not trained as "
            "such (sentence-transformers warns the same)", hidden_size)


def parse_dims(text: str | Sequence[int] | None) -> list[int] | None:
    """'768,256,64' (or a list) → [768, 256, 64], widest first; ValueError naming a bad one."""
    if text is None or text == "" or (not isinstance(text, str) and not text):
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    dims = []
    for item in items:
        try:
            value = int(str(item).strip())
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"--matryoshka-dims: {str(item).strip()!r} is not a positive integer; "
                             "give dimensions like 768,256,64")
        dims.append(value)
    return sorted(set(dims), reverse=True)
