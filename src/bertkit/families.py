"""The model families bertkit implements, one record each: what a room may ask of a family.

As transformers' `models/auto` maps a `model_type` to its classes, `FAMILIES` maps config.json's
`model_type` to a `Family`: the capabilities the rooms ask for (shares its layers, where its
positions start, has a pooler, which LoRA targets, what its tokenizer directory holds, where its
heads sit on disk), so that a room asks `config.family.shares_layers`, never `model_type ==
"albert"`. How the layers themselves differ is the encoder's (`encoder/model.py`, ModernBERT's
pieces in `encoder/modern.py`, DeBERTa's in `encoder/disentangled.py`); a new family is a record
here, plus a layer variant there when its layers are not BERT's.

Torch-free and at the bottom of the layers (above `constants`), so the data layer (tokenizers)
and the encoder read the same records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

# Where a family's positions come from: a learned table from 0 (BERT), the same table numbered from
# pad_token_id + 1 (fairseq's convention, RoBERTa: 514 rows give 512 tokens), or rotary
# positions in every layer's attention, with no table (ModernBERT).
POSITIONS = ("absolute", "after_padding", "rotary")
# What the sequence classifier reads the [CLS] state through (`encoder/heads.py` says how each runs):
# BERT's pooler, RoBERTa's dense → tanh → out_proj, ELECTRA's dense → GELU → out_proj,
# DistilBERT's pre_classifier → ReLU, or ModernBERT's prediction head (dense → act → LayerNorm).
# DeBERTa's context pooler (dropout → dense → pooler_hidden_act, at the head, not in the encoder).
SEQUENCE_CLASSIFIERS = ("pooler", "dense_tanh", "dense_gelu", "pre_classifier", "prediction_head", "context_pooler")
# When the embeddings (width embedding_size) are projected to hidden_size before the first layer:
# never (the tables are hidden_size wide), always (ALBERT), or where the widths differ (ELECTRA);
# DeBERTa's, where they differ, sits inside its embeddings before their LayerNorm, without bias.
EMBEDDING_PROJECTIONS = (None, "always", "if_differs", "before_norm")
# The encoder layers a family runs: BERT's post-LayerNorm layers (`encoder/model.py`) or ModernBERT's
# pre-LN, rotary, GeGLU, local–global ones (`encoder/modern.py`), or BERT's with DeBERTa's disentangled
# attention and embeddings (`encoder/disentangled.py`).
LAYERS = ("bert", "modern", "disentangled")
# A bias added to every layer's attention scores by relative distance: none, or MPNet's bucketed
# table, one row of heads per bucket, shared by the layers (`encoder/relative.py`); or DeBERTa's
# relative embeddings, which each layer projects into position terms of its scores (`encoder/disentangled.py`).
RELATIVE_ATTENTIONS = (None, "bucketed", "disentangled")

# A LoRA target adapts (bertkit's module in a layer, the third of the fused qkv it lands on, or
# None for the whole module) pairs; one target may name two modules (ModernBERT's two Wo).
LoraModules = tuple[tuple[str, int | None], ...]


@dataclass(frozen=True)
class TokenizerLayout:
    """What a family's tokenizer directory holds when it has no tokenizer.json, and its defaults."""
    # the `data/tokenizer_backends` builder that reads the files: wordpiece | bpe | unigram | deberta_spm |
    # fairseq_spm (json: tokenizer.json alone)
    backend: str
    files: tuple[str, ...]  # the files that builder reads
    tokenizer_class: str  # transformers' class, written to tokenizer_config.json when none is named
    # Special tokens when tokenizer_config.json names none; empty: BERT's [PAD] [UNK] [CLS] [SEP] [MASK]
    # (`data/tokenizer_backends.SPECIAL_KEYS`), which every builder starts from.
    specials: Mapping[str, str]
    extra: str = ""  # the pyproject extra its files need (SentencePiece models: sentencepiece, protobuf)


