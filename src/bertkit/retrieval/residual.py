"""Token vectors compressed as ColBERTv2 / PLAID store them: a centroid and a few bits per dimension.

Each unit vector v (D,) is kept as its nearest centroid c (k-means over the corpus' own token
vectors, by FAISS) and its residual r = v − c, every dimension of r cut into 2^nbits buckets
whose cutoffs are the quantiles of all residual values (Santhanam et al., ColBERTv2, NAACL 2022,
§3.3). Decoding gives c + weights[bucket], renormalised to unit length, as ColBERT does; each
bucket's weight is the median of the residual values that fall in it (the quantile at its middle).
Storage per token: a 4-byte centroid id and D · nbits / 8 bytes, against 4 · D in float32 (nbits 2,
D 384: 100 bytes against 1,536).

The number of centroids follows PLAID's rule, 2^⌊log2(16 · √T)⌋ for T token vectors, capped so
that k-means has at least 39 points a centroid (FAISS's own floor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TRAIN_MAX = 1 << 18  # token vectors sampled to train k-means and the buckets


def import_kmeans():
    """FAISS, whose k-means trains the centroids; its absence named with the extra."""
    try:
        import faiss
    except ImportError:
        raise ValueError("--multi-vector trains its centroids with faiss-cpu (not installed): "
                         "pip install 'bertkit[faiss]'") from None
    return faiss


def check_nbits(nbits: int) -> int:
    if nbits not in (1, 2, 4, 8):
        raise ValueError(f"--mv-nbits {nbits} must be 1, 2, 4 or 8 (bits per dimension of a residual)")
    return nbits


def n_centroids(tokens: int) -> int:
    """PLAID's 2^⌊log2(16 · √T)⌋, at most T / 39 (and at least 1)."""
    rule = 2 ** int(np.floor(np.log2(16 * np.sqrt(max(tokens, 1)))))
    return int(max(1, min(rule, tokens // 39)))


@dataclass
class ResidualCodec:
    centroids: np.ndarray  # (C, D) float32
    cutoffs: np.ndarray  # (2^nbits − 1,) float32 bucket edges of a residual value
    weights: np.ndarray  # (2^nbits,) float32 the value each bucket decodes to
    nbits: int

    @classmethod
    def train(cls, vectors: np.ndarray, nbits: int = 2, centroids: int | None = None, seed: int = 0,
              niter: int = 20) -> "ResidualCodec":
        """k-means and residual buckets from a sample of `vectors` (T, D) float32 unit rows."""
        check_nbits(nbits)
        faiss = import_kmeans()
        rng = np.random.default_rng(seed)
        sample = vectors if len(vectors) <= _TRAIN_MAX else vectors[np.sort(rng.choice(len(vectors), _TRAIN_MAX,
                                                                                       replace=False))]
        sample = np.ascontiguousarray(sample, dtype=np.float32)
        k = centroids or n_centroids(len(vectors))
        if not 1 <= k <= len(sample):
            raise ValueError(f"{k} centroids for {len(sample)} token vectors; pass --mv-centroids 1..{len(sample)}")
        kmeans = faiss.Kmeans(sample.shape[1], k, niter=niter, seed=seed, spherical=True, verbose=False)
        kmeans.train(sample)
        codec = cls(kmeans.centroids.astype(np.float32), np.zeros(0, np.float32), np.zeros(1, np.float32), nbits)
        residuals = (sample - codec.centroids[codec.assign(sample)]).ravel()  # every residual value
        levels = 2 ** nbits
        codec.cutoffs = np.quantile(residuals, np.arange(1, levels) / levels).astype(np.float32)
        codec.weights = np.quantile(residuals, (np.arange(levels) + 0.5) / levels).astype(np.float32)
        return codec

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """(T,) int32 nearest centroid (largest inner product) of each row of `vectors` (T, D)."""
        out = np.empty(len(vectors), dtype=np.int32)
        for lo in range(0, len(vectors), 8192):
            out[lo:lo + 8192] = np.argmax(vectors[lo:lo + 8192] @ self.centroids.T, axis=1)  # (B, C) → (B,)
        return out

    def encode(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T, D) float32 → (codes (T,) int32, residuals (T, D · nbits / 8) uint8 packed buckets)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        codes = self.assign(vectors)
        buckets = np.searchsorted(self.cutoffs, vectors - self.centroids[codes]).astype(np.uint8)  # (T, D)
        return codes, self._pack(buckets)

    def decode(self, codes: np.ndarray, residuals: np.ndarray) -> np.ndarray:
        """(T,) codes and (T, D · nbits / 8) packed residuals → (T, D) float32 unit rows."""
        dim = self.centroids.shape[1]
        # Each byte holds 8 / nbits dimensions: one lookup of a (256, 8 / nbits) table of their values.
        values = self._byte_values()[residuals].reshape(len(residuals), -1)[:, :dim]  # (T, D)
        v = self.centroids[codes] + values
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    def _byte_values(self) -> np.ndarray:
        """(256, 8 / nbits) float32: the residual values a packed byte decodes to, dimension by dimension."""
        per = 8 // self.nbits
        shifts = 8 - self.nbits * (np.arange(per) + 1)  # most significant bits first, as `_pack` writes
        buckets = (np.arange(256)[:, None] >> shifts) & ((1 << self.nbits) - 1)  # (256, per)
        return self.weights[buckets].astype(np.float32)

    def _pack(self, buckets: np.ndarray) -> np.ndarray:
        """(T, D) bucket ids < 2^nbits → (T, ⌈D · nbits / 8⌉) bytes, nbits each, most significant first."""
        bits = np.unpackbits(buckets[:, :, None], axis=2)[:, :, 8 - self.nbits:]  # (T, D, nbits)
        return np.packbits(bits.reshape(len(buckets), -1), axis=1)

    def _unpack(self, packed: np.ndarray, dim: int) -> np.ndarray:
        bits = np.unpackbits(packed, axis=1)[:, :dim * self.nbits].reshape(len(packed), dim, self.nbits)
        weights = (1 << np.arange(self.nbits - 1, -1, -1)).astype(np.uint8)  # (nbits,) place values
        return (bits * weights).sum(axis=2).astype(np.intp)  # (T, D)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"centroids": self.centroids, "cutoffs": self.cutoffs, "bucket_weights": self.weights}
