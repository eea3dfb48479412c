"""Search an index: dense (any backend), BM25, sparse (SPLADE, `sparse`), multi-vector (late
interaction, `multivector`), or any of them fused; documents by their best passage; optional
cross-encoder reranking.

`search(index_dir, queries, ...)` embeds the queries with the index's own model (another model
is refused: its vectors live in another space), asks the index's backend (`backends`) for the best
passages, and ranks documents by their best passage's score (max aggregation: the first k
distinct documents of the passage ranking are exactly the k best documents, so the backend is
asked for more passages until k distinct documents appear). `hybrid="rrf" | "zscore"` fuses that
ranking with BM25's over the same passages (`fusion`), and `"weighted"` by BGE-M3's weighted sum
of scores; `systems` names which rankings a search reads or fuses: dense, bm25, sparse (the
index's sparse side, opened with `sparse=True`) and multivector (`multi_vector=True`). It
retrieves `candidates` documents per query and, with `rerank=CROSS_ENCODER`, orders those by
the cross-encoder's scores of their best passage and keeps `top_k`.
`rerank_weight` below 1 orders them by a mix of both stages instead (`fuse_scores`): on the BBC
set a bi-encoder and a reranker trained from the same small model are wrong on different
queries, and the mix beat either alone (bench/retrieval.py picks the weight on dev queries).

A cross-encoder scores each pair at the length it was trained at (`load_reranker`: its
tokenizer's model_max_length, which `finetune --task rerank` sets), not the model's 512
positions: a news body runs to ~430 pieces, and MiniLM spent 4.5x the time of 128 pieces on 100
BBC pairs at 512 for a reranker that had never read past its training length.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from bertkit.retrieval.exact import DEFAULT_BUDGET, top_k_inner_product
from bertkit.retrieval.fusion import HYBRID, check_rerank_weight, fuse_scores, rrf, weighted_sum, zscore
from bertkit.retrieval.index import BM25_DIR, Index, open_index, recorded_model_dir

__all__ = ["DEFAULT_BUDGET", "Hit", "Searcher", "check_rerank_weight", "fuse_scores", "load_reranker",
           "rerank_logits", "search", "top_k_inner_product"]


def rerank_logits(reranker: Any, query: str, documents: Sequence[str]) -> np.ndarray:
    """(D,) float32 the cross-encoder's raw score of each document, in the documents' order."""
    from bertkit.inference import rerank

    logits = np.empty(len(documents), dtype=np.float32)
    for hit in rerank(reranker, query, documents, raw_scores=True):
        logits[hit["index"]] = hit["score"]
    return logits


@dataclass
class Hit:
    """One retrieved document, with the passage that matched."""
    rank: int  # 1-based
    id: str
    score: float  # the order's score: inner product, fused first stage, cross-encoder or fused
    row: int  # the document's row in the index
    text: str  # the whole document
    passage: str = ""  # the passage that matched: text[start:end]
    start: int = 0  # character offsets of the passage in the document
    end: int = 0
    passage_row: int = -1  # the passage's row (of vectors.npy)
    passage_number: int = 0  # the passage's place among its document's passages (0: the first)
    first_stage_score: float | None = None  # the retrieval score when reranked
    rerank_score: float | None = None  # the cross-encoder's score (sigmoid) when reranked
    dense_score: float | None = None  # hybrid: the document's best inner product
    bm25_score: float | None = None  # hybrid: the document's best BM25 score
    sparse_score: float | None = None  # hybrid with sparse: the document's best sparse (SPLADE) score
    multivector_score: float | None = None  # the document's best MaxSim (plain sum over query tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Candidate:
    doc: int
    score: float  # first-stage score (fused under hybrid)
    passage: int
    dense: float | None = None
    lexical: float | None = None
    sparse: float | None = None
    multivector: float | None = None


@dataclass
class Searcher:
    """An index with its query model, backend (and optional reranker) loaded once, for many queries."""

    index: Index
    engine: Any  # bertkit.inference.Engine of the index's model
    reranker: Any = None  # Engine of a cross-encoder, or None
    backend: Any = None  # backends.Backend; None = the index's own
    timings: dict[str, float] | None = None
    bm25: Any = None  # bm25.BM25 over the passages, loaded on the first hybrid query
    sparse: Any = None  # sparse.SparseSearcher of the index's sparse side, or None
    multivector: Any = None  # multivector.MultiVectorSearcher of the index's multi-vector side, or None
    mv_nprobe: int = 4  # multi-vector: centroids probed per query token
    mv_candidates: int = 256  # multi-vector: passages scored exactly by MaxSim (at least 4 × the documents asked)
    _doc_first: np.ndarray = field(default=None, repr=False)  # (D + 1,) first passage row of each doc

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = self.index.open_backend()
        docs = self.index.passages[:, 0]
        self._doc_first = np.searchsorted(docs, np.arange(len(self.index) + 1))  # passages are in doc order

    @classmethod
    def open(cls, index_dir: str | os.PathLike, *, model: Any = None, rerank: Any = None,
             rerank_max_length: int | None = None, backend_options: dict[str, Any] | None = None,
             sparse: bool = False, sparse_model: Any = None, multi_vector: bool = False,
             **engine_options: Any) -> "Searcher":
        """model: None (the index's own model dir), a model dir or an Engine, checked against the
        index's fingerprint. sparse: open the index's sparse side too, with its own masked-LM
        model (sparse_model: another dir or Engine, refused unless it is the same model and
        vocabulary). multi_vector: open the index's multi-vector side (its own model and kind).
        rerank: a cross-encoder dir or Engine (task rerank);
        rerank_max_length: pieces per (query, passage) pair (default: `load_reranker`'s).
        backend_options: override the recorded backend settings (e.g. {"url": ...} for Qdrant)."""
        from bertkit.inference import Engine

        index = open_index(index_dir)
        if isinstance(model, Engine):
            engine = model
        else:
            model_dir = recorded_model_dir(model, index.meta["model"], "the index", "--model")
            index.check_model(model_dir)  # before loading weights: a wrong model fails fast
            engine = Engine.load(model_dir, use="embed", max_length=index.meta["max_length"],
                                 **engine_options)
        if engine.model_dir is None:
            raise ValueError("the query Engine has no model_dir to check against the index; load it "
                             "with Engine.load(model_dir)")
        index.check_model(engine.model_dir, engine.tokenizer)
        reranker = None
        if rerank is not None:
            options = dict(engine_options)
            options.pop("max_length", None)  # the index's; a reranker reads pairs at its own
            if rerank_max_length is not None:
                options["max_length"] = rerank_max_length
            reranker = rerank if isinstance(rerank, Engine) else load_reranker(rerank, **options)
        side = None
        if sparse:
            from bertkit.retrieval.sparse import SparseSearcher

            options = {k: v for k, v in engine_options.items() if k != "max_length"}
            side = SparseSearcher.open(index_dir, rows=index.meta["rows"], model=sparse_model, **options)
        late = None
        if multi_vector:
            from bertkit.retrieval.multivector import MultiVectorSearcher

            options = {k: v for k, v in engine_options.items() if k != "max_length"}
            late = MultiVectorSearcher.open(index_dir, rows=index.meta["rows"], dense_engine=engine, **options)
        return cls(index, engine, reranker, index.open_backend(**(backend_options or {})), sparse=side,
                   multivector=late)

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        from bertkit.inference import embed

        meta = self.index.meta
        return embed(self.engine, list(queries), pooling=meta["pooling"],
                     normalize=meta["normalize"]).numpy()  # (Q, H)

    # -- first stage -----------------------------------------------------------------------------
    def dense_documents(self, vectors: np.ndarray, n: int, **search_params: Any) -> list[list[_Candidate]]:
        """The n best documents of each query by their best passage's inner product.

        vectors: (Q, H) query vectors. Asks the backend for passages until n distinct documents
        appear (or every passage is in, or an approximate backend has no more)."""
        total = len(self.index.vectors)
        pdoc = self.index.passages[:, 0]
        k = min(total, max(n, 1) * 2)
        while True:
            scores, rows = self.backend.search(vectors, k, **search_params)  # (Q, k) each
            out, more = [], False
            for q in range(len(vectors)):
                valid = rows[q] >= 0
                r, s = rows[q][valid], scores[q][valid]
                _, first = np.unique(pdoc[r], return_index=True)
                first = np.sort(first)[:n]  # first sight of each document, in passage order
                out.append([_Candidate(int(pdoc[r[i]]), float(s[i]), int(r[i])) for i in first])
                more |= len(first) < n and k < total and bool(valid.all())
            if not more:
                return out
            k = min(total, k * 4)

    def _doc_dense(self, vector: np.ndarray, doc: int) -> tuple[float, int]:
        """A document's best passage by inner product, exactly: (score, passage row)."""
        lo, hi = int(self._doc_first[doc]), int(self._doc_first[doc + 1])
        s = np.asarray(self.index.vectors[lo:hi], dtype=np.float32) @ vector  # (passages,)
        best = int(np.argmax(s))
        return float(s[best]), lo + best

    def multivector_documents(self, query: np.ndarray, n: int) -> list[_Candidate]:
        """The n best documents of one query's token vectors (Q, D) by their best passage's MaxSim
        (`multivector.MultiVectorIndex.search` over at least 4 passages a document asked)."""
        pdoc = self.index.passages[:, 0]
        side = self.multivector.index
        s, r = side.search(query, 4 * n, nprobe=self.mv_nprobe, candidates=max(4 * n, self.mv_candidates))
        _, first = np.unique(pdoc[r], return_index=True)
        first = np.sort(first)[:n]
        return [_Candidate(int(pdoc[r[i]]), float(s[i]), int(r[i]), multivector=float(s[i])) for i in first]

    def _doc_multivector(self, query: np.ndarray, doc: int) -> float:
        """A document's best passage by exact MaxSim over its decompressed tokens."""
        lo, hi = int(self._doc_first[doc]), int(self._doc_first[doc + 1])
        return float(self.multivector.index.exact_scores(query, list(range(lo, hi))).max())

    def lexical_documents(self, query: str, n: int) -> tuple[list[_Candidate], np.ndarray, np.ndarray]:
        """BM25's n best documents by their best passage, with every document's best BM25 score
        (D,) and its passage row (D,)."""
        if self.bm25 is None:
            from bertkit.retrieval.bm25 import BM25

            if not self.index.meta.get("bm25") or not (self.index.path / BM25_DIR).is_dir():
                raise ValueError(f"index {self.index.path} has no BM25 index for --hybrid; rebuild it "
                                 "with `bertkit index` (BM25 is built unless --no-bm25)")
            self.bm25 = BM25.load(self.index.path / BM25_DIR)
        return self.by_document(self.bm25.scores(query), n)

    def by_document(self, s: np.ndarray, n: int) -> tuple[list[_Candidate], np.ndarray, np.ndarray]:
        """Passage scores s (P,) → the n best documents by their best passage, every document's
        best score (D,) and that passage's row (D,)."""
        pdoc = self.index.passages[:, 0]
        order = np.lexsort((-s, pdoc))  # by document, best passage first; doc d's group starts at _doc_first[d]
        has = np.diff(self._doc_first) > 0  # (D,) documents with a passage
        best = np.full(len(self.index), -1, dtype=np.int64)
        best[has] = order[self._doc_first[:-1][has]]
        doc_score = np.where(has, s[np.maximum(best, 0)], -np.inf)  # (D,)
        top = sorted(np.argsort(-doc_score, kind="stable")[:n].tolist(), key=lambda d: (-doc_score[d], d))
        return ([_Candidate(d, float(doc_score[d]), int(best[d])) for d in top if has[d]], doc_score, best)

    def first_stage(self, queries: Sequence[str], vectors: np.ndarray | None, n: int, hybrid: str | None,
                    systems: Sequence[str] = ("dense", "bm25"), **search_params: Any) -> list[list[_Candidate]]:
        """Each query's n best documents by one system, or by `hybrid` fusion of `systems`
        (dense, bm25, sparse, multivector) over the union of each one's n best, every candidate
        scored by every system exactly (rrf reads ranks; zscore the mean of each system's
        standardised scores, equal weights; weighted BGE-M3's weighted sum, `fusion.weighted_sum`)."""
        dense = self.dense_documents(vectors, n, **search_params) if "dense" in systems else None
        # Queries encoded together (one engine call); scored one at a time: (P,) floats each, not (Q, P).
        sparse = self.sparse.encode(queries) if "sparse" in systems else None
        late = self.multivector.encode(queries) if "multivector" in systems else None  # [(Q_i, D)]
        if hybrid is None or len(systems) == 1:
            (system,) = systems[:1]
            if system == "dense":
                return dense
            if system == "bm25":
                return [self.lexical_documents(query, n)[0] for query in queries]
            if system == "multivector":
                return [self.multivector_documents(q, n) for q in late]
            return [self.by_document(self.sparse.index.scores([s])[0], n)[0] for s in sparse]
        out = []
        for q, query in enumerate(queries):
            ranked, full = {}, {}  # system → its n best documents; → every document's best score (D,)
            if dense is not None:
                ranked["dense"] = dense[q]
            if "bm25" in systems:
                ranked["bm25"], full["bm25"], _ = self.lexical_documents(query, n)
            if sparse is not None:
                ranked["sparse"], full["sparse"], _ = self.by_document(self.sparse.index.scores([sparse[q]])[0], n)
            if late is not None:
                ranked["multivector"] = self.multivector_documents(late[q], n)
            by_doc: dict[int, _Candidate] = {}
            for c in ranked.get("dense", []):  # the backend's own scores, as it ranked them
                by_doc[c.doc] = _Candidate(c.doc, 0.0, c.passage, dense=c.score)
            for c in ranked.get("multivector", []):
                by_doc.setdefault(c.doc, _Candidate(c.doc, 0.0, c.passage)).multivector = c.multivector
            for system in systems:
                for c in ranked[system]:
                    by_doc.setdefault(c.doc, _Candidate(c.doc, 0.0, c.passage))
            for c in by_doc.values():
                if dense is not None and c.dense is None:
                    c.dense = self._doc_dense(vectors[q], c.doc)[0]
                c.lexical = float(full["bm25"][c.doc]) if "bm25" in full else None
                c.sparse = float(full["sparse"][c.doc]) if "sparse" in full else None
                if late is not None and c.multivector is None:
                    c.multivector = self._doc_multivector(late[q], c.doc)
            docs = list(by_doc)
            field_of = {"dense": "dense", "bm25": "lexical", "sparse": "sparse", "multivector": "multivector"}
            if hybrid == "rrf":
                fused = rrf([[c.doc for c in ranked[s]] for s in systems])
                scores = np.array([fused[d] for d in docs])
            elif list(systems) == ["dense", "bm25"]:  # the two-system mix, as it always was
                scores = fuse_scores(np.array([by_doc[d].dense for d in docs]),
                                     np.array([by_doc[d].lexical for d in docs]), 0.5)
            elif hybrid == "weighted":  # MaxSim / query tokens, as M3's colbert_score
                scale = {"multivector": 1.0 / len(late[q]) if late is not None else 1.0}
                scores = weighted_sum({s: np.array([getattr(by_doc[d], field_of[s]) for d in docs]) * scale.get(s, 1.0)
                                       for s in systems})
            else:
                scores = np.mean([zscore(np.array([getattr(by_doc[d], field_of[s]) for d in docs]))
                                  for s in systems], axis=0)
            order = sorted(range(len(docs)), key=lambda i: (-scores[i], docs[i]))[:n]
            for i in order:
                by_doc[docs[i]].score = float(scores[i])
            out.append([by_doc[docs[i]] for i in order])
        return out

    def check(self, *, top_k: int, candidates: int, rerank_weight: float = 1.0, hybrid: str | None = None,
              rerank: bool | None = None, systems: Sequence[str] | None = None) -> tuple[str, ...]:
        """ValueError naming the setting for search settings that cannot work together; returns
        the rankings the search reads (`check_systems`). rerank: whether a reranker orders the
        candidates (None: whether this Searcher has one)."""
        rerank = self.reranker is not None if rerank is None else rerank
        if top_k < 1 or candidates < 1:
            raise ValueError(f"top_k ({top_k}) and candidates ({candidates}) must be positive")
        if hybrid is not None and hybrid not in HYBRID:
            raise ValueError(f"unknown hybrid fusion {hybrid!r}; choose one of {', '.join(HYBRID)}")
        check_rerank_weight(rerank_weight)
        if not rerank and rerank_weight != 1.0:
            raise ValueError(f"rerank weight {rerank_weight} mixes a reranker's scores in, but this "
                             "search has no reranker; pass --rerank CROSS_ENCODER")
        if rerank and candidates < top_k:
            raise ValueError(f"candidates {candidates} < top_k {top_k}: the reranker can only "
                             "order what the first stage found; raise --candidates")
        systems = check_systems(systems, hybrid, self.sparse is not None, self.multivector is not None)
        if "bm25" in systems and not self.index.meta.get("bm25"):
            raise ValueError(f"index {self.index.path} has no BM25 index for hybrid search; rebuild it "
                             "with `bertkit index` (BM25 is built unless --no-bm25)")
        return systems

    def first_hits(self, queries: Sequence[str], vectors: np.ndarray | None, *, top_k: int = 10,
                   candidates: int = 100, hybrid: str | None = None, ef: int | None = None,
                   nprobe: int | None = None, rerank: bool = False,
                   systems: Sequence[str] | None = None, rescore_multiplier: int | None = None) -> list[list[Hit]]:
        """The first stage's documents per query, best first: `top_k` of them, or `candidates`
        when a reranker orders them next (`reranked`) or hybrid fusion needs the wider list.

        vectors: (Q, H) the queries' vectors, embedded as the index's were (`embed_queries`);
        None where the dense ranking is not among `systems` (`check`)."""
        systems = check_systems(systems, hybrid, self.sparse is not None, self.multivector is not None)
        if "dense" not in systems:
            vectors = None
        elif np.shape(vectors) != (len(queries), self.index.meta["dim"]):
            raise ValueError(f"vectors {np.shape(vectors)} must be (queries {len(queries)}, {self.index.meta['dim']})")
        if rescore_multiplier is not None and rescore_multiplier < 1:
            raise ValueError(f"rescore multiplier {rescore_multiplier} must be 1 or more (1: no oversampling)")
        params = {k: v for k, v in (("ef", ef), ("nprobe", nprobe), ("rescore_multiplier", rescore_multiplier))
                  if v is not None}
        first = candidates if rerank or hybrid is not None else top_k
        found = self.first_stage(queries, vectors, first, hybrid, systems, **params)
        keep = candidates if rerank else top_k
        return [self._hits(cands[:keep], [c.score for c in cands[:keep]]) for cands in found]

    @staticmethod
    def reranked(hits: list[Hit], logits: np.ndarray, *, top_k: int, rerank_weight: float = 1.0) -> list[Hit]:
        """One query's first-stage hits ordered by a cross-encoder's raw scores of their passages
        (`logits` (C,), in the hits' order): by its sigmoid, or with rerank_weight < 1 by
        `fuse_scores` of both stages; the best `top_k`, ranks and scores set."""
        import torch

        probs = torch.from_numpy(np.asarray(logits, dtype=np.float32)).sigmoid().numpy()  # rerank()'s own scores
        firsts = np.array([h.score for h in hits])
        final = probs if rerank_weight == 1.0 else fuse_scores(firsts, logits, rerank_weight)
        order = sorted(range(len(hits)), key=lambda i: (-final[i], i))[:top_k]
        ranked = []
        for r, i in enumerate(order):
            h = hits[i]
            h.rank, h.score = r + 1, float(final[i])
            h.first_stage_score, h.rerank_score = float(firsts[i]), float(probs[i])
            ranked.append(h)
        return ranked

    def search(self, queries: str | Sequence[str], *, top_k: int = 10, candidates: int = 100,
               rerank_weight: float = 1.0, hybrid: str | None = None, ef: int | None = None,
               nprobe: int | None = None, vectors: np.ndarray | None = None,
               systems: Sequence[str] | None = None, rescore_multiplier: int | None = None) -> list[list[Hit]]:
        """The best `top_k` documents per query (reranked from `candidates` with a reranker;
        rerank_weight < 1: ordered by `fuse_scores` of both stages, Hit.score the fused score).

        hybrid: None (dense only), "rrf" or "zscore" (dense and BM25 fused over the union of each
        one's `candidates` best documents; zscore weighs the two equally). ef / nprobe: the
        FAISS search settings (default: those recorded at build time). vectors: the queries'
        (Q, H) vectors when the caller embedded them already (a service batching the index's model
        with its other requests); None embeds them here. systems: the rankings read (one) or
        fused (several, with hybrid) among dense, bm25 and sparse; default dense, or dense and
        bm25 under hybrid."""
        from bertkit.inference.common import as_texts

        queries = as_texts(queries, "query")
        systems = self.check(top_k=top_k, candidates=candidates, rerank_weight=rerank_weight, hybrid=hybrid,
                             systems=systems)
        rerank = self.reranker is not None
        tick = time.perf_counter()
        if "dense" in systems and vectors is None:
            vectors = self.embed_queries(queries)
        found = self.first_hits(queries, vectors, top_k=top_k, candidates=candidates, hybrid=hybrid, ef=ef,
                                nprobe=nprobe, rerank=rerank, systems=systems, rescore_multiplier=rescore_multiplier)
        timings = {"retrieve_ms": (time.perf_counter() - tick) * 1000, "rerank_ms": 0.0}
        out = []
        for query, hits in zip(queries, found):
            if not rerank:
                out.append(hits)
                continue
            tick = time.perf_counter()
            logits = rerank_logits(self.reranker, query, [h.passage for h in hits])  # (C,)
            timings["rerank_ms"] += (time.perf_counter() - tick) * 1000
            out.append(self.reranked(hits, logits, top_k=top_k, rerank_weight=rerank_weight))
        self.timings = timings
        return out

    def _hits(self, cands: list[_Candidate], scores: Sequence[float]) -> list[Hit]:
        docs = self.index.documents([c.doc for c in cands])
        hits = []
        for r, (c, s, d) in enumerate(zip(cands, scores, docs)):
            _, start, end = (int(x) for x in self.index.passages[c.passage])
            end = len(d["text"]) if end < 0 else end
            hits.append(Hit(r + 1, d["id"], float(s), c.doc, d["text"], d["text"][start:end], start, end,
                            c.passage, c.passage - int(self._doc_first[c.doc]), dense_score=c.dense,
                            bm25_score=c.lexical, sparse_score=c.sparse, multivector_score=c.multivector))
        return hits


SYSTEMS = ("dense", "bm25", "sparse", "multivector")


def check_systems(systems: Sequence[str] | None, hybrid: str | None, has_sparse: bool,
                  has_multivector: bool = False) -> tuple[str, ...]:
    """The rankings a search reads: `systems` checked, or the default (dense; dense and bm25
    under hybrid)."""
    if systems is None:
        return ("dense", "bm25") if hybrid is not None else ("dense",)
    systems = tuple(dict.fromkeys(systems))
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"unknown search system {unknown[0] if unknown else 'none'!r}; choose among "
                         f"{', '.join(SYSTEMS)}")
    if len(systems) > 1 and hybrid is None:
        raise ValueError(f"{' + '.join(systems)} are several rankings: pass a fusion (--hybrid rrf, zscore "
                         "or weighted)")
    if "sparse" in systems and not has_sparse:
        raise ValueError("the sparse ranking needs the index's sparse side opened (--sparse; "
                         "Searcher.open(..., sparse=True))")
    if "multivector" in systems and not has_multivector:
        raise ValueError("the multivector ranking needs the index's multi-vector side opened (--multi-vector; "
                         "Searcher.open(..., multi_vector=True))")
    return systems


def load_reranker(model_dir: str | os.PathLike, **engine_options: Any):
    """An Engine (task rerank) over a cross-encoder dir that cuts pairs at the length the model
    was trained at: its tokenizer's model_max_length (what sentence-transformers' CrossEncoder
    reads too), capped at the model's positions; `max_length=` overrides it."""
    from bertkit.inference import Engine
    from bertkit.util.fileio import model_directory

    model_directory(model_dir, "--rerank")
    own = engine_options.get("max_length") is None
    if own:
        engine_options.pop("max_length", None)
    engine = Engine.load(model_dir, use="rerank", **engine_options)
    if own:  # Engine.load took the model's limit; a trained length below it is the one to use
        engine.max_length = max(3, min(engine.tokenizer.model_max_length, engine.max_length))
    return engine


def search(index_dir: str | os.PathLike, queries: str | Sequence[str], *, top_k: int = 10,
           candidates: int = 100, model: Any = None, rerank: Any = None, rerank_weight: float = 1.0,
           hybrid: str | None = None, ef: int | None = None, nprobe: int | None = None,
           backend_options: dict[str, Any] | None = None, systems: Sequence[str] | None = None,
           sparse_model: Any = None, **engine_options: Any) -> list[list[Hit]]:
    """One-shot search: open the index (and models), answer `queries`; see `Searcher`."""
    wants_sparse = systems is not None and "sparse" in systems
    searcher = Searcher.open(index_dir, model=model, rerank=rerank, backend_options=backend_options,
                             sparse=wants_sparse, sparse_model=sparse_model,
                             multi_vector=systems is not None and "multivector" in systems, **engine_options)
    return searcher.search(queries, top_k=top_k, candidates=candidates, rerank_weight=rerank_weight,
                           hybrid=hybrid, ef=ef, nprobe=nprobe, systems=systems)
