"""Pre-training, corpus to curves: tokenizer train, prepare, mask-demo, pretrain, plot, and the
quickstart demo that runs them all."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertkit.cli.common import add_loop_arguments, add_run_arguments, add_training_engine_arguments, config_settings


def add(sub: argparse._SubParsersAction) -> None:
    for add_command in (_add_pretrain, _add_plot, _add_quickstart, _add_tokenizer, _add_prepare,
                        _add_mask_demo):
        add_command(sub)


# ---------------------------------------------------------------------------------------------
# tokenizer train, prepare, mask-demo: the data
# ---------------------------------------------------------------------------------------------
def _add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """--corpus / --format / --text-field, shared by the commands that read raw text."""
    p.add_argument("--corpus", required=True, nargs="+", metavar="SOURCE",
                   help="files, directories, globs or builtin:NAME (peoples-daily, zh-reviews, "
                   "bbc-news, zh)")
    p.add_argument("--format", choices=["auto", "lines", "paragraphs", "jsonl"], default="auto",
                   help="corpus file format (auto: jsonl by suffix, else one sentence per line)")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text")


def _add_tokenizer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools (train a WordPiece vocabulary)")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="learn a WordPiece vocabulary from a corpus",
                        description="Learn a BERT WordPiece vocabulary ([PAD]=0 [UNK] [CLS] [SEP] "
                        "[MASK], then the alphabet and learned pieces) and write vocab.txt, "
                        "tokenizer.json and tokenizer_config.json to OUT.")
    _add_corpus_arguments(t)
    t.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary")
    t.add_argument("--out", required=True, help="directory for the tokenizer files")
    t.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                   help="lowercase (and strip accents) before tokenizing (default: yes)")
    t.add_argument("--min-frequency", type=int, default=2, help="least count of a learned piece")
    t.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in OUT")
    t.set_defaults(func=_run_tokenizer_train)


def _run_tokenizer_train(args: argparse.Namespace) -> None:
    from bertkit.data.vocab import train_tokenizer

    tokenizer = train_tokenizer(args.corpus, args.vocab_size, args.out, lowercase=args.lowercase,
                                min_frequency=args.min_frequency, overwrite=args.overwrite,
                                corpus_format=args.format, text_field=args.text_field,
                                show_progress=True)
    print(f"{args.out}: {tokenizer.vocab_size} tokens, fingerprint {tokenizer.fingerprint()}")


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="tokenize a corpus into pre-training shards (DATA_DIR)",
                       description="Tokenize a corpus once and write pre-training instances "
                       "(NSP pairs, or packed sentences with --no-nsp) as memory-mapped shards, "
                       "with meta.json and a copy of the tokenizer, for `bertkit pretrain`.")
    _add_corpus_arguments(p)
    p.add_argument("--tokenizer", required=True, help="tokenizer or model directory")
    p.add_argument("--out", required=True, help="DATA_DIR to create")
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens per instance (128)")
    p.add_argument("--no-nsp", action="store_false", dest="nsp",
                   help="no next-sentence pairs: pack full sentences across documents (RoBERTa)")
    p.add_argument("--objective", choices=["mlm", "mlm+nsp", "mlm+sop"], default=None,
                   help="instances for: mlm (packed full sentences, = --no-nsp), mlm+nsp (BERT's "
                        "pairs, the default) or mlm+sop (ALBERT's consecutive pairs, swapped half "
                        "the time)")
    p.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="share of NSP chunks aiming at a random shorter length (0.1)")
    p.add_argument("--whole-word-mask", action="store_true",
                   help="mask whole words (WordPiece ## groups; jieba words for Chinese)")
    p.add_argument("--static-masking", action="store_true",
                   help="fix the masks now (default: new masks every epoch)")
    p.add_argument("--dupe-factor", type=int, default=1,
                   help="passes over the corpus with different pairs / static masks (1)")
    p.add_argument("--mlm-probability", type=float, default=0.15,
                   help="share of tokens predicted, for static masks (0.15)")
    p.add_argument("--max-predictions", type=int, default=None, dest="max_predictions_per_seq",
                   help="cap on predictions per sequence (default round(max_seq_len × rate))")
    p.add_argument("--eval-fraction", type=float, default=0.01,
                   help="share of documents held out for evaluation (0.01)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes for Chinese word segmentation (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace data already in DATA_DIR")
    p.set_defaults(func=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> None:
    from bertkit.data.prepare import PrepareConfig, run_prepare

    config = PrepareConfig(corpus=args.corpus, tokenizer_dir=args.tokenizer, out_dir=args.out,
                           max_seq_len=args.max_seq_len, nsp=args.nsp, objective=args.objective,
                           short_seq_prob=args.short_seq_prob, whole_word_mask=args.whole_word_mask,
                           static_masking=args.static_masking, dupe_factor=args.dupe_factor,
                           mlm_probability=args.mlm_probability,
                           max_predictions_per_seq=args.max_predictions_per_seq,
                           eval_fraction=args.eval_fraction, seed=args.seed, workers=args.workers,
                           overwrite=args.overwrite, corpus_format=args.format, text_field=args.text_field)
    stats = run_prepare(config)
    print(stats.summary())


def _add_mask_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mask-demo", help="show how pre-training masks a text",
                       description="Mask one text as pre-training does and show, per selected "
                       "position, whether it became [MASK], a random token or stayed unchanged. "
                       "Without --tokenizer: text with CJK characters uses a vocabulary of its own "
                       "characters/words, other text the all-MiniLM-L6-v2 vocabulary.")
    p.add_argument("text")
    p.add_argument("--tokenizer", default=None, help="tokenizer or model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--whole-word-mask", action="store_true",
                   help="mask whole words (WordPiece ## groups; jieba words for Chinese)")
    p.add_argument("--mlm-probability", type=float, default=0.15, help="share selected (0.15)")
    p.set_defaults(func=_run_mask_demo)


def _run_mask_demo(args: argparse.Namespace) -> None:
    from bertkit.data.masking import mask_demo

    print(mask_demo(args.text, args.tokenizer, seed=args.seed,
                    whole_word_mask=args.whole_word_mask,
                    mlm_probability=args.mlm_probability).format())


# ---------------------------------------------------------------------------------------------
# pretrain and plot: the training and its curves
# ---------------------------------------------------------------------------------------------
def _add_pretrain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pre-train a BERT (MLM + NSP) on data made by `prepare`",
                       description="Pre-train a BERT on prepared data. Options left out take the "
                       "defaults of bertkit.train.pretrain.PretrainConfig; the full settings are "
                       "written to RUN_DIR/pretrain_config.json. Runs under torchrun as it is.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--data", required=True, help="DATA_DIR made by `bertkit prepare`")
    p.add_argument("--out", required=True, help="RUN_DIR for checkpoints, metrics and the model")
    p.add_argument("--model", help="preset (tiny mini small medium base large albert-base modern-tiny "
                   "modern-mini; default mini), config.json or model directory; vocab_size comes from the data")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE", dest="model_args",
                   help="override a config.json field, e.g. hidden_dropout_prob=0 (repeatable)")
    p.add_argument("--init", help="continue from this Hugging Face BERT directory's weights")
    p.add_argument("--objective", choices=["mlm", "mlm+nsp", "mlm+sop", "rtd"],
                   help="what to train (default: what the data were prepared for); mlm on pair "
                        "data ignores the pair labels; rtd: ELECTRA's replaced-token detection "
                        "(a generator and a discriminator, the model kept)")
    p.add_argument("--generator-size", type=float,
                   help="rtd: the generator's width against the discriminator's (0.25)")
    p.add_argument("--rtd-weight", type=float, help="rtd: weight of the discriminator's loss (50)")
    add_loop_arguments(p, epochs_type=float, max_steps="optimizer steps (or give --epochs)",
                       epochs="passes over the data (default 1)",
                       batch_size="sequences per optimizer step, all processes (128)",
                       grad_accum="micro-batches per step (1)", lr="peak learning rate (5e-4)",
                       weight_decay="AdamW weight decay, not on biases/LayerNorm (0.01)",
                       schedule="decay after warmup", warmup_steps="linear warmup steps (6%% of the steps)",
                       max_grad_norm="gradient clipping norm (1.0)")
    p.add_argument("--mlm-probability", type=float,
                   help="share of tokens selected for MLM (0.15; 0.30 for ModernBERT models)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the encoder layers (on CPU no faster than eager)")
    add_training_engine_arguments(p, explain_precision=True)
    p.add_argument("--num-workers", type=int,
                   help="DataLoader worker processes (default: 1 on CUDA or when a CPU core is "
                        "left over by torch's threads, else 0)")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int, help="steps between metrics.jsonl lines (10)")
    p.add_argument("--eval-every", type=int, help="steps between held-out evaluations (10 × log)")
    p.add_argument("--eval-batches", type=int, help="held-out batches per evaluation (20)")
    p.add_argument("--save-every", type=int, help="steps between checkpoints (1000)")
    p.add_argument("--keep", type=int, help="checkpoints kept (2)")
    p.add_argument("--max-bad-steps", type=int, help="non-finite steps in a row before stopping (10)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop cleanly with a checkpoint after this much training; --resume continues")
    add_run_arguments(p, resume="continue RUN_DIR from its last checkpoint",
                      overwrite="start over in an existing RUN_DIR")
    p.set_defaults(func=_run_pretrain)


def _run_pretrain(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.pretrain import Interrupted, PretrainConfig, TrainingDiverged, pretrain

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = config_settings(args, "model_args")
    overrides = {}
    for item in getattr(args, "model_args", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--model-arg {item!r} is not KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string such as gelu_new
    if overrides:
        settings["model_overrides"] = overrides
    try:
        summary = pretrain(PretrainConfig(**settings))
    except TrainingDiverged as err:
        raise SystemExit(f"bertkit pretrain: stopped: {err}") from None
    except Interrupted as err:
        print(f"bertkit pretrain: {err}", file=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    print(pretrain_summary_line(summary))
    print(json.dumps(summary))


def pretrain_summary_line(summary: dict) -> str:
    """The human line before the JSON: where the model is, how far it got, the held-out score."""
    line = (f"model saved in {summary['model_dir']} after {summary['steps']:,} of "
            f"{summary['total_steps']:,} steps")
    held_out = summary.get("eval") or {}
    if held_out.get("mlm_accuracy") is not None:
        line += f"; held-out MLM accuracy {held_out['mlm_accuracy']:.3f}, loss {held_out['loss']:.3f}"
    if held_out.get("rtd_accuracy") is not None:
        line += f", replaced-token accuracy {held_out['rtd_accuracy']:.3f}"
    if summary.get("stopped") == "time_limit":
        line += "; stopped at --time-limit: continue with --resume"
    return line


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw loss / accuracy / lr curves of a run into RUN_DIR/curves.png")
    p.add_argument("run_dir", help="RUN_DIR of `bertkit pretrain`, or OUT of `bertkit finetune`")
    p.add_argument("--out", default=None, help="image path (default RUN_DIR/curves.png, redrawn each time)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out image")
    p.set_defaults(func=_run_plot)


def _run_plot(args: argparse.Namespace) -> None:
    from bertkit.plot import plot_run

    try:
        print(plot_run(args.run_dir, args.out, overwrite=args.overwrite))
    except ImportError as err:
        raise SystemExit(f"bertkit plot: error: {err}") from None


# ---------------------------------------------------------------------------------------------
# quickstart: the demo
# ---------------------------------------------------------------------------------------------
def _add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="the demo: corpus → vocabulary → pre-training → fill-mask "
                       "(≈10 minutes on 2 CPU cores)")
    p.add_argument("--lang", choices=["zh", "en"], default="zh",
                   help="zh: People's Daily 1998 (default); en: BBC News")
    p.add_argument("--out", default="runs/quickstart", help="run directory (default runs/quickstart)")
    p.add_argument("--steps", type=int, default=None, help="pre-training steps (default: sized to fit)")
    p.add_argument("--overwrite", action="store_true", help="start over if --out holds another run")
    p.set_defaults(func=_run_quickstart)


def _run_quickstart(args: argparse.Namespace) -> None:
    import logging

    from bertkit.quickstart import QuickstartConfig, quickstart
    from bertkit.train.pretrain import Interrupted

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    try:
        result = quickstart(QuickstartConfig(lang=args.lang, out=args.out, steps=args.steps,
                                             overwrite=args.overwrite))
    except Interrupted as err:
        print(f"bertkit quickstart: {err}; run the same command again to continue", file=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    print(json.dumps(result, ensure_ascii=False))
