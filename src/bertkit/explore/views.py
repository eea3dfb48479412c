"""The numbers behind each view of the explorer page, computed from the user's text by the library.

Each function takes an `Explorer` (the loaded models) and plain arguments and returns a JSON-ready
dict; the routes in app.py only parse requests and call these, and the tests call these too.
Nothing here is canned: tokens come from the model's tokenizer, vectors from its tables, masks from
`bertkit.data.masking`, probabilities from its MLM head, attention from its own layers.

Where the page shows what the encoder does inside (the embedding sum, the attention weights), the
computation is spelled out here step by step from the model's own modules, and the tests check that
it equals the model's forward (and transformers' `output_attentions`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.constants import IGNORE_INDEX
from bertkit.data.builtin import MINIMAL_PAIRS
from bertkit.data.masking import KIND_NAMES, NOT_SELECTED, jieba_word_starts, jieba_words, mask_text
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder import disentangled
from bertkit.encoder.model import BertForMaskedLM, BertModel, count_parameters, encoder_of
from bertkit.encoder.packing import Padding
from bertkit.encoder.summary import parameter_rows
from bertkit.encoder.tasks import is_cross_encoder, label_names, use_of
from bertkit.inference import Engine, classify, fill_mask, ner, qa, rerank, similarity
from bertkit.util.fileio import model_directory
from bertkit.util.text import has_cjk

TOP_K = 5  # guesses shown per masked position
MAX_PAD = 64  # padding tokens the attention view may add
# Tokens the attention view draws: every layer × head × T × T weight goes to the page, so 512 tokens
# of a 12 × 12 model would be 38M numbers; 128 keeps the heaviest answer (MiniLM) near 1M.
MAX_ATTENTION_TOKENS = 128
# A vocabulary with at least this share of CJK entries is a Chinese model (bert-base-chinese:
# ~0.6 of 21,128; the demo's: ~0.7 of 8,000; bert-base-uncased: ~0.11 of 30,522).
CJK_VOCAB_SHARE = 0.3

EXAMPLES = {
    "zh": {"text": "他把钱存进了银行。", "pair": "两国领导人举行了会谈。",
           "classify": "这家酒店的服务很好，房间也很干净。",
           "ner": "江泽民主席在北京会见了美国总统克林顿。",
           "question": "中国的首都是哪里？", "context": "北京是中国的首都，也是全国的政治和文化中心。",
           "similar": ["今天天气很好。", "今天是晴天。", "股市今天下跌了。"],
           "query": "中国的首都", "documents": ["北京是中国的首都。", "上海是一座大城市。", "今天天气很好。"]},
    "en": {"text": "the bank raised interest rates.", "pair": "shares fell after the announcement.",
           "classify": "the film was a delight from start to finish.",
           "ner": "tony blair met george bush in washington.",
           "question": "who leads the government?",
           "context": "the prime minister leads the government of the united kingdom.",
           "similar": ["the weather is nice today.", "it is sunny today.", "the stock market fell today."],
           "query": "capital of france", "documents": ["paris is the capital of france.",
                                                       "berlin is a large city.", "the weather is nice today."]},
}


# The fill-mask view's two contexts for one slot: one of the minimal pairs the quickstart prints
# (data.builtin.MINIMAL_PAIRS), the one whose best answers differ most for the demo model.
MASK_PAIR = {"zh": 2, "en": 0}  # 美国 / 俄罗斯 (Clinton / Yeltsin); microsoft / apple


class ViewError(ValueError):
    """A request the views cannot answer, with what to change (the app answers 422 with it)."""


# ---------------------------------------------------------------------------------------------
# the loaded models
# ---------------------------------------------------------------------------------------------
@dataclass
class TaskModel:
    name: str
    use: str  # classify, ner, qa, embed, rerank
    engine: Engine

    @property
    def labels(self) -> list[str]:
        return label_names(self.engine.config) if self.use in ("classify", "ner") else []


@dataclass
class Explorer:
    """The main model (views 1-5) and the fine-tuned models of the tasks view.

    `model` is a BertForMaskedLM when the checkpoint has an MLM head (then fill-mask and the
    masking view's predictions work), else the bare BertModel. Everything runs in fp32, so the
    page's numbers equal `bertkit fill-mask`'s and the other commands' at their default precision.
    """
    name: str
    model_dir: Path
    model: nn.Module
    tokenizer: BertTokenizer
    engine: Engine
    tasks: dict[str, TaskModel] = field(default_factory=dict)

    @property
    def encoder(self) -> BertModel:
        return encoder_of(self.model)

    @property
    def has_mlm(self) -> bool:
        return isinstance(self.model, BertForMaskedLM)

    @classmethod
    def load(cls, model_dir: str | os.PathLike, tasks: list[tuple[str, str]] = (), *,
             name: str | None = None) -> "Explorer":
        """The main model from `model_dir`, and each (name, dir) of `tasks` for its own head."""
        path = model_directory(model_dir)
        use = "fill-mask" if use_of(path) == "fill-mask" else "embed"
        engine = Engine.load(path, use=use, precision="fp32")
        # runs/quickstart/model is "quickstart": a directory called "model" is named by its run
        default_name = path.resolve().parent.name if path.resolve().name == "model" else path.resolve().name
        explorer = cls(name or default_name, path, engine.model, engine.tokenizer, engine)
        if explorer.language == "zh":  # jieba loads its dictionary once, here, not at the first click
            jieba_word_starts(["预热"])
        if use == "embed":  # a sentence encoder (MiniLM): its similarity matrix is a task too
            explorer.tasks[explorer.name] = TaskModel(explorer.name, "embed", engine)
        for task_name, task_dir in tasks:
            if task_name in explorer.tasks:
                raise ValueError(f"two models are named {task_name!r}; name them apart with NAME=DIR")
            use = use_of(task_dir)
            use = "embed" if use == "fill-mask" else use  # an MLM given as a task: its sentence vectors
            task_engine = Engine.load(task_dir, use=use, precision="fp32")
            if use == "classify" and is_cross_encoder(task_engine.config):
                use = "rerank"
            explorer.tasks[task_name] = TaskModel(task_name, use, task_engine)
        return explorer

    @property
    def language(self) -> str:
        vocab = self.tokenizer.get_vocab()
        cjk = sum(1 for token in vocab if has_cjk(token))
        return "zh" if cjk >= CJK_VOCAB_SHARE * len(vocab) else "en"

    def encode(self, text: str, pair: str | None = None):
        """The tokenizer's Encoding of a text or pair, [CLS]/[SEP] included, cut to the limit."""
        if not isinstance(text, str) or not text.strip():
            raise ViewError("`text` must be a non-empty string")
        if pair is not None and (not isinstance(pair, str) or not pair.strip()):
            pair = None
        return self.engine.encode([text], None if pair is None else [pair])[0]

    def special_flags(self, ids: list[int]) -> list[bool]:
        special = set(self.tokenizer.special_ids)
        return [i in special for i in ids]


# ---------------------------------------------------------------------------------------------
# /api/info
# ---------------------------------------------------------------------------------------------
def info(explorer: Explorer) -> dict[str, Any]:
    """The model's settings, its parameter table (as `bertkit info`), examples and task models."""
    config = explorer.model.config
    total = count_parameters(explorer.model)
    rows = [{"name": name, "count": count, "share": count / total}
            for name, count in parameter_rows(explorer.model)]
    embedding = sum(r["count"] for r in rows if r["name"].startswith("embeddings."))
    special = explorer.tokenizer.special_tokens
    return {
        "model": {"name": explorer.name, "dir": str(explorer.model_dir), "model_type": config.model_type,
                  "has_mlm": explorer.has_mlm, "language": explorer.language,
                  "special_tokens": {"cls": special["cls_token"], "sep": special["sep_token"],
                                     "mask": special["mask_token"], "pad": special["pad_token"]},
                  "config": {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
                             "num_attention_heads": config.num_attention_heads,
                             "intermediate_size": config.intermediate_size,
                             "max_position_embeddings": config.max_position_embeddings,
                             "type_vocab_size": config.type_vocab_size, "vocab_size": config.vocab_size,
                             "embedding_size": config.embedding_dim},
                  "parameters": rows, "total_parameters": total, "embedding_share": embedding / total},
        "examples": _examples(explorer),
        "tasks": [{"name": t.name, "use": t.use, "labels": t.labels} for t in explorer.tasks.values()],
    }


def _examples(explorer: Explorer) -> dict[str, Any]:
    language = explorer.language
    examples = dict(EXAMPLES[language])
    mask = explorer.tokenizer.special_tokens["mask_token"]
    examples["mask_pair"] = [text.replace("[MASK]", mask)
                             for text, _ in MINIMAL_PAIRS[language][MASK_PAIR[language]]]
    return examples


# ---------------------------------------------------------------------------------------------
# 1. who sees whom
# ---------------------------------------------------------------------------------------------
def visibility(explorer: Explorer, text: str, pair: str | None = None, position: int = 1) -> dict[str, Any]:
    """BERT's bidirectional visibility against GPT's causal one, and three training objectives.

    For the chosen position p: masked LM (p replaced by [MASK], p sees every token: nothing leaks
    because its own token is hidden); next-token prediction with a causal mask (p sees 0..p and
    predicts p+1, which it cannot see); next-token prediction with full visibility (p+1 is in
    view, so the answer leaks: the model only has to copy it). The probabilities are the MLM
    head's: p(token at p) with p masked, and p(token at p+1) read at p+1 with nothing masked,
    which shows how easily a model that sees its answer "predicts" it.
    """
    enc = explorer.encode(text, pair)
    tokens, ids = list(enc.tokens), list(enc.ids)
    n = len(tokens)
    position = _position(position, n)
    mask_token = explorer.tokenizer.special_tokens["mask_token"]
    everyone = list(range(n))
    masked_input = tokens[:position] + [mask_token] + tokens[position + 1:]
    target = position + 1 if position + 1 < n else None
    prob_masked = prob_copy = None
    if explorer.has_mlm:
        masked_ids = ids[:position] + [explorer.tokenizer.mask_token_id] + ids[position + 1:]
        prob_masked = _mlm_probs(explorer, masked_ids, list(enc.type_ids), [position])[0][ids[position]]
        if target is not None:
            prob_copy = _mlm_probs(explorer, ids, list(enc.type_ids), [target])[0][ids[target]]
    no_head = "" if explorer.has_mlm else " (this model has no MLM head, so no probability)"
    objectives = [
        {"name": "masked LM", "mask": "bidirectional", "input": masked_input, "predict_at": position,
         "target_position": position, "target": tokens[position], "visible": everyone, "leak": False,
         "prob": _float(prob_masked),
         "note": "the token is replaced by the mask, so seeing both sides does not reveal it" + no_head},
        {"name": "next token, causal mask", "mask": "causal", "input": tokens, "predict_at": position,
         "target_position": target, "target": None if target is None else tokens[target],
         "visible": list(range(position + 1)), "leak": False, "prob": None,
         "note": "GPT's objective: each position sees only itself and the left, so the next token "
                 "stays hidden (BERT has no causal head to score it)"},
        {"name": "next token, full visibility", "mask": "bidirectional", "input": tokens,
         "predict_at": position, "target_position": target,
         "target": None if target is None else tokens[target], "visible": everyone,
         "leak": target is not None, "prob": _float(prob_copy),
         "note": "the answer is in view: a model trained this way learns to copy, not to understand"
                 + no_head},
    ]
    return {"tokens": tokens, "segments": list(enc.type_ids), "position": position,
            "special": explorer.special_flags(ids),
            "bert": [[1] * n for _ in range(n)],
            "gpt": [[1 if j <= i else 0 for j in range(n)] for i in range(n)],
            "objectives": objectives}


# ---------------------------------------------------------------------------------------------
# 2. input assembly
# ---------------------------------------------------------------------------------------------
def assembly(explorer: Explorer, text: str, pair: str | None = None, position: int = 0) -> dict[str, Any]:
    """Tokens, segment and position ids, and at one position the three table rows (and ERNIE's
    task-type row, under "task_type", where the model has one), their sum and the embedding
    LayerNorm's output, read from the model's own tables (as `Embeddings.forward` computes them in
    eval mode, where dropout is the identity)."""
    enc = explorer.encode(text, pair)
    ids, segments = list(enc.ids), list(enc.type_ids)
    position = _position(position, len(ids))
    emb = explorer.encoder.embeddings
    rows = [p + getattr(emb, "position_offset", 0) for p in range(len(ids))]
    with torch.inference_mode():
        token = emb.word_embeddings.weight[ids[position]]  # (E,)
        # ModernBERT has no position table (its positions rotate Q and K in every layer)
        table = getattr(emb, "position_embeddings", None)
        where = table.weight[rows[position]] if table is not None else None  # (E,)
        segment = None
        if getattr(emb, "token_type_embeddings", None) is not None:
            segment = emb.token_type_embeddings.weight[segments[position] if emb.reads_segments else 0]  # (E,)
        # A task-type table (ERNIE's) adds its row 0 to every token, as the Embeddings module does.
        tasks = getattr(emb, "task_type_embeddings", None)
        task_type = tasks.weight[0] if tasks is not None else None  # (E,)
        total = (token + (where if where is not None else 0) + (segment if segment is not None else 0)
                 + (task_type if task_type is not None else 0))  # (E,)
        normed = emb.norm(total)  # (E,)
    vectors = {"token": token, "position": where, "segment": segment, "sum": total, "layernorm": normed}
    if task_type is not None:
        vectors["task_type"] = task_type
    vectors = {k: None if v is None else v.detach().float() for k, v in vectors.items()}  # views of the tables
    return {"tokens": list(enc.tokens), "ids": ids, "segments": segments, "positions": rows,
            "position": position, "dims": int(token.numel()),
            "vectors": {k: None if v is None else v.tolist() for k, v in vectors.items()},
            "norms": {k: None if v is None else float(v.norm()) for k, v in vectors.items()}}


# ---------------------------------------------------------------------------------------------
# 3. masking step by step
# ---------------------------------------------------------------------------------------------
def masking(explorer: Explorer, text: str, seed: int = 0, whole_word: bool = False,
            mlm_probability: float = 0.15) -> dict[str, Any]:
    """The pre-training mask of one text (`bertkit.data.masking.mask_text`, the recipe training
    uses) and the model's top-5 at every selected position, p(right token) and the loss."""
    if not isinstance(seed, int) or seed < 0:
        raise ViewError(f"`seed` must be a non-negative integer, got {seed!r}")
    try:
        result = mask_text(text, explorer.tokenizer, seed=seed, whole_word_mask=bool(whole_word),
                           mlm_probability=float(mlm_probability))
    except ValueError as err:
        raise ViewError(str(err)) from None
    enc, masked = result.encoding, result.masked
    input_ids, labels, kinds = masked.input_ids[0], masked.labels[0], masked.kinds[0]  # (T,) each
    selected = np.flatnonzero(labels != IGNORE_INDEX)
    shown = explorer.tokenizer.convert_ids_to_tokens(input_ids.tolist())
    predictions, loss = [], None
    top_rows = probs = None
    if explorer.has_mlm and len(selected):
        probs = _mlm_probs(explorer, input_ids.tolist(), list(enc.type_ids), selected.tolist())  # (M, V)
        top_rows = probs.topk(min(TOP_K, probs.shape[1]), dim=-1)
        true = probs[torch.arange(len(selected)), torch.as_tensor(labels[selected])]  # (M,)
        loss = float(-true.log().mean())
    for m, p in enumerate(selected.tolist()):
        entry = {"position": p, "original": enc.tokens[p], "shown": shown[p],
                 "kind": KIND_NAMES[int(kinds[p])], "top": [], "prob_true": None, "loss": None}
        if top_rows is not None:
            top_ids = top_rows.indices[m].tolist()
            entry["top"] = [{"token": t, "score": float(v)} for t, v in
                            zip(explorer.tokenizer.convert_ids_to_tokens(top_ids), top_rows.values[m].tolist())]
            entry["prob_true"] = float(probs[m, labels[p]])
            entry["loss"] = float(-probs[m, labels[p]].log())
        predictions.append(entry)
    counts = {"candidates": int((~result.special).sum()), "selected": len(selected)}
    for code, name in (("masked", "[MASK]"), ("random", "random"), ("unchanged", "unchanged")):
        counts[code] = sum(1 for e in predictions if e["kind"] == name)
    return {"tokens": list(enc.tokens), "special": result.special.tolist(),
            "word_starts": (result.word_starts.tolist() if result.word_starts is not None
                            else [not s for s in result.special.tolist()]),
            # jieba's words for any Chinese text, whole-word masking or not
            "words": result.words if result.words is not None or not has_cjk(text) else jieba_words(text),
            "kinds": ["" if k == NOT_SELECTED else KIND_NAMES[int(k)] for k in kinds.tolist()],
            "input_tokens": shown, "labels": labels.tolist(), "counts": counts,
            "predictions": predictions, "loss": loss}


# ---------------------------------------------------------------------------------------------
# 4. fill-mask
# ---------------------------------------------------------------------------------------------
def fill(explorer: Explorer, texts: list[str], top_k: int = TOP_K) -> dict[str, Any]:
    """`bertkit.inference.fill_mask` on each text: the same numbers as `bertkit fill-mask`."""
    _need_mlm(explorer, "fill-mask")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ViewError("`texts` must be a non-empty list of non-empty strings")
    if not isinstance(top_k, int) or not 1 <= top_k <= 50:
        raise ViewError(f"`top_k` must be an integer in 1..50, got {top_k!r}")
    try:
        results = fill_mask(explorer.engine, texts, top_k=top_k)
    except ValueError as err:
        raise ViewError(str(err)) from None
    return {"results": [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in mask]
                         for mask in text] for text in results]}