@dataclass(frozen=True)
class NameMap:
    """How one family names its tensors on disk (Hugging Face) against bertkit's names in memory.

    Every (ours, theirs) pair is a name prefix; the encoder sits under `bert.` in memory and under
    `prefix` on disk, and a bare encoder's tensors have no prefix in either. `encoder/checkpoint.py`
    converts with it.
    """
    prefix: str  # the encoder's prefix under a head on disk: "bert.", "roberta.", ...
    base_roots: tuple[str, ...]  # first parts of a bare encoder's tensor names on disk
    layer: str  # regex of a stored layer's stem on disk; ALBERT's has two numbers (group, inner)
    qkv: tuple[str, ...]  # the query, key and value projections' names inside a layer (none: fused on disk)
    layer_parts: tuple[tuple[str, str], ...]  # (ours, theirs) inside a layer
    outer: tuple[tuple[str, str], ...]  # (ours, theirs) outside the layers: embeddings, pooler, heads
    ignored: str  # regex of tensors real checkpoints carry that no model needs (buffers, tied decoder)
    decoder_bias: tuple[str, str] | None = None  # (MLM bias, the legacy decoder.bias it may hide as)
    # (memory name, other memory name) prefixes of one disk tensor: loading takes the one the model has
    aliases: tuple[tuple[str, str], ...] = ()
    # (ours, theirs) of the MLM head written when config.json's `legacy` is false (DeBERTa's
    # lm_predictions.lm_head); both layouts load, whatever `legacy` says
    unlegacy_mlm: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Family:
    """One `model_type`: what the rooms outside the encoder may ask of it."""
    model_type: str
    class_prefix: str  # transformers' class names: BertModel, RobertaForMaskedLM, DistilBertFor…
    positions: str  # one of POSITIONS
    segments: bool  # a segment (token type) table, so pairs carry segment ids
    pooler: bool  # a tanh dense on [CLS] (BERT's sequence classifier and multiple choice read it)
    # With one segment type, every token gets row 0 whatever the ids say (RoBERTa's tokenizers give none).
    ignores_segment_ids: bool
    sequence_classifier: str  # one of SEQUENCE_CLASSIFIERS
    sentence_head: str | None  # pre-training's sentence-pair head: "NSP", "SOP" (ALBERT) or none
    layers: str  # one of LAYERS
    # ALBERT: num_hidden_groups × inner_group_num stored layers repeated over the depth, so there are
    # no distinct layers to adapt per depth (LoRA, adapters) or to pick (distillation).
    shares_layers: bool
    # `--lora targets=`: PEFT's target name → the modules it adapts in a layer. BERT's names for
    # the families with BERT's layers (DistilBERT's q_lin / out_lin / lin1 / lin2 are what they
    # land on), ModernBERT's own; none where the layers are shared.
    lora_targets: Mapping[str, LoraModules]
    tokenizer: TokenizerLayout
    names: NameMap  # tensor names on disk: the encoder's prefix, its layers, the MLM, sentence and task heads
    # Pre-training's default share of masked tokens: BERT's 15%, ModernBERT's 30% (Warner et al. 2024).
    mlm_probability: float = 0.15
    # One of EMBEDDING_PROJECTIONS; embedding_size is a config field only where there is one.
    embedding_projection: str | None = None
    # transformers' head names (after the class prefix) that are another bertkit kind than their
    # name says (`encoder/tasks.py`'s HEADS): ELECTRA's ForPreTraining is its discriminator.
    head_kinds: Mapping[str, str] = field(default_factory=dict)
    # A task-type table whose row 0 is added to every token (ERNIE's `use_task_id`, `task_type_vocab_size`).
    task_types: bool = False
    # The MLM head's activation where the architecture fixes it (fairseq's RobertaLMHead calls exact
    # GELU whatever hidden_act says); None: hidden_act.
    mlm_activation: str | None = None
    # One of RELATIVE_ATTENTIONS; relative_attention_num_buckets is a config field only where there is one.
    relative_attention: str | None = None
    # The family's config.json keys → the BertConfig fields they are (read in, written back).
    config_keys: Mapping[str, str] = field(default_factory=dict)
    # BertConfig fields the family has no config.json key for, fixed by its architecture.
    fixed_fields: Mapping[str, object] = field(default_factory=dict)
    # Values of the fields a config.json of the family may leave out: its transformers config's defaults.
    defaults: Mapping[str, object] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ tokenizers
