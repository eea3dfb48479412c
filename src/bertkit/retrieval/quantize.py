"""Dense vectors stored as int8 or binary codes, searched on the codes and re-scored in float.

The codes are sentence-transformers' (`quantize_embeddings`, the test's oracle):

- int8: each dimension's range [min, max] calibrated on the corpus' own vectors (`ranges`
  (2, H) float32) cut into 256 buckets; code = clip(floor((x − min) / step), 0, 255) − 128, with
  step = (max − min) / 255 (1 where a dimension is constant). 1/4 of float32.
- binary: the sign bits (x > 0) packed 8 to a byte (np.packbits), stored − 128 as int8 ("binary")
  or as they are ("ubinary"). 1/32 of float32.

Search (sentence-transformers' `semantic_search_faiss` scheme, exact): the first stage finds each
query's k · m best rows on the codes alone (int8: the query quantized with the corpus' ranges,
inner product of the unsigned codes, as FAISS's IndexFlatIP over uint8 does; binary: the fewest
differing bits, Hamming, as IndexBinaryFlat), and those k · m are re-scored with the float query:
against the original float vectors when they are kept (an index keeps them on disk,
memory-mapped, as the source of truth: only the k · m rows are read), otherwise against the codes
themselves (int8 codes turned back into bucket floors; binary bits as 0 / 1), which is exactly
sentence-transformers' rescoring. m (`rescore_multiplier`) trades reads for recall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VECTOR_DTYPES = ("float32", "int8", "binary")
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")  # Model.encode(precision=...), as ST's
CODES_FILE = "codes.npy"
RANGES_FILE = "ranges.npy"
_CHUNK = 65536  # rows per step over a memory-mapped matrix
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)  # bits set per byte value


def check_vector_dtype(name: str) -> str:
    if name not in VECTOR_DTYPES:
        raise ValueError(f"unknown vector dtype {name!r}; choose one of {', '.join(VECTOR_DTYPES)}")
    return name


def calibrate(vectors: np.ndarray) -> np.ndarray:
    """(2, H) float32: each dimension's min and max over `vectors` (N, H), read in chunks."""
    if len(vectors) < 2:
        raise ValueError(f"int8 codes calibrate each dimension's range over the vectors given; {len(vectors)} "
                         "is too few: give at least 2 (or use float32 or binary)")
    lo = np.full(vectors.shape[1], np.inf, dtype=np.float32)
    hi = np.full(vectors.shape[1], -np.inf, dtype=np.float32)
    for start in range(0, len(vectors), _CHUNK):
        block = np.asarray(vectors[start:start + _CHUNK], dtype=np.float32)
        lo, hi = np.minimum(lo, block.min(0)), np.maximum(hi, block.max(0))
    return np.stack([lo, hi])


def _steps(ranges: np.ndarray) -> np.ndarray:
    ranges = ranges.astype(np.float32, copy=False)
    steps = (ranges[1] - ranges[0]) / 255
    return np.where(steps == 0, 1, steps)  # a constant dimension: one bucket


