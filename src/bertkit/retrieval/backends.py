"""Where an index's vectors are searched: one interface, chosen at build time, recorded in
index.json.

- `exact` (the default, no dependency): chunked inner product over the memory-mapped vectors, or
  with `vector_dtype` int8 / binary over the vectors' codes, the best `rescore_multiplier` × k
  re-scored in float (`quantize`);
- `faiss-hnsw` (`bertkit[faiss]`): a FAISS HNSW graph (M, efConstruction); search-time `ef`;
- `faiss-ivfpq` (`bertkit[faiss]`): FAISS IVF-PQ trained on the corpus' own vectors; search-time
  `nprobe`, then the best `refine` × k re-scored exactly from the vectors on disk;
- `qdrant` (`bertkit[qdrant]`): Qdrant through qdrant-client, embedded (in this process) or a
  server / cluster at `url`.

Every backend answers `search(queries (Q, H), k) → (scores (Q, k), rows (Q, k))` over the rows of
vectors.npy (the passages), best first, -1 / -inf padding where it found fewer; the index's own
store maps rows to documents. vectors.npy stays the source of truth: a FAISS file is rebuilt from
it, the embedded Qdrant collection is loaded from it when the index is opened (so nothing is read
back with pickle, which qdrant-client's on-disk local mode uses), and a server collection is
filled from it at build time (resumable: points are upserted by row, so a rerun re-sends what a
killed build may have missed).

Qdrant over Milvus Lite: both install here and both have one client for embedded and server; Qdrant's
client is pure Python (the embedded mode is an exact NumPy scan, equal to `exact`), Milvus Lite
runs a bundled server binary in a subprocess. Its makers call the embedded mode a tool for small
collections and development; the same code reaches a server or cluster with `url=`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

BACKENDS = ("exact", "faiss-hnsw", "faiss-ivfpq", "qdrant")
ALIASES = {"faiss": "faiss-hnsw"}
FAISS_FILE = "faiss.index"
QDRANT_COLLECTION = "bertkit"  # the embedded collection; a server's is named after the index
_UPLOAD_ROWS = 4096


def resolve_backend(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)} (faiss = faiss-hnsw)")
    return name


def import_faiss():
    try:
        import faiss
    except ImportError:
        raise ValueError("the faiss backends need faiss-cpu (not installed): pip install 'bertkit[faiss]'") from None
    return faiss


def import_qdrant():
    try:
        import qdrant_client
    except ImportError:
        raise ValueError("the qdrant backend needs qdrant-client (not installed): "
                         "pip install 'bertkit[qdrant]'") from None
    return qdrant_client


def default_params(name: str, rows: int, dim: int) -> dict[str, Any]:
    """Build and search settings of a backend for `rows` vectors of `dim` (recorded in index.json)."""
    if name == "faiss-hnsw":
        return {"M": 32, "ef_construction": 128, "ef": 128}
    if name == "faiss-ivfpq":
        # nlist ≈ 4·√N (FAISS's guideline), at least 39 training points per list; PQ codes of
        # dim/4 bytes (8 bits per sub-vector of 4 dims): 1/16 of float32.
        nlist = int(max(1, min(4 * np.sqrt(rows), rows // 39)))
        m = next(m for m in (dim // 4, dim // 8, dim // 2, dim, 1) if m >= 1 and dim % m == 0)
        # 8-bit codebooks need ≥ 256 training points each (FAISS asks 39 per centroid to be sure);
        # a small corpus gets smaller codebooks.
        bits = int(min(8, max(1, np.floor(np.log2(max(rows / 39, 2))))))
        return {"nlist": nlist, "m": m, "bits": bits, "nprobe": min(nlist, 32), "refine": 4}
    if name == "qdrant":
        return {"url": None}  # + "collection": bertkit-<index directory name>, set by build
    return {}


def build(name: str, out: Path, vectors: np.ndarray, params: dict[str, Any], *, seed: int = 0,
          recreate: bool = False) -> dict[str, Any]:
    """Make the backend's search structure from `vectors` (N, H) float32; returns what to record.

    recreate: a server collection is dropped and refilled (an update renumbers rows); without it a
    rerun upserts the same points again (resume)."""
    started = time.monotonic()
    if name == "qdrant":
        params = {"collection": f"bertkit-{Path(out).resolve().name}", **params}
    if name == "exact":
        if params.get("vector_dtype", "float32") != "float32":
            params = {"rescore_multiplier": 4, **params}  # 4 × k candidates re-scored in float
        _build_codes(out, vectors, params)
    elif name.startswith("faiss"):
        _build_faiss(name, out, vectors, params, seed)
    elif name == "qdrant" and params.get("url"):
        client = qdrant_client_for(params)
        _fill_qdrant(client, params["collection"], vectors, recreate=recreate)
    elif name == "qdrant":
        import_qdrant()  # embedded: loaded from vectors.npy when opened; fail now if missing
    return {"name": name, **params, "build_seconds": round(time.monotonic() - started, 3)}


def _build_codes(out: Path, vectors: np.ndarray, params: dict[str, Any]) -> None:
    """codes.npy (and ranges.npy for int8) beside the float vectors, for an int8 / binary index."""
    from bertkit.retrieval import quantize
    from bertkit.retrieval.store import save_npy

    check_vector_dtype("exact", params)
    dtype = params.get("vector_dtype", "float32")
    for name in (quantize.CODES_FILE, quantize.RANGES_FILE):
        (Path(out) / name).unlink(missing_ok=True)
    if dtype == "float32":
        return
    codes, ranges = quantize.QuantizedVectors.build(dtype, vectors)
    save_npy(Path(out) / quantize.CODES_FILE, codes)
    if ranges is not None:
        save_npy(Path(out) / quantize.RANGES_FILE, ranges)


def check_vector_dtype(name: str, params: dict[str, Any]) -> None:
    """int8 / binary codes are the exact backend's; the FAISS and Qdrant ones keep their own."""
    from bertkit.retrieval.quantize import check_vector_dtype as check_name

    dtype = check_name(params.get("vector_dtype", "float32"))
    if params.get("rescore_multiplier", 1) < 1:
        raise ValueError(f"--rescore-multiplier {params['rescore_multiplier']} must be 1 or more (1: no oversampling)")
    if dtype != "float32" and name != "exact":
        raise ValueError(f"--vector-dtype {dtype} is for the exact backend (the {name} backend keeps its own "
                         "codes; faiss-ivfpq compresses too); drop --vector-dtype or pass --backend exact")