WORDPIECE = TokenizerLayout("wordpiece", ("vocab.txt",), "BertTokenizer", {})
# fairseq's special tokens, which RoBERTa and its SentencePiece descendants keep: `<s> A </s></s> B </s>`.
_FAIRSEQ_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>",
                     "mask_token": "<mask>"}
# RoBERTa's byte-level BPE.
BPE = TokenizerLayout("bpe", ("vocab.json", "merges.txt"), "RobertaTokenizer", _FAIRSEQ_SPECIALS)
# ALBERT's SentencePiece Unigram model: BERT's markers, SentencePiece's padding and unknown.
UNIGRAM = TokenizerLayout("unigram", ("spiece.model",), "AlbertTokenizer",
                          {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                           "mask_token": "[MASK]"}, extra="albert")
# ModernBERT ships a tokenizer.json only (OLMo's BPE with BERT's special tokens).
TOKENIZER_JSON = TokenizerLayout("json", ("tokenizer.json",), "PreTrainedTokenizerFast", {})
# XLM-RoBERTa's and CamemBERT's SentencePiece Unigram model: tokenizer.json when the directory has
# one, else sentencepiece.bpe.model with fairseq's ids laid over it (each its own way, as
# transformers' XLMRobertaTokenizer / CamembertTokenizer do); fairseq's special tokens and pairs.
XLMR_JSON = TokenizerLayout("fairseq_spm", ("sentencepiece.bpe.model",), "XLMRobertaTokenizer", _FAIRSEQ_SPECIALS,
                            extra="xlm-roberta")
CAMEMBERT_JSON = TokenizerLayout("fairseq_spm", ("sentencepiece.bpe.model",), "CamembertTokenizer",
                                 _FAIRSEQ_SPECIALS, extra="xlm-roberta")
# MPNet's WordPiece with fairseq's markers (`<s> A </s></s> B </s>`) and BERT's unknown token.
MPNET_JSON = TokenizerLayout("json", ("tokenizer.json",), "MPNetTokenizer", {**_FAIRSEQ_SPECIALS, "unk_token": "[UNK]"})
# DeBERTa-v2/v3's SentencePiece Unigram model (spm.model; v3 ships no tokenizer.json), BERT's markers.
DEBERTA_SPM = TokenizerLayout("deberta_spm", ("spm.model",), "DebertaV2Tokenizer", {}, extra="deberta")

# ------------------------------------------------------------------------------------ LoRA targets
_BERT_LORA = {"query": (("qkv", 0),), "key": (("qkv", 1),), "value": (("qkv", 2),),
              "attention.output": (("attn_out", None),), "intermediate": (("ffn_in", None),),
              "output": (("ffn_out", None),)}
# PEFT matches a module's last name, and both of ModernBERT's Wo (attention and MLP) are called Wo.
# MPNet's projections are q, k, v and o inside attention.attn.
_MPNET_LORA = {"q": (("qkv", 0),), "k": (("qkv", 1),), "v": (("qkv", 2),), "o": (("attn_out", None),),
               "intermediate": (("ffn_in", None),), "output": (("ffn_out", None),)}
# DeBERTa's projections are query_proj, key_proj and value_proj inside attention.self.
_DEBERTA_LORA = {"query_proj": (("qkv", 0),), "key_proj": (("qkv", 1),), "value_proj": (("qkv", 2),),
                 "attention.output": (("attn_out", None),), "intermediate": (("ffn_in", None),),
                 "output": (("ffn_out", None),)}
_MODERN_LORA = {"Wqkv": (("qkv", None),), "Wo": (("attn_out", None), ("ffn_out", None)),
                "Wi": (("ffn_in", None),)}

# ------------------------------------------------------------------------------------ tensor names
_BERT_LAYER_PARTS = (("attn_out.", "attention.output.dense."), ("attn_norm.", "attention.output.LayerNorm."),
                     ("ffn_in.", "intermediate.dense."), ("ffn_out.", "output.dense."),
                     ("ffn_norm.", "output.LayerNorm."))
