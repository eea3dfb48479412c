"""The BERT encoder and its pre-training heads, top to bottom.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding". Numerically this is the reference architecture (post-LayerNorm, exact GELU,
learned absolute positions); checkpoints convert to and from Hugging Face names in
`checkpoint.py`. Where it departs from the usual implementation, on purpose:

- Q, K and V are one fused projection (`qkv`): one matrix multiply instead of three.
- Padding is removed before the dense layers (`packing.Padding`): when a batch has padding, every
  linear layer and LayerNorm runs on the N real tokens only (a packed (N, H) tensor); attention
  alone sees the padded (B, T) layout, with the padding mask. Hidden states at padding positions
  are returned as zeros — they carry no meaning in any implementation.
- `BertModel.forward_packed` (the inference engine's path) takes sequences laid end to end and
  computes nothing on padding, attention included (`packing.Packed`: runs of equal-length
  neighbours as one SDPA call on the CPU, one variable-length flash call on CUDA in 16 bits).
- Sparse MLM prediction: given MLM labels, the vocabulary projection runs only at the positions
  whose label is not -100 (as the original TensorFlow code gathers masked positions); the logits
  there equal those of the dense path; their cross-entropy (`ops.sparse_cross_entropy`) reads
  the bf16 logits in fp32 chunks instead of copying the whole (M, V) matrix to fp32.
- Dropout on CPU (`ops.dropout`) draws its masks from 16-bit random lanes: the probability is
  rounded to a multiple of 2⁻¹⁵ (0.1 → 0.100006). Training-time noise only; eval is unaffected.

The same encoder runs BERT's descendants; `config.model_type` says which (`config.family`, its
record in `bertkit.families`), and the differences are configuration (config.py) and checkpoint
names (the record's `names`, converted in checkpoint.py), not other classes:

- RoBERTa (Liu et al. 2019): the architecture is BERT's. Positions are numbered from
  pad_token_id + 1 (fairseq's convention: `config.position_offset`, so 514 position rows give 512
  tokens); one segment type (segment ids are then ignored, as its tokenizers give none); the MLM
  head always uses exact GELU; the sequence classifier is dense → tanh → out_proj on the [CLS]
  (`<s>`) state, with no pooler. No NSP head. XLM-RoBERTa and CamemBERT are RoBERTa with a
  SentencePiece vocabulary: the same layers, under their own class names.
- ERNIE (Sun et al. 2019): BERT plus a task-type embedding table (`use_task_id`), whose row
  `task_type_id` (0 unless config.json says otherwise) is added to every token, as transformers
  does with task_type_ids filled with that id. One task type per model, not one per token.
- ELECTRA (Clark et al. 2020): BERT's layers; embeddings of width E projected to H by
  `embed_proj` (`embeddings_project` on disk) where E ≠ H; no pooler. The generator's MLM head
  maps H back to E (exact GELU), its decoder the tied (V, E) table; the discriminator
  (`heads.BertForReplacedTokenDetection`) and the sequence classifier (dense → GELU → out_proj)
  are task heads. No NSP head.
- MPNet (Song et al. 2020): BERT's layers, positions numbered as RoBERTa's, no segments; every
  layer's attention adds one shared relative-position bias, bucketed by distance (`relative.py`),
  computed once per forward. Its MLM and classification heads are RoBERTa's. No NSP head.
- DeBERTa-v2/v3 (He et al. 2021, 2023): BERT's layers whose attention adds content-to-position and
  position-to-content terms read from relative embeddings that every layer projects, v2's
  convolution on the first layer, its own embeddings (`disentangled.py` says how); a context
  pooler at the sequence classifier (`heads.py`). No sentence head.
- ALBERT (Lan et al. 2020): embeddings of width E = `embedding_size`, projected to H by
  `embed_proj` before the first layer; the MLM head maps H back to E, so its decoder is the tied
  (V, E) table. Layers share weights: `layers` holds num_hidden_groups × inner_group_num
  distinct layers and `config.layer_schedule` runs them over the depth. The sentence head is
  sentence-order prediction (SOP), in the NSP head's place.
- DistilBERT (Sanh et al. 2019): no segment embeddings (token_type_ids are ignored) and no
  pooler; the sequence classifier is pre_classifier → ReLU → classifier on the [CLS] state. Its
  layers are BERT's (post-LN, GELU) under other names. No sentence head.
- ModernBERT (Warner et al. 2024): other embeddings and layers (`modern.py` says how and why:
  rotary positions, pre-LN GeGLU layers, local–global attention), a final LayerNorm, no pooler;
  its MLM head has switchable biases and its own activation. No sentence head.

Dimension letters used in shape comments:
  B batch, T sequence length, H hidden size, nh heads, hs head size (H / nh), I FFN size,
  N real (non-padding) tokens in the batch, M selected MLM positions, V vocabulary,
  E embedding width (ALBERT's and ELECTRA's embedding_size; H for the others).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import IGNORE_INDEX
from bertkit.encoder import disentangled, fused, modern, ops, relative
from bertkit.encoder.checkpoint import PretrainedMixin
from bertkit.encoder.config import BertConfig
from bertkit.encoder.inputs import check_inputs, check_packed
from bertkit.encoder.packing import Packed, Padding


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------
@dataclass
class BertOutput:
    last_hidden_state: torch.Tensor  # (B, T, H) float; zeros at padding positions; (B, 1, H) under first_only
    pooler_output: torch.Tensor | None  # (B, H) tanh(dense([CLS])); None without a pooler


@dataclass
class PackedOutput:
    # (N, H) float: every real token of every sequence, in packed order; (B, H) first tokens under first_only
    hidden: torch.Tensor
    pooler_output: torch.Tensor | None  # (B, H) tanh(dense([CLS])) per sequence; None without a pooler


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None  # () mlm_loss + nsp_loss (or mlm_loss alone without NSP labels)
    mlm_loss: torch.Tensor | None  # () mean cross-entropy over selected positions
    nsp_loss: torch.Tensor | None  # () mean cross-entropy over rows with an NSP label
    mlm_logits: torch.Tensor  # (M, V) at selected positions in row-major order, or (B, T, V)
    # (B, 2): NSP index 0 = IsNext, 1 = NotNext (the reference's order); ALBERT's SOP 0 = in order,
    # 1 = swapped. None for families without a sentence head (RoBERTa, DistilBERT).
    nsp_logits: torch.Tensor | None
    mlm_predictions: torch.Tensor | None = None  # (M,) argmax ids at selected positions (with mlm_labels)
    # Replaced-token detection (ELECTRA's pre-training, train/pretrain/rtd.py): the discriminator's
    # mean binary cross-entropy over real tokens, its correct decisions and the tokens counted.
    rtd_loss: torch.Tensor | None = None  # ()
    rtd_correct: torch.Tensor | None = None  # ()
    rtd_count: int | None = None


@dataclass
class MaskedLMOutput:
    loss: torch.Tensor | None  # () mean cross-entropy over positions with a label
    logits: torch.Tensor  # (M, V) at labelled positions in row-major order, or (B, T, V)


# ---------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------
class Embeddings(nn.Module):
    """token + learned position + segment embeddings (width E), then LayerNorm and dropout.

    RoBERTa's positions start at `position_offset`; DistilBERT has no segment table; ERNIE adds
    a task-type embedding.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        dim = config.embedding_dim
        self.word_embeddings = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, dim)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, dim) if config.has_segments else None
        # ERNIE's task types: every token gets row task_type_id (0 is transformers' default
        # task_type_ids), as transformers' ErnieModel does with task_type_ids filled with that id.
        self.task_type_embeddings = (nn.Embedding(config.task_type_vocab_size, dim) if config.use_task_id
                                     else None)
        self.task_type_id = config.task_type_id
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.dropout = ops.Dropout(config.hidden_dropout_prob)
        self.position_offset = config.position_offset
        self.reads_segments = config.reads_segments

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                sparse_word_grad: bool = False) -> torch.Tensor:
        """sparse_word_grad: see `BertModel.forward`."""
        length = input_ids.shape[1]
        # Right padding only, so position t is t for every row (RoBERTa: offset + t, as the
        # reference's cumulative count of non-padding tokens gives for real tokens).
        positions = torch.arange(length, device=input_ids.device) + self.position_offset  # (T,)
        sparse = (sparse_word_grad and input_ids.device.type == "cpu" and torch.is_grad_enabled()
                  and not torch.compiler.is_compiling())
        words = self.word_embeddings
        x = (F.embedding(input_ids, words.weight, words.padding_idx, sparse=sparse)  # (B, T, E)
             + self.position_embeddings(positions))  # (T, E) broadcast over B
        if self.token_type_embeddings is not None:
            if not self.reads_segments:
                token_type_ids = torch.zeros_like(token_type_ids)
            x = x + self.token_type_embeddings(token_type_ids)  # (B, T, E)
        if self.task_type_embeddings is not None:
            x = x + self.task_type_embeddings.weight[self.task_type_id]  # (E,) broadcast
        return self.dropout(self.norm(x))

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       position_ids: torch.Tensor) -> torch.Tensor:
        """(N,) ids, segments and positions (0-based in each sequence) of packed sequences → (N, E)."""
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids + self.position_offset)  # (N, E)
        if self.token_type_embeddings is not None:
            if not self.reads_segments:
                token_type_ids = torch.zeros_like(token_type_ids)
            x = x + self.token_type_embeddings(token_type_ids)  # (N, E)
        if self.task_type_embeddings is not None:
            x = x + self.task_type_embeddings.weight[self.task_type_id]  # (E,) broadcast
        return self.dropout(self.norm(x))


