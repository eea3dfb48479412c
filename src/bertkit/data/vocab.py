"""A new WordPiece vocabulary from a corpus: the first step of pre-training on your own text.

`train_tokenizer` reads a corpus (files, directories, globs or a built-in one: `data.corpus`) and
learns BERT's WordPiece vocabulary with the `tokenizers` library's trainer, then saves a tokenizer
directory that `BertTokenizer.from_pretrained` and transformers' BertTokenizerFast load alike.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from bertkit.data.corpus import Corpus, as_corpus
from bertkit.data.tokenizer import TOKENIZER_FILES, BertTokenizer
from bertkit.data.tokenizer_backends import (
    CLS,
    MAX_INPUT_CHARS_PER_WORD,
    SEP,
    SPECIAL_TOKENS,
    UNK,
    configure_bert_pipeline,
    set_bert_post_processor,
)
from bertkit.util.fileio import check_writable_output

logger = logging.getLogger(__name__)


def train_tokenizer(corpus: Corpus | str | os.PathLike | Sequence[str | os.PathLike],
                    vocab_size: int, out_dir: str | os.PathLike, *, lowercase: bool = True,
                    strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                    min_frequency: int = 2, limit_alphabet: int | None = None,
                    model_max_length: int = 512, overwrite: bool = False,
                    corpus_format: str = "auto", text_field: str = "text",
                    show_progress: bool = False) -> BertTokenizer:
    """Learn a WordPiece vocabulary of `vocab_size` tokens and save the tokenizer to out_dir.

    corpus: a `Corpus` (use `Corpus.from_texts(...)` for in-memory strings) or corpus source(s) as
    accepted by `bertkit.data.corpus.load_corpus` (files, directories, globs, "builtin:NAME"),
    read with corpus_format and text_field.
    The vocabulary starts with [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then the alphabet and the
    learned pieces. Every character seen becomes a token unless limit_alphabet caps them, so a CJK
    corpus may need vocab_size above its character count. Refuses to replace the tokenizer files of
    an existing directory unless overwrite=True.
    Not reproducible to the token: the trainer breaks ties between equally frequent merges in
    hash-map order, which changes between processes (huggingface/tokenizers#1794); a few rare
    pieces and the order of ids differ from run to run.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size {vocab_size} is too small; it must exceed the "
                         f"{len(SPECIAL_TOKENS)} special tokens (BERT uses ~30k)")
    # Before reading the corpus: a bad --out must fail in a second, not after the training.
    out = check_writable_output(out_dir, overwrite=overwrite, kind="dir", outputs=TOKENIZER_FILES)
    corpus = as_corpus(corpus, format=corpus_format, text_field=text_field)
    backend = Tokenizer(WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    configure_bert_pipeline(backend, lowercase=lowercase, strip_accents=strip_accents,
                            tokenize_chinese_chars=tokenize_chinese_chars)
    options = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                               special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
                               show_progress=show_progress, **options)
    backend.train_from_iterator(corpus.iter_sentences(), trainer=trainer,
                                length=corpus.num_sentences)
    set_bert_post_processor(backend, CLS, SEP)
    tokenizer = BertTokenizer(backend, model_max_length=model_max_length)
    if tokenizer.vocab_size < vocab_size:
        logger.warning("the corpus yields %d tokens, fewer than vocab_size %d (every word or "
                       "character is already a token)", tokenizer.vocab_size, vocab_size)
    tokenizer.save_pretrained(out)
    return tokenizer