def _build_faiss(name: str, out: Path, vectors: np.ndarray, params: dict[str, Any], seed: int) -> None:
    from bertkit.util.fileio import atomic_path

    faiss = import_faiss()
    n, dim = vectors.shape
    if name == "faiss-hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    else:
        if not 1 <= params["nlist"] <= n or dim % params["m"] or n < 2 ** params["bits"]:
            raise ValueError(f"faiss-ivfpq: nlist {params['nlist']} must be in 1..{n} (the vectors), "
                             f"PQ m {params['m']} must divide the dimension {dim}, and {n} vectors must be at "
                             f"least 2^bits ({2 ** params['bits']}); change --nlist / --pq-m")
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["m"], params["bits"],
                                 faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, size=min(n, max(256 * params["nlist"], 2 ** 14), 100_000),
                                    replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))  # the corpus' own vectors
    for lo in range(0, n, 65536):
        index.add(np.ascontiguousarray(vectors[lo:lo + 65536], dtype=np.float32))
    with atomic_path(out / FAISS_FILE) as tmp:
        faiss.write_index(index, str(tmp))


def qdrant_client_for(params: dict[str, Any]):
    """A QdrantClient: the server at params["url"], or an in-process (embedded) one."""
    qc = import_qdrant()
    if not params.get("url"):
        return qc.QdrantClient(location=":memory:")
    client = qc.QdrantClient(url=params["url"], timeout=params.get("timeout", 10), check_compatibility=False)
    try:
        client.get_collections()
    except Exception as e:  # connection refused, DNS, TLS: one line that names the URL
        raise ConnectionError(f"the Qdrant server at {params['url']} does not answer ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'no reply'}); start it, or "
                              "drop --qdrant-url for the embedded mode") from None
    return client


def _fill_qdrant(client: Any, collection: str, vectors: np.ndarray, *, recreate: bool) -> None:
    from qdrant_client import models

    n, dim = vectors.shape
    if recreate or not client.collection_exists(collection):
        if client.collection_exists(collection):
            client.delete_collection(collection)
        client.create_collection(collection, vectors_config=models.VectorParams(
            size=dim, distance=models.Distance.DOT))
    for lo in range(0, n, _UPLOAD_ROWS):
        block = np.asarray(vectors[lo:lo + _UPLOAD_ROWS], dtype=np.float32)
        client.upsert(collection, points=models.Batch(ids=list(range(lo, lo + len(block))),
                                                             vectors=block.tolist()), wait=True)