class EncoderLayer(nn.Module):
    """Post-LN Transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.attention_dropout = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.attn_out = nn.Linear(config.hidden_size, config.hidden_size)
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = ops.Dropout(config.hidden_dropout_prob)
        self.act = ops.activation(config.hidden_act)
        self.post_op = fused.post_op(config.hidden_act)  # the activation fused into ffn_in at inference
        # DeBERTa: the position terms of the scores (`disentangled.py`); v2's convolution, on the
        # first layer only (set by BertModel)
        relative_kind = config.family.relative_attention
        self.disentangled = disentangled.DisentangledAttention(config) if relative_kind == "disentangled" else None
        self.conv: disentangled.ConvLayer | None = None

    def attention(self, qkv: torch.Tensor, batch: int, length: int, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Bidirectional multi-head attention: every token sees every real token, both sides."""
        q, k, v = (qkv.view(batch, length, 3, self.num_heads, self.head_dim)  # (B, T, 3, nh, hs)
                   .permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
                   .unbind(0))
        if self.disentangled is not None:  # key_mask: DeBERTa's `disentangled.Positions`
            y = self.disentangled(self, q, k, v, key_mask)  # (B, nh, T, hs)
        else:
            y = ops.attention(q, k, v, key_mask,  # (B, 1, 1, T): padding keys hidden; no causal mask
                              self.attention_dropout, self.training)  # (B, nh, T, hs)
        return y.transpose(1, 2).reshape(batch, length, -1)  # (B, T, H)

    def forward(self, x: torch.Tensor, padding: Padding | None, batch: int, length: int,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (N, H) packed real tokens when padding is not None, else (B*T, H) → the same shape.
        mask: MPNet's float scores mask (B or 1, nh, T, T) (`relative.RelativeBias.scores`: the
        relative bias, -inf at padding keys) in place of the padding mask, or DeBERTa's Positions, or None."""
        qkv = fused.linear(self.qkv, x)  # (N, 3H)
        if padding is None:
            y = self.attention(qkv, batch, length, mask).view(batch * length, -1)  # (B*T, H)
        else:
            keys = padding.key_mask if mask is None else mask
            y = padding.unpad(self.attention(padding.pad(qkv), batch, length, keys))  # (N, H)
        out = self.feed_forward(x, y)
        rows = None if self.conv is None else disentangled.padded_rows(padding, batch, length, x.device)
        return out if rows is None else self.conv(x, out, rows)

    def forward_packed(self, x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: (N, H) packed sequences → (N, H); attention never sees another sequence or padding.
        bias: MPNet's relative bias (1, nh, T, T) for T ≥ the longest sequence, DeBERTa's Positions, or None."""
        qkv = fused.linear(self.qkv, x)  # (N, 3H)
        if self.disentangled is None:
            return self.feed_forward(x, packed.attend(self, qkv, bias))
        out = self.feed_forward(x, self.disentangled.attend_packed(self, qkv, packed, bias))  # (N, H)
        return out if self.conv is None else self.conv(x, out, disentangled.packed_rows(packed))

    def forward_first(self, x: torch.Tensor, padding: Padding | None, batch: int, length: int,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """`forward`'s output at each sequence's first token only: x as `forward` takes it → (B, H).

        Exact, not an approximation: that row reads every token's keys and values, which need only
        this layer's input, while its query, attention output and feed-forward are its own. What a
        [CLS] head reads, for the last layer's cost of K and V (a sixth of the layer, plus the
        query rows: the fused projection runs whole, so LoRA and int8 layers work unchanged).
        """
        qkv = fused.linear(self.qkv, x)  # (N, 3H)
        qkv = qkv.view(batch, length, -1) if padding is None else padding.pad(qkv)  # (B, T, 3H)
        q, k, v = (qkv.view(batch, length, 3, self.num_heads, self.head_dim)
                   .permute(2, 0, 3, 1, 4).unbind(0))  # (B, nh, T, hs) each
        if self.disentangled is not None:
            y = self.disentangled(self, q[:, :, :1], k, v, mask)  # (B, nh, 1, hs)
        else:
            key_mask = mask[:, :, :1] if mask is not None else None if padding is None else padding.key_mask
            y = ops.attention(q[:, :, :1], k, v, key_mask, self.attention_dropout, self.training)  # (B, nh, 1, hs)
        first = x.view(batch, length, -1)[:, 0] if padding is None else x[padding.first_rows()]  # (B, H)
        out = self.feed_forward(first, y.reshape(batch, -1))  # (B, H)
        rows = None if self.conv is None else disentangled.padded_rows(padding, batch, length, x.device, True)
        return out if rows is None else self.conv(x, out, rows)

    def forward_packed_first(self, x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`forward_packed`'s output at each sequence's first token only (see `forward_first`) → (B, H)."""
        qkv = fused.linear(self.qkv, x)  # (N, 3H)
        if self.disentangled is None:
            return self.feed_forward(x[packed.starts], packed.attend_first(self, qkv, bias))
        out = self.feed_forward(x[packed.starts], self.disentangled.attend_packed(self, qkv, packed, bias, True))
        return out if self.conv is None else self.conv(x, out, disentangled.packed_rows(packed, True))

    def feed_forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: x, y (N, H) → (N, H)."""
        if not self.training:  # dropout is the identity, so the additions can join the GEMMs
            # On the CPU without autograd, bias, GELU and the residual additions run inside
            # oneDNN's GEMMs (`fused`: 15% of MiniLM's embedding time was those passes over the
            # activations); elsewhere fused.linear computes the same unfused.
            x = self.attn_norm(fused.linear(self.attn_out, y, residual=x))  # (N, H)
            if self.post_op is not None:
                h = fused.linear(self.ffn_in, x, post=self.post_op)  # (N, I)
            else:
                h = self.act(fused.linear(self.ffn_in, x))  # (N, I)
            return self.ffn_norm(fused.linear(self.ffn_out, h, residual=x))  # (N, H)
        x = self.attn_norm(x + self.dropout(self.attn_out(y)))  # (N, H)
        h = self.ffn_out(self.act(self.ffn_in(x)))  # (N, I) → (N, H)
        return self.ffn_norm(x + self.dropout(h))  # (N, H)


class BertModel(PretrainedMixin, nn.Module):
    """Embeddings → (ALBERT, ELECTRA: E → H projection) → L encoder layers → (optional) tanh pooler on [CLS]."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        layers = config.family.layers
        self.embeddings = {"modern": modern.Embeddings, "disentangled": disentangled.Embeddings}.get(
            layers, Embeddings)(config)
        # ALBERT always has the projection (Hugging Face's embedding_hidden_mapping_in), even at E = H;
        # ELECTRA's embeddings_project exists where E differs from H.
        self.embed_proj = nn.Linear(config.embedding_dim, config.hidden_size) if config.has_embed_proj else None
        if config.is_modernbert:
            self.layers = nn.ModuleList(modern.EncoderLayer(config, i) for i in range(config.num_layer_weights))
        else:
            self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layer_weights))
        self.schedule = config.layer_schedule  # stored layer run at each depth (ALBERT repeats them)
        if layers == "disentangled" and config.conv_kernel_size > 0:
            self.layers[0].conv = disentangled.ConvLayer(config)
        # MPNet: one relative-position bias table for every layer's attention; DeBERTa: relative
        # embeddings every layer projects.
        self.relative_bias = {"bucketed": relative.RelativeBias, "disentangled": disentangled.RelativeEmbeddings,
                              None: lambda config: None}[config.family.relative_attention](config)
        # ModernBERT is pre-LN: a LayerNorm after the last layer.
        self.final_norm = modern.layer_norm(config) if config.is_modernbert else None
        self.pooler = (nn.Linear(config.hidden_size, config.hidden_size)
                       if add_pooling_layer and config.has_pooler else None)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """The reference's init: N(0, initializer_range) weights, zero biases, unit LayerNorm
        (ModernBERT: truncated at ±2σ, and its output projections smaller: `modern.init_weights`)."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if self.config.is_modernbert:
                nn.init.trunc_normal_(module.weight, 0.0, std, -2 * std, 2 * std)
            else:
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
            if getattr(module, "padding_idx", None) is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif self.config.is_modernbert:
            modern.init_weights(module, self.config)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, sparse_word_grad: bool = False,
                first_only: bool = False) -> BertOutput:
        """
        input_ids: (B, T) long token ids; token_type_ids: (B, T) long segment ids (default 0);
        attention_mask: (B, T) 1 = token, 0 = padding (default all 1).
        first_only: the last layer computes the first token's state alone (what a [CLS] head
        reads; `EncoderLayer.forward_first`), and last_hidden_state is (B, 1, H).
        sparse_word_grad: for the MLM models, whose loss also uses word_embeddings.weight densely
        (the tied decoder): the lookup's gradient is handed back as sparse rows, which autograd adds
        in place into the decoder's dense (V, H) gradient, instead of a zero-filled (V, H) tensor of
        its own that is then summed with it (a few percent per step on 2 CPU threads).
        CPU only, not under torch.compile. Never without such a dense use: a sparse .grad would
        break AdamW and clipping.
        """
        check_inputs(self.config, input_ids, token_type_ids, attention_mask)
        batch, length = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        padding = Padding.from_mask(attention_mask) if attention_mask is not None else None

        x = self.embeddings(input_ids, token_type_ids, sparse_word_grad)  # (B, T, E)
        x = x.view(batch * length, -1) if padding is None else padding.unpad(x)  # (N, E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (N, H)
        x = self.encode_rows(x, padding, batch, length, first_only)  # (N, H), or (B, H) under first_only
        if first_only:
            hidden = x[:, None]  # (B, 1, H)
        else:
            hidden = x.view(batch, length, -1) if padding is None else padding.pad(x)  # (B, T, H)
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None  # (B, H)
        return BertOutput(last_hidden_state=hidden, pooler_output=pooled)

    def encode_rows(self, x: torch.Tensor, padding: Padding | None, batch: int, length: int,
                    first_only: bool = False) -> torch.Tensor:
        """The layers over the embedded rows of a (B, T) batch: x (N, H), the real rows `padding`
        keeps (all B*T without it) → (N, H); under first_only (B, H), each sequence's first row.

        `forward`'s core, which the exported graph runs too (`bertkit.export`), so that every
        family's extras reach the layers on both paths: MPNet's bias and DeBERTa's positions, made
        once here for every layer, and ModernBERT's rotary tables and final norm.
        """
        if self.final_norm is not None:  # ModernBERT: every layer whole, then the final norm
            rope = modern.rope_tables(self.layers, torch.arange(length, device=x.device))  # once, not per layer
            for layer in self.layers:
                x = layer(x, padding, batch, length, rope[layer.layer_type])  # (N, H)
            x = self.final_norm(x)  # (N, H)
            if not first_only:
                return x
            return x.view(batch, length, -1)[:, 0] if padding is None else x[padding.first_rows()]  # (B, H)
        # once per forward, not per layer: MPNet's (B or 1, nh, T, T), DeBERTa's Positions
        mask = None if self.relative_bias is None else self.relative_bias.scores(length, padding)
        for i in (self.schedule[:-1] if first_only else self.schedule):
            x = self.layers[i](x, padding, batch, length, mask)  # (N, H)
        if first_only:
            return self.layers[self.schedule[-1]].forward_first(x, padding, batch, length, mask)  # (B, H)
        return x

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       packed: Packed, first_only: bool = False) -> "PackedOutput":
        """The encoder over sequences laid end to end (see `Packed`): no padding, attention included.

        input_ids, token_type_ids: (N,) long for the N tokens of all sequences; packed: their
        lengths. Hidden states equal `forward`'s on each sequence alone (fp32: within 1e-5).
        first_only: the last layer computes each sequence's first token alone, and `hidden` is
        (B, H), one row per sequence (see `forward`).
        """
        check_packed(self.config, input_ids, token_type_ids, packed)
        x = self.embeddings.forward_packed(input_ids, token_type_ids, packed.position_ids)  # (N, E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (N, H)
        if self.final_norm is not None:  # ModernBERT: every layer whole, then the final norm
            rope = modern.rope_tables(self.layers, packed.position_ids)  # once, not per layer
            for layer in self.layers:
                x = layer.forward_packed(x, packed, rope[layer.layer_type])  # (N, H)
            x = self.final_norm(x)
            return PackedOutput(hidden=x[packed.starts] if first_only else x, pooler_output=None)
        # once per forward, for the longest sequence: the others read its top-left block (1, nh, T, T)
        bias = None if self.relative_bias is None else self.relative_bias.of_length(max(packed.lengths))
        for i in (self.schedule[:-1] if first_only else self.schedule):
            x = self.layers[i].forward_packed(x, packed, bias)  # (N, H)
        if first_only:
            x = self.layers[self.schedule[-1]].forward_packed_first(x, packed, bias)  # (B, H)
        first = x if first_only else x[packed.starts]  # (B, H)
        pooled = torch.tanh(self.pooler(first)) if self.pooler is not None else None  # (B, H)
        return PackedOutput(hidden=x, pooler_output=pooled)

    def compile_layers(self) -> None:
        """torch.compile each encoder layer in place (regional compilation; state_dict keys unchanged).

        The layers are where the model's time goes, and all of them share one compiled graph, so
        compiling takes seconds per graph instead of minutes. The packed token count varies from
        batch to batch and is traced as a dynamic size. Around the layers the code stays eager:
        the padding index (`nonzero`) and the sparse MLM loss have data-dependent shapes that
        would make a whole-model graph recompile on every new number of selected positions.
        A batch without padding, and evaluation under no_grad, each compile a graph of their own
        the first time they come (seconds each). Dropout draws the same masks as eager, so in
        fp32 a compiled run's losses equal an eager run's.
        On 2 CPU threads it measured no faster than eager (docs/design.md, `bench/pretrain.py
        --compile`): the fused kernels of GELU, softmax and LayerNorm are bound by their erf/exp
        arithmetic just as the eager ones.
        """
        for layer in self.layers:
            layer.compile(dynamic=True)


# ---------------------------------------------------------------------------------------------
# Pre-training heads
# ---------------------------------------------------------------------------------------------
class MaskedLMHead(nn.Module):
    """dense (H → E) → act → LayerNorm → decoder tied to the word embeddings, plus its own bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.embedding_dim, bias=config.classifier_bias)
        # RoBERTa's head calls exact GELU whatever hidden_act says (the record's mlm_activation);
        # ModernBERT's, its classifier_activation.
        act = config.classifier_activation if config.is_modernbert else (config.family.mlm_activation
                                                                         or config.hidden_act)
        self.act = ops.activation(act)
        self.norm = nn.LayerNorm(config.embedding_dim, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden: (..., H); word_embeddings: (V, E), the tied decoder weight → logits (..., V)."""
        h = self.norm(self.act(self.transform(hidden)))  # (..., E)
        return F.linear(h, word_embeddings, self.bias)  # (..., V)


def mlm_logits_and_loss(head: MaskedLMHead, word_embeddings: torch.Tensor, hidden: torch.Tensor,
                        labels: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logits (dense, or sparse at labelled positions), the mean cross-entropy and the argmax ids.

    hidden: (B, T, H); labels: (B, T) long with -100 where no prediction is made, or None.
    Returns logits (M, V) for the M labelled positions in row-major order (aligned with
    labels[labels != -100]) when labels are given, else (B, T, V); loss () or None; predictions
    (M,) = logits.argmax(-1), found in the loss's own pass, or None without labels.
    """
    if labels is None:
        return head(hidden, word_embeddings), None, None  # (B, T, V)
    selected = labels != IGNORE_INDEX  # (B, T) bool
    logits = head(hidden[selected], word_embeddings)  # (M, H) → (M, V)
    targets = labels[selected]  # (M,)
    if not len(targets):
        # An empty selection gives a zero loss (not NaN) so a rare all-unmasked batch cannot poison a run.
        return logits, logits.sum() * 0.0, targets.new_empty(0)
    loss, predictions = ops.sparse_cross_entropy(logits, targets)
    return logits, loss, predictions


class BertForPreTraining(PretrainedMixin, nn.Module):
    """Encoder + MLM head + sentence head; loss = MLM + NSP (MLM alone without NSP labels).

    The sentence head is NSP for BERT, SOP for ALBERT (same shape, on the pooled [CLS], after
    ALBERT's classifier dropout), and absent for RoBERTa and DistilBERT, which pre-train MLM only.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        sentence_head = config.family.sentence_head is not None
        self.bert = BertModel(config, add_pooling_layer=sentence_head)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2) if sentence_head else None
        rate = config.classifier_dropout if config.classifier_dropout is not None else 0.1
        self.nsp_dropout = nn.Dropout(rate if config.family.sentence_head == "SOP" else 0.0)
        for module in (self.mlm, self.nsp):
            if module is not None:
                module.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None) -> PreTrainingOutput:
        """
        mlm_labels: (B, T) long, original ids at selected positions, -100 elsewhere (or None);
        nsp_labels: (B,) long, 0 = IsNext, 1 = NotNext, -100 = no NSP for that row (or None).
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, sparse_word_grad=mlm_labels is not None)
        mlm_logits, mlm_loss, mlm_predictions = mlm_logits_and_loss(
            self.mlm, self.bert.embeddings.word_embeddings.weight, out.last_hidden_state, mlm_labels)
        has_labels = nsp_labels is not None and bool((nsp_labels != IGNORE_INDEX).any())
        if self.nsp is None:
            if has_labels:
                raise ValueError(f"model_type {self.config.model_type!r} has no sentence-pair head; "
                                 "pre-train it with --objective mlm (data prepared without NSP)")
            return PreTrainingOutput(loss=mlm_loss, mlm_loss=mlm_loss, nsp_loss=None, mlm_logits=mlm_logits,
                                     nsp_logits=None, mlm_predictions=mlm_predictions)
        nsp_logits = self.nsp(self.nsp_dropout(out.pooler_output))  # (B, 2)
        nsp_loss = None
        if has_labels:
            nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_labels, ignore_index=IGNORE_INDEX)
        parts = [part for part in (mlm_loss, nsp_loss) if part is not None]
        loss = sum(parts) if parts else None
        return PreTrainingOutput(loss=loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
                                 mlm_logits=mlm_logits, nsp_logits=nsp_logits,
                                 mlm_predictions=mlm_predictions)


