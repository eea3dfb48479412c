"""Export a model directory to ONNX or OpenVINO, laid out as the serving tools that read them expect.

`export(model_dir, out, format="onnx" | "openvino")` writes a directory that the ONNX backends of
text-embeddings-inference (TEI) and sentence-transformers load as they are:

    OUT/config.json, the tokenizer files, and the sentence-transformers files when the model has them
        (modules.json, sentence_bert_config.json, 1_Pooling/config.json, ...): copied
    OUT/onnx/model.onnx (+ model.onnx_data past 2 GB)    (--format onnx; TEI: `onnx/model.onnx`;
                                                          sentence-transformers' backend="onnx")
    OUT/openvino/openvino_model.xml + .bin               (--format openvino; backend="openvino")

The graph, one per task head, with optimum's input and output names:

    inputs   input_ids (B, T) int64, attention_mask (B, T) int64 (1 = token, 0 = padding) and,
             for families that read segments (BERT, ALBERT, ERNIE, ELECTRA, DeBERTa-v2 with
             segment embeddings), token_type_ids (B, T) int64
    embed    last_hidden_state (B, T, H); with `pooled` also sentence_embedding (B, H): the model's
             own pooling and normalisation (its 1_Pooling and Normalize modules; mean and unit
             length without them), or the `pooling` / `normalize` given. TEI uses
             sentence_embedding where the graph has it, and pools last_hidden_state itself where not.
    fill-mask  logits (B, T, V)
    classify (and rerank)  logits (B, K)
    ner      logits (B, T, K)
    qa       start_logits (B, T), end_logits (B, T)

B and T are dynamic axes (`batch_size`, `sequence_length`): one file serves any batch and any
length up to the model's limit.

The graph is bertkit's own modules run over a padded batch (`PaddedGraph`): the embeddings, the
encoder's own layer loop (`BertModel.encode_rows`, so MPNet's bias, DeBERTa's positions and
ModernBERT's rotary tables and final norm are in it as in `forward`) and the head, with the
padding mask passed to attention. It departs from the
engine on purpose: the engine packs sequences end to end and skips padding, which a runtime fed
fixed (B, T) tensors cannot do; the layers here see every position, as every ONNX consumer pads.
Values at real tokens equal bertkit's (fp32: within 1e-5); at padding positions the hidden states
are whatever the layers compute there (bertkit returns zeros) and carry no meaning.

Exporter: `torch.onnx.export(..., dynamo=True)`, torch's default since 2.9 and the one it
maintains (the TorchScript exporter is deprecated). It traces with `torch.export`, which records
the batch and length as symbolic sizes and fails loudly if any code path would fix them,
instead of the TorchScript tracer's silent baking of a shape into a Reshape; it needs `onnxscript`.
The encoder code is traced with autograd on, so `fused.linear` takes its plain path: the oneDNN
ops of the CPU fast path have no ONNX form. OpenVINO's model comes from the ONNX file
(`openvino.convert_model`), so both formats carry the same graph.

Every export is checked before it is moved into place: the written file runs in its runtime
(ONNX Runtime or OpenVINO) on a small padded batch and must agree with the bertkit model within
`CHECK_TOLERANCE`; the largest difference is reported. The output directory appears whole or
not at all (written beside it, then renamed).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import EXPORT_USES, POOLINGS
from bertkit.encoder import tasks
from bertkit.encoder.model import encoder_of
from bertkit.encoder.packing import Padding, mean_pool
from bertkit.inference import Engine
from bertkit.inference.uses import USES
from bertkit.util.fileio import check_writable_output, model_directory, staged_directory

FORMATS = ("onnx", "openvino")
TASKS = EXPORT_USES
# Each use's output names, as its record in `inference.uses` declares them (optimum's names).
OUTPUTS = {task: USES[task].outputs for task in TASKS}
FILES = {"onnx": ("onnx/model.onnx",), "openvino": ("openvino/openvino_model.xml", "openvino/openvino_model.bin")}
# The largest |exported - bertkit| accepted at the export's own check (fp32; measured ~1e-6).
CHECK_TOLERANCE = 1e-4
# What a model directory holds beside its weights that a reader of the export needs: the config,
# the tokenizer and sentence-transformers' description of the pipeline.
_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json", "merges.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
_ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "README.md")
EXTRA_HINT = "pip install 'bertkit[export]'"
# Weights above this go to model.onnx_data beside model.onnx (protobuf refuses files over 2 GB).
EXTERNAL_DATA_BYTES = (1 << 31) - (1 << 26)


def need_tools(format: str) -> None:
    """The packages `format` needs, or a one-line ValueError naming the extra that installs them."""
    modules = {"onnx": ("onnx", "onnxscript", "onnxruntime"), "openvino": ("onnx", "onnxscript", "openvino")}
    if format not in modules:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    for module in modules[format]:
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"export to {format} needs {module}, which is not installed: {EXTRA_HINT}")


class _AllPositions(Padding):
    """A `Padding` whose every position is a row: the mask reaches attention as `key_mask`, and
    nothing is gathered or scattered, so the graph has no data-dependent sizes. `index` lists
    every row (b * T + t), which is where DeBERTa-v2's convolution reads each row's position."""

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        return packed.view(self.batch, self.length, -1)  # (B*T, D) → (B, T, D)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded.reshape(self.batch * self.length, -1)  # (B, T, D) → (B*T, D)


class PaddedGraph(nn.Module):
    """A bertkit model as the exported graph computes it: (input_ids, attention_mask[,
    token_type_ids]) (B, T) → the task's outputs (`OUTPUTS`, plus sentence_embedding when pooled)."""

    def __init__(self, model: nn.Module, task: str, pooling: str | None = None, normalize: bool = False):
        super().__init__()
        if task not in OUTPUTS:
            raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        self.model, self.task, self.pooling, self.normalize = model, task, pooling, normalize
        self.encoder = encoder_of(model)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor) -> torch.Tensor:
        """The encoder over a padded batch: (B, T) ids → (B, T, H), as `BertModel.forward` at real tokens."""
        encoder = self.encoder
        batch, length = input_ids.shape
        key_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): padding keys hidden
        index = torch.arange(batch * length, device=input_ids.device)  # (B*T,)
        padding = _AllPositions(index=index, key_mask=key_mask, batch=batch, length=length)
        x = encoder.embeddings(input_ids, token_type_ids).reshape(batch * length, -1)  # (B*T, E)
        if encoder.embed_proj is not None:
            x = encoder.embed_proj(x)  # (B*T, H)
        x = encoder.encode_rows(x, padding, batch, length)  # (B*T, H): the model's own layer loop
        return x.view(batch, length, -1)  # (B, T, H)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        # Autograd on: `fused.linear` then computes with plain ops, which have an ONNX form.
        with torch.enable_grad():
            hidden = self.hidden(input_ids, attention_mask, token_type_ids)  # (B, T, H)
            return self.head(hidden, attention_mask)

    def head(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T, H) → the use's outputs (its record's `graph`), then sentence_embedding (B, H) when pooled."""
        outputs = USES[self.task].graph(self.model, hidden)
        if self.pooling is None:
            return outputs
        return (*outputs, pool_padded(hidden, attention_mask, self.pooling, self.normalize))


def pool_padded(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    """(B, T, H) states of a padded batch → (B, H), as `inference.embed.pool` over the real tokens."""
    if mode == "cls":
        vectors = hidden[:, 0]  # (B, H)
    elif mode == "max":
        vectors = hidden.masked_fill(attention_mask[:, :, None] == 0, float("-inf")).amax(1)  # (B, H)
    else:
        vectors = mean_pool(hidden, attention_mask)  # (B, H)
    return F.normalize(vectors, dim=-1) if normalize else vectors


@dataclass
class ExportReport:
    """What `export` wrote, and how closely the written file agrees with bertkit."""
    out: Path
    format: str
    task: str
    files: list[str]  # relative to out
    inputs: list[str]
    outputs: list[str]
    max_abs_diff: float  # largest |exported - bertkit| over the check batch, every output
    pooling: str | None = None
    normalize: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "format": self.format, "task": self.task, "files": self.files,
                "inputs": self.inputs, "outputs": self.outputs, "max_abs_diff": self.max_abs_diff,
                "pooling": self.pooling, "normalize": self.normalize}


def export(model_dir: str | os.PathLike, out: str | os.PathLike, *, format: str = "onnx",
           task: str | None = None, pooled: bool = False, pooling: str | None = None,
           normalize: bool | None = None, opset: int | None = None, overwrite: bool = False) -> ExportReport:
    """Export `model_dir` for `task` (default: the use its head serves, `tasks.use_of`) to `out`.

    format: onnx | openvino. pooled (embed only): add the sentence_embedding output, pooled by
    `pooling` (mean | cls | max; default the model's own) and unit length when `normalize`
    (default the model's own); giving either implies pooled. opset: the ONNX opset (default:
    the exporter's). overwrite: replace what an earlier export left in `out`.
    Raises ValueError (bad format, task, pooling, missing packages: `need_tools`), the engine's
    errors for a bad model directory, FileExistsError for an existing export without overwrite.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    if task is not None and task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; use one of {', '.join(POOLINGS)}")
    model_dir = model_directory(model_dir)
    out = check_writable_output(out, overwrite=overwrite, kind="dir")
    task = task or tasks.use_of(model_dir)
    pooled = pooled or pooling is not None or normalize is not None
    if pooled and task != "embed":
        raise ValueError(f"a pooled sentence_embedding output is for --task embed; {model_dir} exports "
                         f"for {task} (pass --task embed to export its encoder as an embedding model)")
    engine = Engine.load(model_dir, use=task, precision="fp32", device="cpu")
    mode = norm = None
    if pooled:
        own = engine.pooling
        mode = pooling or (own.mode if own else "mean")
        norm = normalize if normalize is not None else (own.normalize if own else True)
    need_tools(format)
    graph = PaddedGraph(engine.model, task, mode, bool(norm)).eval()
    segments = engine.config.reads_segments
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if segments else [])
    outputs = list(OUTPUTS[task]) + (["sentence_embedding"] if pooled else [])

    with staged_directory(out) as work:
        copy_model_files(model_dir, work)
        onnx_file = work / "onnx" / "model.onnx"
        onnx_file.parent.mkdir()
        write_onnx(graph, engine, onnx_file, inputs, outputs, opset)
        if format == "openvino":
            write_openvino(onnx_file, work / "openvino" / "openvino_model.xml")
            shutil.rmtree(work / "onnx")
        diff = check_export(work, format, graph, engine, inputs, outputs)
        if diff > CHECK_TOLERANCE:
            raise ValueError(f"the exported {format} model differs from bertkit's by {diff:.2e} "
                             f"(more than {CHECK_TOLERANCE:g}); nothing was written to {out}")
        files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
    return ExportReport(out=out, format=format, task=task, files=files, inputs=inputs, outputs=outputs,
                        max_abs_diff=diff, pooling=mode, normalize=norm)


def copy_model_files(model_dir: Path, out: Path) -> None:
    """config.json, the tokenizer files and the sentence-transformers modules' settings (not weights)."""
    for name in ("config.json", *_TOKENIZER_FILES, *_ST_FILES):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    modules = model_dir / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text(encoding="utf-8")):
            sub = str(module.get("path") or "")
            if sub and (model_dir / sub).is_dir() and not (out / sub).exists():
                shutil.copytree(model_dir / sub, out / sub)


