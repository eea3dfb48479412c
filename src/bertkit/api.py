"""The front door for Python: `bertkit.load(path)` → a `Model` with every use of it.

    import bertkit
    model = bertkit.load("all-MiniLM-L6-v2")          # any BERT-family directory
    vectors = model.encode(["a text", "another"])      # np.ndarray (2, 384) float32
    model.similarity(vectors, vectors)                 # np.ndarray (2, 2) cosine

One model is loaded once, with the head its checkpoint has, and every method runs on the one
inference engine (`bertkit.inference.Engine`): the same batching, precision and answers as the
command line and the service. The encoder under any head embeds and tokenizes; the other methods
need their head (fill_mask a masked-LM head, classify a sequence classifier, rerank a cross-encoder,
ner a token classifier, qa a question-answering head) and say which head the model has otherwise.
A model in BGE-M3's layout (its two head files beside the encoder) also gives its three outputs
from one forward pass (`encode(texts, output=("dense", "sparse", "colbert"))`) and its scores
(`compute_score`).

`encode` follows sentence-transformers' `SentenceTransformer.encode`: NumPy out (a torch tensor
with convert_to_tensor=True), one row per text, a 1-D vector for a single string, and the model's
own pooling and Normalize module from its sentence-transformers files; `normalize=True` scales to
unit length on top. For a directory without those files it pools the mean without normalising, as
sentence-transformers does for a plain BERT; `bertkit embed` and `inference.embed` return unit
vectors there instead (their default suits search).

A ColBERT directory (PyLate's layout) also has `encode_query` / `encode_document` (per-text
(T, D) token vectors, sentence-transformers v5's names) and `rerank` by MaxSim (`inference.colbert`).

Results are plain Python: dicts with the keys the service's JSON uses, so they print and serialise
as they are.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from bertkit import inference
from bertkit.encoder import tasks
from bertkit.encoder.config import BertConfig
from bertkit.encoder.sentence_transformers import sentence_transformers_settings
from bertkit.inference.colbert import LATE_INTERACTION_NEEDS, Colbert
from bertkit.inference.common import as_texts
from bertkit.inference.embed import resolve_prompt
from bertkit.inference.engine import DEFAULT_MAX_BATCH_TOKENS, Engine
from bertkit.util.fileio import model_directory

# Texts per engine call when the caller gives no batch_size: the engine sorts and packs inside a
# call, so larger is no faster, and a progress bar moves once per call.
DEFAULT_CHUNK = 1024


def load(path: str | os.PathLike, *, adapter: str | os.PathLike | None = None,
         base: str | os.PathLike | None = None, precision: str = "fp32", device: str = "auto",
         max_length: int | None = None, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
         threads: int | None = None, truncate: bool = True,
         calibration: "str | os.PathLike | Sequence[str] | None" = None) -> "Model":
    """Load a model directory (bertkit's or any Hugging Face BERT-family checkpoint) for use.

    path: a model directory, or a LoRA adapter directory (PEFT's files), run over its base: the
      directory adapter_config.json's base_model_name_or_path names, or `base` where that is not
      a local directory. The Model then has the adapter's use, head and labels.
    adapter: a LoRA adapter directory to run over `path`, its base (`load_adapters` loads several
      over one base).

    precision: fp32 (default: equal to sentence-transformers and transformers), bf16, int8 (CPU;
      cosine ≈ 0.99 to fp32), int8-static (CPU; ranges calibrated on text: `calibration`, a file
      or texts, or those `bertkit calibrate` saved in `path`) or auto (the faster of fp32 and
      bf16, measured on this machine).
    device: auto (CUDA when there is one, as sentence-transformers picks), cpu or cuda.
    max_length: tokens per input (default: the model's own limit, a sentence-transformers model's
      max_seq_length, a reranker's trained pair length). truncate=False makes longer inputs an error.
    max_batch_tokens: the engine's token budget per batch. threads: torch's intra-op threads.
    """
    from bertkit.adapters import resolve

    directory, adapter = resolve(path, adapter, base)
    if adapter is not None:
        return load_adapters(directory, {"adapter": adapter}, precision=precision, device=device,
                             max_length=max_length, max_batch_tokens=max_batch_tokens, threads=threads,
                             truncate=truncate)["adapter"]
    use = tasks.use_of(directory)
    if use == "classify" and tasks.is_cross_encoder(BertConfig.from_json(directory)):
        use = "rerank"  # a one-label classifier is a cross-encoder, and `model.use` says so
    options: dict[str, Any] = dict(precision=precision, device=device, max_batch_tokens=max_batch_tokens,
                                   threads=threads, truncate=truncate)
    if max_length is not None:
        options["max_length"] = max_length
    if calibration is not None:
        options["calibration"] = calibration
    model = Model(Engine.load(directory, use=use, **options), **sentence_transformers_settings(directory))
    model.colbert = Colbert.of(model.engine)
    return model


def load_adapters(base: str | os.PathLike, adapters: Mapping[str, str | os.PathLike], *,
                  precision: str = "fp32", device: str = "auto", max_length: int | None = None,
                  max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, threads: int | None = None,
                  truncate: bool = True) -> dict[str, "Model"]:
    """{name: Model} of LoRA adapters over one base loaded once (`bertkit.adapters`): each Model
    has its adapter's use, head and labels; the base's weights are in memory once for all.

        models = bertkit.load_adapters("minilm", {"topics": "runs/topics", "sentiment": "runs/sent"})
        models["topics"].classify(["Shares fell sharply"])
    """
    from bertkit.adapters import AdapterHost

    directory = model_directory(base)
    options: dict[str, Any] = dict(precision=precision, device=device, max_batch_tokens=max_batch_tokens,
                                   threads=threads, truncate=truncate)
    if max_length is not None:
        options["max_length"] = max_length
    host = AdapterHost(Engine.load(directory, use="embed", **options), directory)
    settings = sentence_transformers_settings(directory)
    return {name: Model(host.add(name, path, max_length=max_length).engine, **settings)
            for name, path in adapters.items()}


class Model:
    """A loaded model and its uses (see the module docstring). Build with `bertkit.load`, or
    `Model(engine)` over an `Engine` made otherwise (a model in memory).

    prompts, default_prompt_name, truncate_dim: what a sentence-transformers model's
    config_sentence_transformers.json says (`encode` uses them as sentence-transformers does).
    colbert: the late-interaction side of a ColBERT directory (`inference.colbert`; `load` finds it).
    """

    colbert: Colbert | None = None

    def __init__(self, engine: Engine, *, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, truncate_dim: int | None = None):
        self.engine = engine
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self.truncate_dim = truncate_dim

    # -- what it is ----------------------------------------------------------------------------
    @property
    def config(self):
        return self.engine.config

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def use(self) -> str:
        """What its head does: embed, fill-mask, classify, rerank, ner or qa (`tasks.USES`)."""
        return self.engine.use or "embed"

    @property
    def max_length(self) -> int:
        """Tokens per input, special tokens included; longer inputs are cut (or refused)."""
        return self.engine.max_length

    @property
    def dimension(self) -> int:
        """The size of `encode`'s vectors."""
        return self.engine.config.hidden_size

    def get_embedding_dimension(self) -> int:
        """`dimension`, by sentence-transformers' name (`get_sentence_embedding_dimension` before v5)."""
        return self.dimension

    get_sentence_embedding_dimension = get_embedding_dimension

    def __repr__(self) -> str:
        where = self.engine.model_dir or "a model in memory"
        return (f"bertkit.Model({where}: {self.use}, {self.engine.precision} on {self.engine.device}, "
                f"max_length {self.max_length})")

    # -- every model -----------------------------------------------------------------------------
    def encode(self, texts: str | Sequence[str], *, batch_size: int | None = None, normalize: bool = False,
               normalize_embeddings: bool | None = None, convert_to_tensor: bool = False,
               convert_to_numpy: bool = True, pooling: str | None = None, prompt_name: str | None = None,
               prompt: str | None = None, truncate_dim: int | None = None,
               show_progress_bar: bool = False, output: str | Sequence[str] | None = None,
               precision: str = "float32") -> np.ndarray | torch.Tensor | dict[str, Any]:
        """Sentence embeddings: (N, H) float32 for a list, (H,) for one string.

        batch_size: texts per engine call (default 1,024; the engine packs each call by tokens).
        normalize (or sentence-transformers' normalize_embeddings): scale to unit length.
        convert_to_tensor: a torch tensor instead of NumPy (convert_to_numpy=False: a list of
        1-D tensors, as sentence-transformers). pooling: mean, cls or max instead of the model's.
        prompt_name / prompt: text put before every input — one of the model's named prompts, or
        your own (default: the model's default_prompt_name, if it has one); its tokens are pooled
        with the text's, as sentence-transformers does unless a model's pooling excludes them.
        truncate_dim: keep the first dimensions (a Matryoshka model; default: the model's own
        truncate_dim); the vectors are cut after the model's Normalize, then normalized only when
        asked, as sentence-transformers does.
        output: BGE-M3's outputs from one forward pass, any of "dense", "sparse", "colbert" (a
        model with M3's head files; dense alone runs on any model): a dict by output name of
        dense (N, H) unit rows, sparse [{token id as str: weight}] (FlagEmbedding's
        lexical_weights) and colbert [(T - 1, D) unit rows], per text (one string: its own).
        precision: float32, or codes as sentence-transformers' `quantize_embeddings` makes them
        (int8 / uint8: (N, H), each dimension's range calibrated on these texts' vectors; binary /
        ubinary: sign bits packed (N, ⌈H / 8⌉)); `bertkit.retrieval.quantize` holds the rules.
        """
        from bertkit.retrieval.quantize import PRECISIONS

        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
        single = isinstance(texts, str)
        texts = as_texts(texts)
        prefix = resolve_prompt({"prompts": self.prompts, "default_prompt_name": self.default_prompt_name},
                                prompt_name, prompt)
        if output is not None:
            if (pooling is not None or truncate_dim is not None or normalize or normalize_embeddings
                    or precision != "float32"):
                raise ValueError("pooling, normalize, truncate_dim and precision shape encode's one dense vector; with "
                                 "output=, dense is BGE-M3's unit [CLS] vector (without M3's heads: the "
                                 "model's pooling, unit length): leave them out")
            chunk = _chunk_size(batch_size)
            return _m3_result([inference.encode_m3(self.engine, texts[i:i + chunk], output, prompt=prefix)
                               for i in range(0, len(texts), chunk)], single)
        unit = normalize or bool(normalize_embeddings)
        # Not asked to normalise: the model's own Normalize module, if its files have one.
        own = None if self.engine.pooling is not None and pooling is None else False
        chunk = _chunk_size(batch_size)
        starts = range(0, len(texts), chunk)
        if show_progress_bar:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encode", unit="batch")
        parts = [inference.embed(self.engine, texts[i:i + chunk], pooling=pooling, normalize=True if unit else own,
                                 prompt=prefix) for i in starts]
        vectors = torch.cat(parts) if len(parts) > 1 else parts[0]
        dim = truncate_dim if truncate_dim is not None else self.truncate_dim
        if dim is not None:
            if not 0 < dim <= vectors.shape[-1]:
                raise ValueError(f"truncate_dim must be in 1..{vectors.shape[-1]}, got {dim}")
            vectors = vectors[:, :dim]
            if unit:
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
        if precision != "float32":
            from bertkit.retrieval.quantize import quantize

            vectors = torch.from_numpy(quantize(vectors.numpy(), precision))  # (N, H) or (N, ⌈H / 8⌉) codes
        if single:
            vectors = vectors[0]
        if convert_to_tensor:
            return vectors
        if not convert_to_numpy:
            return list(vectors) if not single else vectors
        return vectors.numpy()

    def compute_score(self, pairs: tuple[str, str] | Sequence[tuple[str, str]], *,
                      weights: Sequence[float] | None = None) -> dict[str, list[float] | float]:
        """BGE-M3's scores of (query, passage) pairs, as FlagEmbedding's compute_score: {"colbert",
        "sparse", "dense", "sparse+dense", "colbert+sparse+dense": one score per pair} (one pair:
        floats). weights: (dense, sparse, colbert) of the mixed modes, default (1, 1, 1)."""
        single = len(pairs) == 2 and all(isinstance(t, str) for t in pairs)
        scores = inference.compute_score(self.engine, [pairs] if single else pairs, weights=weights)
        return {mode: values[0] for mode, values in scores.items()} if single else scores

    def similarity(self, a: np.ndarray | torch.Tensor | Sequence[str],
                   b: np.ndarray | torch.Tensor | Sequence[str] | None = None) -> np.ndarray:
        """Cosine similarities (len(a), len(b)) of embeddings or of texts (encoded first); b
        defaults to a."""
        first = self._vectors(a)
        second = first if b is None else self._vectors(b)
        first = torch.nn.functional.normalize(first, dim=-1)
        second = torch.nn.functional.normalize(second, dim=-1)
        return (first @ second.T).numpy()

    def tokenize(self, texts: str | Sequence[str], *, add_special_tokens: bool = True
                 ) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        """The pieces each text becomes, as TEI's /tokenize: [{"id", "text", "special", "start",
        "stop"}] (start / stop: character offsets; None for [CLS] / [SEP])."""
        single = isinstance(texts, str)
        out = inference.tokens(self.engine, as_texts(texts), add_special_tokens=add_special_tokens)
        return out[0] if single else out

    # -- by head -------------------------------------------------------------------------------
    def fill_mask(self, texts: str | Sequence[str], *, top_k: int = 5,
                  targets: Sequence[str] | None = None) -> list:
        """Candidates at each [MASK]: [{"token", "token_id", "score"}] best first, per mask, per
        text (one string: per mask). score: the softmax probability over the vocabulary."""
        self._need("fill-mask")
        single = isinstance(texts, str)
        results = inference.fill_mask(self.engine, texts, top_k=top_k, targets=targets)
        shaped = [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in mask] for mask in text]
                  for text in results]
        return shaped[0] if single else shaped

    def classify(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None, *,
                 function: str | None = None, windows: bool = False,
                 stride: int | None = None) -> dict[str, Any] | list[dict[str, Any]]:
        """{"label", "score", "scores": {label: score}} per text ({"value"} for a regression head).
        pairs: second texts for a pair model. windows: read a long text through every window of
        it (probabilities averaged) instead of cutting it at max_length."""
        self._need("classify")
        single = isinstance(texts, str)
        out = inference.classify(self.engine, texts, pairs, function=function, windows=windows, stride=stride)
        return out[0] if single else out

    def rerank(self, query: str, documents: Sequence[str], *, top_k: int | None = None,
               raw_scores: bool = False, return_documents: bool = False) -> list[dict[str, Any]]:
        """Documents by relevance to `query`, best first: [{"index", "score"}] (+ "text" with
        return_documents), as sentence-transformers' CrossEncoder.rank scores them. A ColBERT
        model scores by MaxSim of the token vectors instead (raw_scores changes nothing there)."""
        if self.colbert is not None:  # late interaction: MaxSim of the token vectors
            ranked = self.colbert.rerank(query, documents, top_k=top_k)
            return [{**row, "text": documents[row["index"]]} for row in ranked] if return_documents else ranked
        self._need("rerank")
        ranked = inference.rerank(self.engine, query, documents, top_k=top_k, raw_scores=raw_scores)
        if return_documents:
            ranked = [{**row, "text": documents[row["index"]]} for row in ranked]
        return ranked

    def ner(self, texts: str | Sequence[str], *, stride: int | None = None) -> list:
        """Entities per text: [{"type", "text", "start", "end", "score"}] with character offsets."""
        self._need("ner")
        single = isinstance(texts, str)
        out = inference.ner(self.engine, texts, stride=stride)
        return out[0] if single else out

    def qa(self, questions: str | Sequence[str], contexts: str | Sequence[str], *, top_k: int = 1,
           allow_no_answer: bool = False, **settings: Any) -> list:
        """The top_k answers per question: [{"text", "start", "end", "score"}], best first (one
        question: its list). contexts: one per question, or one for all. settings:
        max_answer_length, doc_stride, max_seq_length, ... as `bertkit.inference.qa`."""
        self._need("qa")
        single = isinstance(questions, str)
        out = inference.qa(self.engine, questions, contexts, top_k=top_k, allow_no_answer=allow_no_answer,
                           **settings)
        return out[0] if single else out

    def encode_query(self, texts: str | Sequence[str], *, convert_to_tensor: bool = False, **options: Any):
        """Queries as sentence-transformers v5's `encode_query`. A ColBERT model: (T, D) float32 token
        vectors per text ([Q] prefix, [MASK] expansion to query_length, unit rows), NumPy unless
        convert_to_tensor; one string gives one array. A dense model: `encode` with its "query"
        prompt, if it has one (`options` go to `encode`)."""
        if self.colbert is None:
            named = {"prompt_name": "query"} if "query" in self.prompts and "prompt" not in options else {}
            return self.encode(texts, convert_to_tensor=convert_to_tensor, **{**named, **options})
        return self._late(texts, True, convert_to_tensor, options)

    def encode_document(self, texts: str | Sequence[str], *, convert_to_tensor: bool = False, **options: Any):
        """Documents as sentence-transformers v5's `encode_document`. A ColBERT model: (T, D) float32
        token vectors per text ([D] prefix, cut at document_length, punctuation dropped, unit
        rows). A dense model: `encode` with its "document" prompt, if it has one."""
        if self.colbert is None:
            named = {"prompt_name": "document"} if "document" in self.prompts and "prompt" not in options else {}
            return self.encode(texts, convert_to_tensor=convert_to_tensor, **{**named, **options})
        return self._late(texts, False, convert_to_tensor, options)

    def _late(self, texts, is_query: bool, convert_to_tensor: bool, options: dict[str, Any]):
        """A ColBERT model's token vectors; batch_size: texts per engine call, as `encode`."""
        chunk = _chunk_size(options.pop("batch_size", None))
        if options:
            raise ValueError(f"options {sorted(options)} do not apply to a ColBERT model's token vectors")
        items = as_texts(texts)
        rows = [row for i in range(0, len(items), chunk)
                for row in self.colbert.encode(items[i:i + chunk], is_query=is_query)]
        rows = rows if convert_to_tensor else [row.numpy() for row in rows]
        return rows[0] if isinstance(texts, str) else rows

    def require_late_interaction(self) -> Colbert:
        """This model's ColBERT side, or a one-line ValueError naming what late interaction needs."""
        if self.colbert is None:
            where = self.engine.model_dir or "this model"
            raise ValueError(f"{where} is not a ColBERT model; late interaction needs {LATE_INTERACTION_NEEDS}")
        return self.colbert

    def encode_sparse(self, texts: str | Sequence[str], *, batch_size: int | None = None,
                      max_active_dims: int | None = None, prompt_name: str | None = None,
                      prompt: str | None = None, convert_to_sparse_tensor: bool = True
                      ) -> torch.Tensor | list[dict[str, Any]]:
        """SPLADE sparse embeddings from the masked-LM head, as sentence-transformers'
        `SparseEncoder.encode`: a sparse COO tensor (N, vocabulary) float32 (one string: (V,)),
        or with convert_to_sparse_tensor=False TEI's /embed_sparse shape, [{"index", "value"}]
        per text. max_active_dims: keep each text's k largest weights. prompt_name / prompt: as
        `encode`. `decode` turns the result into (token, weight) pairs.
        """
        from bertkit.inference.sparse import embed_sparse, to_sparse_tensor

        self._need("fill-mask", "encode_sparse")
        single = isinstance(texts, str)
        texts = as_texts(texts)
        prefix = resolve_prompt({"prompts": self.prompts, "default_prompt_name": self.default_prompt_name},
                                prompt_name, prompt)
        chunk = _chunk_size(batch_size)
        rows = [row for i in range(0, len(texts), chunk)
                for row in embed_sparse(self.engine, texts[i:i + chunk], top_k=max_active_dims, prompt=prefix)]
        if not convert_to_sparse_tensor:
            shaped = [[{"index": int(i), "value": float(v)} for i, v in zip(ix, vs)] for ix, vs in rows]
            return shaped[0] if single else shaped
        tensor = to_sparse_tensor(rows, self.config.vocab_size)
        return tensor[0] if single else tensor

    def decode(self, embeddings: torch.Tensor, top_k: int | None = None
               ) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """(token, weight) pairs of sparse embeddings, largest first (the k largest with top_k), as
        sentence-transformers' SparseEncoder.decode: a list per row, one list for a 1-D input."""
        from bertkit.inference.sparse import decode

        dense = embeddings.to_dense() if embeddings.is_sparse else torch.as_tensor(embeddings)
        single = dense.dim() == 1
        out = []
        for row in dense.reshape(-1, dense.shape[-1]):
            ix = row.nonzero().squeeze(1)
            out.append(decode(self.tokenizer, ix, row[ix], top_k))
        return out[0] if single else out

    # -- helpers -------------------------------------------------------------------------------
    def _need(self, use: str, method: str | None = None) -> None:
        """ValueError unless this model's head does `use`, naming the head it has (and `method`,
        the one asked for; default: the use's own)."""
        have = self.use
        ok = (use == have or (use == "classify" and have == "rerank")
              or (use == "rerank" and have == "classify" and tasks.is_cross_encoder(self.config)))
        if not ok:
            where = self.engine.model_dir or "this model"
            raise ValueError(f"{where} is {tasks.HEADS[tasks.USES[have].kind].description} ({have}); "
                             f"{method or use.replace('-', '_')} needs {tasks.USES[use].needs}")

    def _vectors(self, x) -> torch.Tensor:
        if isinstance(x, str) or (isinstance(x, Sequence) and x and isinstance(x[0], str)):
            return self.encode(x, convert_to_tensor=True).reshape(-1, self.dimension)
        return torch.as_tensor(np.asarray(x), dtype=torch.float32).reshape(-1, np.shape(x)[-1])


def _m3_result(parts: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    """`encode_m3`'s chunks joined into `encode(output=...)`'s dict of NumPy and plain Python."""
    out: dict[str, Any] = {}
    for name in parts[0]:
        rows = [row for part in parts for row in part[name]]
        if name == "dense":
            out[name] = torch.cat([part[name] for part in parts]).numpy()
        elif name == "sparse":
            out[name] = [{str(int(i)): float(v) for i, v in zip(ix, values)} for ix, values in rows]
        else:
            out[name] = [tokens.numpy() for tokens in rows]
    return {name: value[0] for name, value in out.items()} if single else out


def _chunk_size(batch_size: int | None) -> int:
    if batch_size is None:
        return DEFAULT_CHUNK
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return batch_size
