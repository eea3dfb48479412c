"""ModernBERT checkpoints made by transformers, with a byte-level BPE tokenizer.json trained here.

`make_modernbert(out_dir, kind)` writes what a user downloads from a ModernBERT repository:
config.json (transformers 5's format), model.safetensors, tokenizer.json (byte-level BPE with
[CLS] … [SEP] templates and an lstrip [MASK], as answerdotai/ModernBERT-base's) and
tokenizer_config.json. Random weights, tiny sizes, a 16-token window; nothing downloads.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from family_fixtures import CORPUS

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def bpe_tokenizer(work: Path):
    """A ModernBERT-style tokenizer (transformers' PreTrainedTokenizerFast) trained on CORPUS."""
    import transformers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(str(work / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(work / "tokenizer.json"), unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=8192,
        model_input_names=["input_ids", "attention_mask"])


def hf_config(tokenizer, **extra):
    import transformers

    values = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                  intermediate_size=37, local_attention=16, max_position_embeddings=8192,
                  initializer_range=0.2, pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
                  bos_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                  eos_token_id=tokenizer.sep_token_id)
    values.update(extra)
    return transformers.ModernBertConfig(**values)


def make_modernbert(out_dir: str | Path, kind: str = "ForMaskedLM", seed: int = 0, **extra) -> Path:
    """A transformers ModernBert<kind> with random weights and its tokenizer, saved to out_dir."""
    import transformers

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = bpe_tokenizer(Path(work))
    torch.manual_seed(seed)
    model = getattr(transformers, "ModernBert" + kind)(hf_config(tokenizer, **extra)).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":  # python tests/modern_fixtures.py OUT_DIR [KIND]
    import sys

    print(make_modernbert(sys.argv[1], *(sys.argv[2:3] or ["ForMaskedLM"])))