def sample_batch(engine: Engine) -> dict[str, torch.Tensor]:
    """A small padded batch of real tokenized texts (two lengths, a pair with segment 1): the
    example the exporter traces and the export's check runs."""
    texts = ["the quick brown fox jumps over the lazy dog near the river bank", "a short one"]
    pairs = ["what does the fox jump over", "and the second"]
    encodings = engine.tokenizer.encode_raw(texts, pairs, max_length=min(engine.max_length, 64))
    length = max(len(e.ids) for e in encodings)
    pad = engine.tokenizer.pad_token_id

    def padded(rows, value):
        return torch.tensor([list(r) + [value] * (length - len(r)) for r in rows], dtype=torch.long)

    return {"input_ids": padded([e.ids for e in encodings], pad),
            "attention_mask": padded([[1] * len(e.ids) for e in encodings], 0),
            "token_type_ids": padded([e.type_ids for e in encodings], 0)}


def write_onnx(graph: PaddedGraph, engine: Engine, path: Path, inputs: list[str], outputs: list[str],
               opset: int | None) -> None:
    """torch.onnx.export (the dynamo exporter) with dynamic batch and sequence axes."""
    from torch.export import Dim

    example = sample_batch(engine)
    args = tuple(example[name] for name in inputs)
    batch = Dim("batch_size")
    length = Dim("sequence_length", max=engine.config.max_sequence_length)
    shapes = {name: {0: batch, 1: length} for name in inputs}
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "torchvision is not installed" and other notes of no use here
    try:
        with warnings.catch_warnings():  # the exporter's deprecation and axis-renaming notices
            warnings.simplefilter("ignore")
            program = torch.onnx.export(graph, args, input_names=inputs, output_names=outputs, dynamo=True,
                                        dynamic_shapes=shapes, opset_version=opset, external_data=False,
                                        verbose=False)
    finally:
        quiet.setLevel(level)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    if sum(p.numel() * p.element_size() for p in graph.parameters()) > EXTERNAL_DATA_BYTES:
        # Past protobuf's 2 GB limit the weights go to one file beside the graph, under the name
        # optimum and sentence-transformers look for; the graph names it, so ONNX Runtime finds it.
        import onnx

        onnx.save_model(program.model_proto, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=path.name + "_data")
    else:
        program.save(str(path), external_data=False)