def quantize(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """Float vectors (N, H) → codes: int8 / uint8 (N, H) with `ranges` (2, H) (calibrated on
    `vectors` themselves when None, as ST does); binary int8 / ubinary uint8 (N, ⌈H / 8⌉)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if precision == "float32":
        return vectors
    if precision in ("int8", "uint8"):
        ranges = calibrate(vectors) if ranges is None else ranges
        q = np.clip(np.floor((vectors - ranges[0].astype(np.float32)) / _steps(ranges)), 0, 255)
        return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)
    if precision in ("binary", "ubinary"):
        bits = np.packbits(vectors > 0, axis=-1)  # (N, ⌈H / 8⌉) uint8
        return bits if precision == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


def dequantize(codes: np.ndarray, precision: str, ranges: np.ndarray | None, dim: int) -> np.ndarray:
    """Codes → (N, H) float32 as ST's rescoring reads them: int8 each bucket's floor, binary its
    bits as 0 / 1 (the padding bits past H dropped)."""
    if precision == "int8":
        return (codes.astype(np.float32) + 128) * _steps(ranges) + ranges[0].astype(np.float32)
    return np.unpackbits(_unsigned(codes), axis=-1)[:, :dim].astype(np.float32)


def _unsigned(bits: np.ndarray) -> np.ndarray:
    """Packed bits as uint8 whether stored as ubinary (as they are) or binary (− 128)."""
    return bits if bits.dtype == np.uint8 else (bits.astype(np.int16) + 128).astype(np.uint8)


class QuantizedVectors:
    """An index's codes (memory-mapped) with their ranges, searched as the module docstring says."""

    def __init__(self, dtype: str, codes: np.ndarray, ranges: np.ndarray | None, dim: int,
                 floats: np.ndarray | None = None):
        self.dtype, self.codes, self.ranges, self.dim, self.floats = dtype, codes, ranges, dim, floats

    @classmethod
    def build(cls, dtype: str, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(codes, ranges) of `vectors` (N, H): int8 (N, H) with ranges (2, H); binary (N, ⌈H/8⌉), None."""
        ranges = calibrate(vectors) if dtype == "int8" else None
        codes = [quantize(np.asarray(vectors[lo:lo + _CHUNK]), dtype, ranges) for lo in range(0, len(vectors), _CHUNK)]
        return np.concatenate(codes), ranges

    def memory_bytes(self) -> int:
        return int(self.codes.nbytes + (self.ranges.nbytes if self.ranges is not None else 0))

    def _first_stage(self, queries: np.ndarray, k: int) -> np.ndarray:
        """(Q, k) rows best on the codes (ties by row)."""
        from bertkit.retrieval.exact import top_k_inner_product

        if self.dtype == "int8":
            q = quantize(queries, "uint8", self.ranges).astype(np.float32)  # (Q, H) the query's own codes
            return top_k_inner_product(_Shifted(self.codes), q, k)[1]
        q_bits = quantize(queries, "ubinary")  # (Q, B)
        rows = np.empty((len(queries), k), dtype=np.int64)
        dist = np.empty((len(queries), len(self.codes)), dtype=np.int32)  # (Q, N) Hamming distances
        step = max(1, (1 << 22) // max(1, q_bits.size))  # code rows per XOR block: ≤ 4 MiB of bytes
        for lo in range(0, len(self.codes), step):
            block = _unsigned(np.asarray(self.codes[lo:lo + step]))  # (C, B)
            x = np.bitwise_xor(q_bits[:, None, :], block[None, :, :])  # (Q, C, B)
            dist[:, lo:lo + len(block)] = _POPCOUNT[x].sum(-1, dtype=np.int32)
        for i, d in enumerate(dist):
            part = np.argpartition(d, k - 1)[:k]
            rows[i] = part[np.lexsort((part, d[part]))]
        return rows

    def search(self, queries: np.ndarray, k: int, rescore_multiplier: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """queries (Q, H) float32 → (scores (Q, k), rows (Q, k) int64), best first, re-scored in
        float over each query's k · rescore_multiplier candidates (module docstring)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n = len(self.codes)
        k = max(1, min(k, n))
        wide = min(n, k * max(1, rescore_multiplier))
        cands = self._first_stage(queries, wide)  # (Q, wide)
        out_s = np.empty((len(queries), k), dtype=np.float32)
        out_r = np.empty((len(queries), k), dtype=np.int64)
        for i, rows in enumerate(cands):
            order = np.argsort(rows)  # ascending rows: one forward pass over the memory map
            rows = rows[order]
            if self.floats is not None:
                vectors = np.asarray(self.floats[rows], dtype=np.float32)  # (wide, H) from disk
            else:
                vectors = dequantize(np.asarray(self.codes[rows]), self.dtype, self.ranges, self.dim)
            s = vectors @ queries[i]  # (wide,)
            best = np.lexsort((rows, -s))[:k]
            out_s[i], out_r[i] = s[best], rows[best]
        return out_s, out_r


class _Shifted:
    """int8 codes read as their unsigned values (c + 128) in float32, block by block: the shape
    `top_k_inner_product` reads (len, .shape, .ndim, slicing)."""

    def __init__(self, codes: np.ndarray):
        self.codes, self.shape, self.ndim = codes, codes.shape, 2

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, item: Any) -> np.ndarray:
        return np.asarray(self.codes[item], dtype=np.float32) + 128


def open_codes(path: Any, dtype: str, floats: np.ndarray | None, *, rescore_float: bool = True) -> QuantizedVectors:
    """An index directory's codes (and ranges); floats: its float vectors, read for re-scoring
    when rescore_float."""
    from pathlib import Path

    root = Path(path)
    if not (root / CODES_FILE).is_file():
        raise ValueError(f"{root}: the {dtype} codes ({CODES_FILE}) are missing; rebuild the index with "
                         f"`bertkit index ... --vector-dtype {dtype} --overwrite`")
    codes = np.load(root / CODES_FILE, mmap_mode="r")
    ranges = np.load(root / RANGES_FILE) if dtype == "int8" else None
    dim = floats.shape[1] if floats is not None else (codes.shape[1] if dtype == "int8" else codes.shape[1] * 8)
    if floats is not None and len(codes) != len(floats):
        raise ValueError(f"{root}: {len(codes)} codes for {len(floats)} vectors; rebuild the index")
    return QuantizedVectors(dtype, codes, ranges, dim, floats if rescore_float else None)