class Backend:
    """An opened backend over an index's vectors."""

    def __init__(self, name: str, path: Path, vectors: np.ndarray, params: dict[str, Any]):
        self.name, self.path, self.vectors, self.params = name, Path(path), vectors, dict(params)
        self.handle: Any = None
        if name.startswith("faiss"):
            faiss = import_faiss()
            file = self.path / FAISS_FILE
            if not file.is_file():
                raise ValueError(f"{self.path}: the {name} backend's {FAISS_FILE} is missing; rebuild "
                                 "the index with `bertkit index ... --resume`")
            self.handle = faiss.read_index(str(file))
            if self.handle.ntotal != len(vectors):
                raise ValueError(f"{file} holds {self.handle.ntotal} vectors, the index {len(vectors)}; "
                                 "rebuild it with `bertkit index ... --resume`")
        elif name == "exact" and self.params.get("vector_dtype", "float32") != "float32":
            from bertkit.retrieval.quantize import open_codes

            self.handle = open_codes(self.path, self.params["vector_dtype"], vectors,
                                     rescore_float=self.params.get("rescore_float", True))
        elif name == "qdrant":
            self.collection = self.params.get("collection", QDRANT_COLLECTION)
            self.handle = qdrant_client_for(self.params)
            if not self.params.get("url"):
                _fill_qdrant(self.handle, self.collection, vectors, recreate=True)

    def memory_bytes(self) -> int:
        """Bytes the search structure holds in memory (vectors on disk not counted)."""
        if self.name == "faiss-hnsw":
            return int(self.handle.ntotal * (self.vectors.shape[1] * 4 + self.params["M"] * 2 * 4 * 1.05))
        if self.name == "faiss-ivfpq":
            return int(self.handle.ntotal * (self.params["m"] * self.params["bits"] // 8 + 8)
                       + self.params["nlist"] * self.vectors.shape[1] * 4)
        if self.name == "exact" and self.handle is not None:
            return self.handle.memory_bytes()
        return int(self.vectors.shape[0] * self.vectors.shape[1] * 4) if self.name == "qdrant" else 0

    def search(self, queries: np.ndarray, k: int, *, ef: int | None = None, nprobe: int | None = None,
               refine: int | None = None, rescore_multiplier: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """queries (Q, H) float32 → (scores (Q, k), rows (Q, k) int64), best first; rows -1 where
        the backend found fewer than k."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = max(1, min(k, len(self.vectors)))
        if self.name == "exact" and self.handle is not None:  # int8 / binary codes
            m = rescore_multiplier if rescore_multiplier is not None else self.params.get("rescore_multiplier", 4)
            return self.handle.search(queries, k, m)
        if self.name == "exact":
            from bertkit.retrieval.exact import top_k_inner_product

            return top_k_inner_product(self.vectors, queries, k)
        if self.name == "faiss-hnsw":
            faiss = import_faiss()
            p = faiss.SearchParametersHNSW(efSearch=max(k, ef or self.params["ef"]))
            scores, rows = self.handle.search(queries, k, params=p)
            return scores, rows.astype(np.int64)
        if self.name == "faiss-ivfpq":
            faiss = import_faiss()
            p = faiss.SearchParametersIVF(nprobe=nprobe or self.params["nprobe"])
            wide = min(len(self.vectors), k * (refine if refine is not None else self.params["refine"]))
            scores, rows = self.handle.search(queries, max(k, wide), params=p)
            if (refine if refine is not None else self.params["refine"]) <= 0:
                return scores[:, :k], rows[:, :k].astype(np.int64)
            return self._rescore(queries, rows.astype(np.int64), k)
        return self._search_qdrant(queries, k)

    def _rescore(self, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner products of each query's candidates, read from the vectors on disk."""
        out_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_r = np.full((len(queries), k), -1, dtype=np.int64)
        for q, cand in enumerate(rows):
            cand = cand[cand >= 0]
            order = np.argsort(cand)
            exact = np.asarray(self.vectors[cand[order]], dtype=np.float32) @ queries[q]  # (C,)
            s, r = exact, cand[order]
            best = np.lexsort((r, -s))[:k]
            out_s[q, :len(best)], out_r[q, :len(best)] = s[best], r[best]
        return out_s, out_r

    def _search_qdrant(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        from qdrant_client import models

        answers = self.handle.query_batch_points(self.collection, requests=[
            models.QueryRequest(query=q.tolist(), limit=k) for q in queries])
        out_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_r = np.full((len(queries), k), -1, dtype=np.int64)
        for q, answer in enumerate(answers):
            points = sorted(answer.points, key=lambda p: (-p.score, p.id))
            for j, point in enumerate(points[:k]):
                out_s[q, j], out_r[q, j] = point.score, int(point.id)
        return out_s, out_r