# ---------------------------------------------------------------------------------------------
# 5. attention
# ---------------------------------------------------------------------------------------------
@dataclass
class AttentionTrace:
    scores: list[torch.Tensor]  # per depth (B, nh, T, T) q·k/√d before any mask
    probs: list[torch.Tensor]  # per depth (B, nh, T, T) softmax with padding keys hidden
    hidden: torch.Tensor  # (B, T, H) the encoder's output (padding rows included)


def attention_trace(encoder: BertModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> AttentionTrace:
    """The encoder's forward written out with explicit attention weights at every depth.

    input_ids, token_type_ids: (B, T) long; attention_mask: (B, T) 1 = token, 0 = padding.
    Equal to `BertModel.forward` at real positions (which never computes the weights: it calls a
    fused attention kernel) and to transformers' `output_attentions`.
    """
    batch, length = input_ids.shape
    keys = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    scores_out, probs_out = [], []
    with torch.inference_mode():
        x = encoder.embeddings(input_ids, token_type_ids)  # (B, T, E)
        if encoder.embed_proj is not None:
            x = encoder.embed_proj(x)  # (B, T, H)
        x = x.reshape(batch * length, -1)  # (B*T, H)
        # MPNet's bias (1, nh, T, T) or DeBERTa's Positions, made once for every layer as the model does
        relative = None if encoder.relative_bias is None else encoder.relative_bias.of_length(length)
        for i in encoder.schedule:
            layer = encoder.layers[i]
            # ModernBERT's layers (pre-LN, rotary, sliding windows) write themselves out.
            explicit = getattr(layer, "explicit", None)
            if explicit is not None:
                scores, probs, x = explicit(x, batch, length, keys)
            else:
                scores, probs, x = _bert_layer_explicit(layer, x, batch, length, keys, relative)
            scores_out.append(scores)
            probs_out.append(probs)
        if encoder.final_norm is not None:
            x = encoder.final_norm(x)
    return AttentionTrace(scores_out, probs_out, x.view(batch, length, -1))


def _bert_layer_explicit(layer: nn.Module, x: torch.Tensor, batch: int, length: int, keys: torch.Tensor | None,
                         relative: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A BERT-style layer (`model.EncoderLayer`) with its weights written out: x (B*T, H) → scores
    (B, nh, T, T) before the padding mask, probabilities, and the layer's output (B*T, H).

    scores are q·k/√hs, plus MPNet's relative bias (`relative`, (1, nh, T, T)); DeBERTa's are the
    content, content-to-position and position-to-content terms over its larger divisor
    (`disentangled.DisentangledAttention`, `relative` its Positions), with v2's convolution after
    the first layer, each sequence zero-padded at its own end.
    """
    nh, hs = layer.num_heads, layer.head_dim
    q, k, v = (layer.qkv(x).view(batch, length, 3, nh, hs)  # (B, T, 3, nh, hs)
               .permute(2, 0, 3, 1, 4).unbind(0))  # 3 × (B, nh, T, hs)
    terms = layer.disentangled
    if terms is None:
        scores = q @ k.transpose(-1, -2) / math.sqrt(hs)  # (B, nh, T, T)
        scores = scores if relative is None else scores + relative  # MPNet: (1, nh, T, T) broadcast
    else:
        scores = q @ k.transpose(-1, -2) / terms.scale  # (B, nh, T, T)
        if relative.index is not None:
            projected = terms.projections(layer, relative.embeddings)
            scores = scores + terms.position_scores(q, k, *projected, relative.index, relative.first_row)
    masked = scores if keys is None else scores.masked_fill(~keys, float("-inf"))
    probs = masked.softmax(-1)  # (B, nh, T, T)
    y = (probs @ v).transpose(1, 2).reshape(batch * length, -1)  # (B*T, H)
    out = layer.feed_forward(x, y)  # (B*T, H)
    if layer.conv is not None:  # every row kept, each knowing its sequence's length
        padding = None if keys is None else Padding(torch.arange(batch * length), keys, batch, length)
        out = layer.conv(x, out, disentangled.padded_rows(padding, batch, length, x.device))
    return scores, probs, out


def attention(explorer: Explorer, text: str, pair: str | None = None, pad: int = 4, layer: int = 0,
              head: int = 0) -> dict[str, Any]:
    """Every depth's and head's attention weights on the text, and the padding mask at work: the
    text with `pad` [PAD] tokens appended, one head's scores there, softmaxed with the padding
    keys hidden (what BERT does) and without (what it would do with no mask)."""
    enc = explorer.encode(text, pair)
    config = explorer.model.config
    depth = len(explorer.encoder.schedule)
    if not isinstance(layer, int) or not 0 <= layer < depth:
        raise ViewError(f"`layer` must be in 0..{depth - 1}, got {layer!r}")
    if not isinstance(head, int) or not 0 <= head < config.num_attention_heads:
        raise ViewError(f"`head` must be in 0..{config.num_attention_heads - 1}, got {head!r}")
    if not isinstance(pad, int) or not 0 <= pad <= MAX_PAD:
        raise ViewError(f"`pad` must be in 0..{MAX_PAD}, got {pad!r}")
    n = len(enc.ids)
    if n > MAX_ATTENTION_TOKENS:
        raise ViewError(f"the text has {n} tokens; the attention view draws at most "
                        f"{MAX_ATTENTION_TOKENS} (every layer and head, token to token): shorten it")
    pad = min(pad, max(0, int(explorer.engine.max_length) - n))
    ids = torch.tensor([list(enc.ids) + [config.pad_token_id] * pad])  # (1, T + P)
    types = torch.tensor([list(enc.type_ids) + [0] * pad])  # (1, T + P)
    real = torch.tensor([[1] * n + [0] * pad])  # (1, T + P)
    plain = attention_trace(explorer.encoder, ids[:, :n], types[:, :n])
    padded = attention_trace(explorer.encoder, ids, types, real)
    scores = padded.scores[layer][0, head, :n]  # (T, T + P): real queries, every key
    with_mask = scores.masked_fill(~real[0].bool(), float("-inf")).softmax(-1)  # (T, T + P)
    pad_token = explorer.tokenizer.special_tokens["pad_token"]
    return {"tokens": list(enc.tokens), "special": explorer.special_flags(list(enc.ids)),
            "layers": depth, "heads": config.num_attention_heads,
            "attention": [_rounded(p[0]) for p in plain.probs],  # [L][nh][T][T]
            "padding": {"layer": layer, "head": head, "tokens": list(enc.tokens) + [pad_token] * pad,
                        "real": n, "scores": _rounded(scores), "with_mask": _rounded(with_mask),
                        "without_mask": _rounded(scores.softmax(-1))}}


# ---------------------------------------------------------------------------------------------
# 6. tasks
# ---------------------------------------------------------------------------------------------
def task(explorer: Explorer, model: str, **fields: Any) -> dict[str, Any]:
    """Run one fine-tuned model on the page's input, through the library function of its use."""
    found = explorer.tasks.get(model)
    if found is None:
        names = ", ".join(map(repr, explorer.tasks)) or "none (start with --model NAME=DIR)"
        raise ViewError(f"no task model named {model!r}; the explorer has {names}")
    engine = found.engine
    try:
        if found.use == "classify":
            result = classify(engine, [_text(fields, "text")],
                              None if not fields.get("pair") else [_text(fields, "pair")])[0]
            if "value" in result:
                return {"use": "classify", "label": None, "value": result["value"], "scores": {}}
            return {"use": "classify", "label": result["label"], "scores": result["scores"]}
        if found.use == "ner":
            text = _text(fields, "text")
            return {"use": "ner", "text": text, "entities": ner(engine, [text])[0]}
        if found.use == "qa":
            context = _text(fields, "context")
            return {"use": "qa", "context": context,
                    "answers": qa(engine, [_text(fields, "question")], [context], top_k=3)[0]}
        texts = fields.get("texts")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ViewError("`texts` must be a non-empty list of non-empty strings")
        if found.use == "embed":
            return {"use": "embed", "texts": texts, "similarity": _rounded(similarity(engine, texts))}
        ranked = rerank(engine, _text(fields, "query"), texts)
        return {"use": "rerank", "ranked": [{"index": r["index"], "text": texts[r["index"]],
                                             "score": r["score"]} for r in ranked]}
    except ViewError:
        raise
    except ValueError as err:
        raise ViewError(str(err)) from None


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _mlm_probs(explorer: Explorer, ids: list[int], type_ids: list[int], positions: list[int]) -> torch.Tensor:
    """(M, V) fp32 softmax of the MLM head at `positions` of one sequence."""
    with torch.inference_mode():
        hidden = explorer.encoder(torch.tensor([ids]), torch.tensor([type_ids])).last_hidden_state[0]  # (T, H)
        logits = explorer.model.mlm(hidden[positions], explorer.encoder.embeddings.word_embeddings.weight)  # (M, V)
    return logits.float().softmax(-1)


def _need_mlm(explorer: Explorer, what: str) -> None:
    if not explorer.has_mlm:
        raise ViewError(f"{what} needs a masked-LM head, and {explorer.model_dir} has none; start "
                        "`bertkit explore` with a model from `bertkit pretrain` (e.g. "
                        "runs/quickstart/model after `make demo`)")


def _position(position: Any, length: int) -> int:
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position < length:
        raise ViewError(f"`position` must be an integer in 0..{length - 1} (the text has {length} "
                        f"tokens), got {position!r}")
    return position


def _text(fields: dict[str, Any], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ViewError(f"`{key}` must be a non-empty string")
    return value


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _rounded(t: torch.Tensor, digits: int = 6) -> list:
    """A tensor as nested lists, rounded: 6 decimals keep every shown digit and halve the JSON."""
    return np.round(t.detach().float().numpy().astype(np.float64), digits).tolist()