def write_openvino(onnx_file: Path, xml: Path) -> None:
    """openvino.convert_model from the ONNX file, saved as openvino_model.xml + .bin (fp32 weights)."""
    import openvino as ov

    xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(onnx_file)), str(xml), compress_to_fp16=False)


def run_exported(out: str | os.PathLike, format: str, feeds: dict[str, Any]) -> dict[str, Any]:
    """Run an exported directory's model once on numpy `feeds` (name → int64 array) in its runtime
    (ONNX Runtime for onnx, OpenVINO's CPU plugin for openvino); {output name: numpy array}."""
    out = Path(out)
    if format == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))
    import openvino as ov

    compiled = ov.Core().compile_model(str(out / "openvino" / "openvino_model.xml"), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled(feeds)
    return {o.get_any_name(): result[o] for o in compiled.outputs}


def check_export(work: Path, format: str, graph: PaddedGraph, engine: Engine, inputs: list[str],
                 outputs: list[str]) -> float:
    """Largest |exported - bertkit| on the sample batch, at real tokens (positions past a sequence's
    end carry no meaning). The reference is the bertkit model's own padded forward (`forward`)."""
    example = sample_batch(engine)
    got = run_exported(work, format, {name: example[name].numpy() for name in inputs})
    expected = reference_outputs(graph, example)
    mask = example["attention_mask"].bool()
    worst = 0.0
    for name in outputs:
        want, have = expected[name], torch.from_numpy(got[name]).float()
        if have.shape != want.shape:
            raise ValueError(f"the exported output {name} has shape {tuple(have.shape)}, bertkit's "
                             f"{tuple(want.shape)}")
        if want.dim() >= 2 and want.shape[:2] == mask.shape:  # per token: real positions only
            want, have = want[mask], have[mask]
        worst = max(worst, float((have - want).abs().max()))
    return worst


def reference_outputs(graph: PaddedGraph, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertkit's answer for each exported output name, from the model's `forward` (padded path)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.inference_mode():
        out = graph.model(ids, batch["token_type_ids"], mask)  # the output names are its fields
        found = {name: getattr(out, name) for name in OUTPUTS[graph.task]}
        if graph.pooling is not None:  # embed: last_hidden_state (B, T, H), zeros at padding
            found["sentence_embedding"] = pool_padded(out.last_hidden_state, mask, graph.pooling, graph.normalize)
        return found


__all__ = ["EXTRA_HINT", "FORMATS", "OUTPUTS", "TASKS", "ExportReport", "PaddedGraph", "export",
           "need_tools", "pool_padded", "run_exported"]