class BertForMaskedLM(PretrainedMixin, nn.Module):
    """Encoder (no pooler) + MLM head: fill-mask and MLM-only training."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config)
        self.mlm.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> MaskedLMOutput:
        """labels: (B, T) long, -100 where no prediction is scored (or None for dense logits)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, sparse_word_grad=labels is not None)
        logits, loss, _ = mlm_logits_and_loss(self.mlm, self.bert.embeddings.word_embeddings.weight,
                                              out.last_hidden_state, labels)
        return MaskedLMOutput(loss=loss, logits=logits)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, packed: Packed,
                       rows: torch.Tensor) -> MaskedLMOutput:
        """Inference over packed sequences: logits (M, V) at the M packed rows `rows` (long (M,)),
        e.g. the [MASK] positions; the vocabulary projection runs there only."""
        hidden = self.bert.forward_packed(input_ids, token_type_ids, packed).hidden  # (N, H)
        logits = self.mlm(hidden[rows], self.bert.embeddings.word_embeddings.weight)  # (M, V)
        return MaskedLMOutput(loss=None, logits=logits)


def encoder_of(model: nn.Module) -> BertModel:
    """The BertModel inside any head model (`model.bert`), or the model itself when it is one."""
    return getattr(model, "bert", model)


def count_parameters(module: nn.Module) -> int:
    """Parameters counted once even when shared (the tied MLM decoder; ALBERT's layers are stored once)."""
    return sum(p.numel() for p in module.parameters())


__all__ = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertOutput", "PreTrainingOutput",
           "PackedOutput",
           "MaskedLMOutput", "count_parameters", "encoder_of"]