_BERT_QKV = ("attention.self.query", "attention.self.key", "attention.self.value")

# transformers' ModernBertConfig defaults (5.24), for keys a ModernBERT config.json leaves out.
_MODERNBERT_DEFAULTS = dict(
    vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
    hidden_act="gelu", max_position_embeddings=8192, initializer_range=0.02, layer_norm_eps=1e-5,
    pad_token_id=50283, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, embedding_dropout=0.0,
    local_attention=128, attention_bias=False, mlp_bias=False, norm_bias=False, decoder_bias=True,
    classifier_bias=False, classifier_activation="gelu", classifier_pooling="cls", classifier_dropout=0.0)

# BERT's record, and RoBERTa's: others are these with a few fields replaced.
_BERT = Family(
    "bert", "Bert", positions="absolute", segments=True, pooler=True, ignores_segment_ids=False,
    sequence_classifier="pooler", sentence_head="NSP", layers="bert", shares_layers=False,
    lora_targets=_BERT_LORA, tokenizer=WORDPIECE,
    names=NameMap(
        prefix="bert.", base_roots=("embeddings.", "encoder.", "pooler."), layer=r"encoder\.layer\.(\d+)\.",
        qkv=_BERT_QKV, layer_parts=_BERT_LAYER_PARTS,
        outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("pooler.", "pooler.dense."),
               ("mlm.transform.", "cls.predictions.transform.dense."),
               ("mlm.norm.", "cls.predictions.transform.LayerNorm."), ("mlm.bias", "cls.predictions.bias"),
               ("nsp.", "cls.seq_relationship.")),
        ignored=r"^cls\.predictions\.decoder\.(weight|bias)$",
        decoder_bias=("cls.predictions.bias", "cls.predictions.decoder.bias")))
_ROBERTA = Family(
    "roberta", "Roberta", positions="after_padding", segments=True, pooler=True, ignores_segment_ids=True,
    sequence_classifier="dense_tanh", sentence_head=None, layers="bert", shares_layers=False,
    lora_targets=_BERT_LORA, tokenizer=BPE, mlm_activation="gelu",
    names=NameMap(
        prefix="roberta.", base_roots=("embeddings.", "encoder.", "pooler."), layer=r"encoder\.layer\.(\d+)\.",
        qkv=_BERT_QKV, layer_parts=_BERT_LAYER_PARTS,
        outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("pooler.", "pooler.dense."),
               ("mlm.transform.", "lm_head.dense."), ("mlm.norm.", "lm_head.layer_norm."),
               ("mlm.bias", "lm_head.bias")),
        ignored=r"^lm_head\.decoder\.(weight|bias)$",
        decoder_bias=("lm_head.bias", "lm_head.decoder.bias")))
# What the configs of RoBERTa's SentencePiece descendants leave out is their transformers config's
# default: padding is id 1, as fairseq's dictionary numbers it.
_FAIRSEQ_DEFAULTS = {"pad_token_id": 1}

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _BERT,
    # ERNIE (Sun et al. 2019; Baidu's ERNIE 3.0 and its Chinese bases) is BERT with a task-type
    # embedding, under `ernie.`.
    replace(_BERT, model_type="ernie", class_prefix="Ernie", task_types=True,
            names=replace(_BERT.names, prefix="ernie.")),
    _ROBERTA,
    # XLM-RoBERTa (Conneau et al. 2020) and CamemBERT (Martin et al. 2020) are RoBERTa trained on
    # a SentencePiece vocabulary: the same layers and tensor names under their own class names.
    replace(_ROBERTA, model_type="xlm-roberta", class_prefix="XLMRoberta", tokenizer=XLMR_JSON,
            defaults=_FAIRSEQ_DEFAULTS),
    replace(_ROBERTA, model_type="camembert", class_prefix="Camembert", tokenizer=CAMEMBERT_JSON,
            defaults=_FAIRSEQ_DEFAULTS),
    Family("albert", "Albert", positions="absolute", segments=True, pooler=True, ignores_segment_ids=False,
           sequence_classifier="pooler",
           sentence_head="SOP", layers="bert", shares_layers=True, lora_targets={}, tokenizer=UNIGRAM,
           names=NameMap(
               prefix="albert.", base_roots=("embeddings.", "encoder.", "pooler."),
               layer=r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)\.",
               qkv=("attention.query", "attention.key", "attention.value"),
               layer_parts=(("attn_out.", "attention.dense."), ("attn_norm.", "attention.LayerNorm."),
                            ("ffn_in.", "ffn."), ("ffn_out.", "ffn_output."),
                            ("ffn_norm.", "full_layer_layer_norm.")),
               outer=(("embeddings.norm.", "embeddings.LayerNorm."),
                      ("embed_proj.", "encoder.embedding_hidden_mapping_in."),
                      ("mlm.transform.", "predictions.dense."), ("mlm.norm.", "predictions.LayerNorm."),
                      ("mlm.bias", "predictions.bias"), ("nsp.", "sop_classifier.classifier.")),
               ignored=r"^predictions\.decoder\.(weight|bias)$",
               decoder_bias=("predictions.bias", "predictions.decoder.bias")),
           config_keys={"classifier_dropout_prob": "classifier_dropout"}, embedding_projection="always",
           defaults={"embedding_size": 128}),
    # ELECTRA (Clark et al. 2020): BERT's layers under `electra.`, embeddings of width embedding_size
    # projected where it is not hidden_size, no pooler; the discriminator (ElectraForPreTraining)
    # scores every token as replaced or not, the generator (ElectraForMaskedLM) is an MLM whose
    # head maps H back to E; its sequence classifier is dense → GELU → out_proj on the first token.
    Family("electra", "Electra", positions="absolute", segments=True, pooler=False, ignores_segment_ids=False,
           sequence_classifier="dense_gelu", sentence_head=None, layers="bert", shares_layers=False,
           lora_targets=_BERT_LORA, tokenizer=WORDPIECE, mlm_activation="gelu", embedding_projection="if_differs",
           head_kinds={"ForPreTraining": "ForReplacedTokenDetection"},
           names=NameMap(
               prefix="electra.", base_roots=("embeddings.", "embeddings_project.", "encoder."),
               layer=r"encoder\.layer\.(\d+)\.", qkv=_BERT_QKV, layer_parts=_BERT_LAYER_PARTS,
               outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("embed_proj.", "embeddings_project."),
                      ("mlm.transform.", "generator_predictions.dense."),
                      ("mlm.norm.", "generator_predictions.LayerNorm."), ("mlm.bias", "generator_lm_head.bias")),
               ignored=r"^generator_lm_head\.weight$"),
           # transformers' ElectraConfig defaults where they are not BERT's (ELECTRA-small's generator).
           defaults={"embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}),
    # MPNet (Song et al. 2020): BERT's post-LN layers under `mpnet.` with q, k, v, o names, learned
    # positions numbered as RoBERTa's, no segments, and a relative-position bias (32 buckets by
    # default) shared by every layer's attention; RoBERTa's MLM and classification heads.
    Family("mpnet", "MPNet", positions="after_padding", segments=False, pooler=True, ignores_segment_ids=False,
           sequence_classifier="dense_tanh", sentence_head=None, layers="bert", shares_layers=False,
           lora_targets=_MPNET_LORA, tokenizer=MPNET_JSON, mlm_activation="gelu", relative_attention="bucketed",
           names=NameMap(
               prefix="mpnet.", base_roots=("embeddings.", "encoder.", "pooler."), layer=r"encoder\.layer\.(\d+)\.",
               qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
               layer_parts=(("attn_out.", "attention.attn.o."), ("attn_norm.", "attention.LayerNorm."),
                            ("ffn_in.", "intermediate.dense."), ("ffn_out.", "output.dense."),
                            ("ffn_norm.", "output.LayerNorm.")),
               outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("pooler.", "pooler.dense."),
                      ("relative_bias.", "encoder.relative_attention_bias."),
                      ("mlm.transform.", "lm_head.dense."), ("mlm.norm.", "lm_head.layer_norm."),
                      ("mlm.bias", "lm_head.bias")),
               ignored=r"^lm_head\.decoder\.(weight|bias)$",
               decoder_bias=("lm_head.bias", "lm_head.decoder.bias")),
           # No segment table; transformers' MPNetConfig defaults where they are not BERT's.
           fixed_fields={"type_vocab_size": 1},
           defaults={"vocab_size": 30527, "pad_token_id": 1, "relative_attention_num_buckets": 32}),
    # DeBERTa-v2, DeBERTa-v3 and mDeBERTa-v3 (He et al. 2021, 2023): BERT's post-LN layers under
    # `deberta.` with disentangled attention (relative embeddings shared by the layers, log buckets),
    # absolute positions and segments only where the config asks, v2's convolution after the first
    # layer; a context pooler at the sequence classifier; BERT's MLM head (`cls.predictions`) or
    # the same head as `lm_predictions.lm_head` (`legacy` false, and the released v3 files).
    Family("deberta-v2", "DebertaV2", positions="absolute", segments=True, pooler=False, ignores_segment_ids=False,
           sequence_classifier="context_pooler", sentence_head=None, layers="disentangled", shares_layers=False,
           lora_targets=_DEBERTA_LORA, tokenizer=DEBERTA_SPM, embedding_projection="before_norm",
           relative_attention="disentangled",
           names=NameMap(
               prefix="deberta.", base_roots=("embeddings.", "encoder."), layer=r"encoder\.layer\.(\d+)\.",
               qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
               layer_parts=(("disentangled.pos_key_proj.", "attention.self.pos_key_proj."),
                            ("disentangled.pos_query_proj.", "attention.self.pos_query_proj."), *_BERT_LAYER_PARTS),
               outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("relative_bias.norm.", "encoder.LayerNorm."),
                      ("relative_bias.embeddings.", "encoder.rel_embeddings."),
                      ("layers.0.conv.norm.", "encoder.conv.LayerNorm."), ("layers.0.conv.", "encoder.conv."),
                      ("context_pooler.", "pooler."),
                      ("mlm.transform.", "cls.predictions.transform.dense."),
                      ("mlm.norm.", "cls.predictions.transform.LayerNorm."), ("mlm.bias", "cls.predictions.bias"),
                      ("mlm.transform.", "lm_predictions.lm_head.dense."),
                      ("mlm.norm.", "lm_predictions.lm_head.LayerNorm."), ("mlm.bias", "lm_predictions.lm_head.bias")),
               # the tied decoder, and v3's replaced-token head that transformers does not load either
               ignored=r"^cls\.predictions\.decoder\.(weight|bias)$|^mask_predictions\.",
               decoder_bias=("cls.predictions.bias", "cls.predictions.decoder.bias"),
               unlegacy_mlm=(("mlm.transform.", "lm_predictions.lm_head.dense."),
                             ("mlm.norm.", "lm_predictions.lm_head.LayerNorm."),
                             ("mlm.bias", "lm_predictions.lm_head.bias"))),
           config_keys={"cls_dropout": "classifier_dropout"},
           # transformers' DebertaV2Config defaults where they are not BERT's (DeBERTa-v2-xlarge's sizes).
           defaults={"vocab_size": 128100, "hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 24,
                     "intermediate_size": 6144, "type_vocab_size": 0, "layer_norm_eps": 1e-7}),
    Family("distilbert", "DistilBert", positions="absolute", segments=False, pooler=False, ignores_segment_ids=False,
           sequence_classifier="pre_classifier", sentence_head=None, layers="bert", shares_layers=False,
           lora_targets=_BERT_LORA, tokenizer=WORDPIECE,
           names=NameMap(
               prefix="distilbert.", base_roots=("embeddings.", "transformer."), layer=r"transformer\.layer\.(\d+)\.",
               qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
               layer_parts=(("attn_out.", "attention.out_lin."), ("attn_norm.", "sa_layer_norm."),
                            ("ffn_in.", "ffn.lin1."), ("ffn_out.", "ffn.lin2."),
                            ("ffn_norm.", "output_layer_norm.")),
               outer=(("embeddings.norm.", "embeddings.LayerNorm."), ("mlm.transform.", "vocab_transform."),
                      ("mlm.norm.", "vocab_layer_norm."), ("mlm.bias", "vocab_projector.bias")),
               ignored=r"^vocab_projector\.weight$"),
           config_keys={"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
                        "hidden_dim": "intermediate_size", "activation": "hidden_act",
                        "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
                        "seq_classif_dropout": "classifier_dropout"},
           fixed_fields={"type_vocab_size": 1, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute"}),
    Family("modernbert", "ModernBert", positions="rotary", segments=False, pooler=False, ignores_segment_ids=False,
           sequence_classifier="prediction_head", sentence_head=None, layers="modern", shares_layers=False,
           lora_targets=_MODERN_LORA, tokenizer=TOKENIZER_JSON, mlm_probability=0.30,
           names=NameMap(
               prefix="model.", base_roots=("embeddings.", "layers.", "final_norm."), layer=r"layers\.(\d+)\.",
               qkv=(), layer_parts=(("qkv.", "attn.Wqkv."), ("attn_out.", "attn.Wo."), ("attn_norm.", "attn_norm."),
                                    ("ffn_in.", "mlp.Wi."), ("ffn_out.", "mlp.Wo."), ("ffn_norm.", "mlp_norm.")),
               outer=(("embeddings.word_embeddings.", "embeddings.tok_embeddings."),
                      ("mlm.transform.", "head.dense."), ("mlm.norm.", "head.norm."), ("mlm.bias", "decoder.bias"),
                      ("qa_outputs.", "classifier.")),
               ignored=r"^decoder\.weight$",
               aliases=(("mlm.transform.", "head.dense."), ("mlm.norm.", "head.norm."),
                        ("qa_outputs.", "classifier."))),
           # Its mlp_dropout is the dropout inside the feed-forward, where BERT's hidden_dropout_prob
           # acts on the sub-layer outputs.
           config_keys={"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps",
                        "attention_dropout": "attention_probs_dropout_prob", "mlp_dropout": "hidden_dropout_prob"},
           # No segments, no learned positions.
           fixed_fields={"type_vocab_size": 1, "position_embedding_type": "absolute"},
           defaults=_MODERNBERT_DEFAULTS),
)}


def family_of(model_type: str) -> Family:
    """The record of config.json's `model_type`; ValueError naming it when bertkit has none."""
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise ValueError(f"model_type {model_type!r} is not in the BERT family bertkit implements "
                         f"({', '.join(FAMILIES)}); convert the checkpoint to one of them") from None


def family_storing(kind: str) -> Family:
    """The family whose checkpoints store the head `kind` under another name (`head_kinds`), e.g.
    the replaced-token detector that ELECTRA saves as …ForPreTraining."""
    found = [family for family in FAMILIES.values() if kind in family.head_kinds.values()]
    if len(found) != 1:
        raise ValueError(f"{len(found)} families store a {kind} head; expected exactly one")
    return found[0]


def tokenizer_layout(tokenizer_class: str | None, model_type: str | None) -> TokenizerLayout:
    """The tokenizer files and defaults of a directory's family: by tokenizer_config.json's
    tokenizer_class (RobertaTokenizerFast…) where a family's tokenizer has its own special tokens,
    else by config.json's model_type, else BERT's WordPiece (DistilBERT's tokenizer is BERT's)."""
    name = str(tokenizer_class or "").lower()
    for family in FAMILIES.values():
        if family.tokenizer.specials and name.startswith(family.class_prefix.lower()):
            return family.tokenizer
    return FAMILIES[model_type].tokenizer if model_type in FAMILIES else WORDPIECE


__all__ = ["BPE", "CAMEMBERT_JSON", "DEBERTA_SPM", "EMBEDDING_PROJECTIONS", "FAMILIES", "Family", "LAYERS",
           "MPNET_JSON", "NameMap", "POSITIONS", "RELATIVE_ATTENTIONS", "SEQUENCE_CLASSIFIERS", "TOKENIZER_JSON",
           "TokenizerLayout", "UNIGRAM", "WORDPIECE", "XLMR_JSON", "family_of", "tokenizer_layout"]
