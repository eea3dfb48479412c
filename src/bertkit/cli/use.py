"""The uses of a model through one inference engine: embed, fill-mask, classify, ner, qa, rerank.

Each takes texts on the command line (results printed) or --input FILE --out FILE (a file job).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from bertkit.cli.common import (
    BATCH_TOKENS_HELP,
    add_adapter_arguments,
    add_engine_arguments,
    add_pooling_argument,
    add_run_arguments,
    engine_options,
    print_file_job,
    print_json,
)

# What --input-format names (records.FORMATS but squad, which only predict reads); kept here so
# that building the parser imports nothing heavy.
INPUT_FORMATS = ("auto", "txt", "jsonl", "csv", "tsv", "conll")


def add(sub: argparse._SubParsersAction) -> None:
    for add_use in (_add_fill_mask, _add_embed, _add_classify, _add_ner, _add_qa, _add_rerank):
        add_use(sub)


def _add_use(sub: argparse._SubParsersAction, name: str, help: str, model_help: str,
             texts: bool = True, adapter: bool = True) -> argparse.ArgumentParser:
    """A use's parser with what every use shares: the model, texts or --input/--out, the engine."""
    p = sub.add_parser(name, help=help, description=help + ". Texts on the command line print "
                       "results; --input FILE (txt: a text a line; jsonl; csv/tsv with a header) "
                       "--out FILE streams a file of any size (bad rows named and skipped; "
                       "--resume continues a killed run; under torchrun the ranks split the input).")
    p.add_argument("model", help=model_help + (", a LoRA adapter dir (its base from adapter_config.json), "
                                               "or the base model of --adapter" if adapter else ""))
    if adapter:
        add_adapter_arguments(p, "a LoRA adapter dir (PEFT's files: `finetune --lora ... --lora-save adapters`, "
                              "or peft's) run over MODEL, its base, with the adapter's own head and labels")
    if texts:
        p.add_argument("texts", nargs="*", help="texts (or give --input)")
    p.add_argument("--input", help="input file (.txt, .jsonl, .csv, .tsv)")
    p.add_argument("--out", help="output file for --input: .jsonl (or .npy for embed)")
    p.add_argument("--input-format", choices=INPUT_FORMATS, default="auto",
                   help="the --input file's format (default: by its suffix)")
    p.add_argument("--text-field", default="text", help="jsonl key / csv column of the text (text)")
    add_run_arguments(p, resume="continue a killed --input run", overwrite="replace an existing --out")
    add_engine_arguments(p, explain_precision=True, max_batch_tokens_help=BATCH_TOKENS_HELP,
                         max_length_help="tokens per input (default: the model's limit)", truncate=True,
                         calibration=True)
    p.add_argument("--json", action="store_true", help="print one JSON object per text")
    return p


def _engine(args: argparse.Namespace, use: str):
    """The engine of MODEL for `use`: a model directory, or a LoRA adapter over its base (MODEL an
    adapter dir, or --adapter DIR over MODEL), whose own use must fit `use`."""
    from bertkit.adapters import is_adapter_dir, open_engine, resolve

    options = engine_options(args)
    adapter, base = getattr(args, "adapter", None), getattr(args, "base", None)
    if use == "fill-mask" and is_adapter_dir(args.model):
        raise ValueError(f"{args.model} is a LoRA adapter directory; adapters classify, tag, answer, rerank or "
                         "embed, and fill-mask needs a model with a masked-LM head")
    _, adapter_dir = resolve(args.model, adapter, base)
    engine = open_engine(args.model, adapter=adapter, base=base, use=use, **options)
    if adapter_dir is None:
        return engine
    fits = engine.use == use or use == "embed" or {engine.use, use} == {"classify", "rerank"}
    if not fits:
        given = f"{args.model} --adapter {adapter}" if adapter else str(args.model)
        raise ValueError(f"{adapter_dir} is a {engine.use} adapter; run it with `bertkit {engine.use} {given}`")
    return engine


def _whole_model(args: argparse.Namespace, flag: str) -> None:
    """A ValueError when MODEL is a LoRA adapter (or --adapter is given) for a flag that runs a
    whole model directory only."""
    from bertkit.adapters import is_adapter_dir

    if args.adapter is not None or is_adapter_dir(args.model):
        raise ValueError(f"{flag} runs a whole model directory, not a LoRA adapter; save the adapter merged "
                         "(finetune --lora-save merged) or leave out " + flag)


def _settings_dir(args: argparse.Namespace):
    """The directory whose sentence-transformers files (prompts) apply: the model's, or an
    adapter's base's; None when MODEL is neither (the engine's error says why)."""
    from bertkit.adapters import is_adapter_dir, resolve

    if getattr(args, "adapter", None) is None and not is_adapter_dir(args.model):
        return args.model if Path(args.model).is_dir() else None
    return resolve(args.model, args.adapter, args.base)[0]


def _prompt(args: argparse.Namespace, settings_dir) -> str | None:
    """The text put before every text: --prompt, or --prompt-name (else the default) among the
    prompts of the sentence-transformers files in `settings_dir` (none when it is not a directory)."""
    from bertkit.encoder.sentence_transformers import sentence_transformers_settings
    from bertkit.inference.embed import resolve_prompt

    has_files = settings_dir is not None and Path(settings_dir).is_dir()
    settings = sentence_transformers_settings(settings_dir) if has_files else {}
    return resolve_prompt(settings, args.prompt_name, args.prompt)


def _inputs(args: argparse.Namespace, *, need_texts: bool = True, kind: str | None = None) -> None:
    """Texts or --input/--out, not both; outputs checked before any model is loaded (for the
    command, and for `kind` too: embed --sparse and --output write rows of their own)."""
    from bertkit.util.fileio import check_writable_output

    texts = getattr(args, "texts", None)
    if args.input:
        if texts:
            raise ValueError("give texts on the command line or --input FILE, not both")
        if not args.out:
            raise ValueError("--input needs --out FILE (.jsonl, or .npy for embed)")
        if Path(args.input).is_dir():
            raise IsADirectoryError(f"--input {args.input} is a directory; pass a file (.txt, .jsonl, .csv, .tsv)")
        if not Path(args.input).is_file():
            raise FileNotFoundError(f"--input {args.input} does not exist; check the path")
        check_writable_output(args.out, overwrite=None if args.resume else args.overwrite)
        from bertkit.inference.jobs import output_kind

        output_kind(args.command, args.out)  # the commands are named as the uses
        if kind is not None:
            output_kind(kind, args.out)
    elif need_texts and not texts:
        raise ValueError(f"bertkit {args.command} needs texts or --input FILE --out FILE")
    elif args.out:
        raise ValueError("--out goes with --input FILE; texts on the command line print their results")


def _file_job(args: argparse.Namespace, use: str, engine, pair_field: str | None = None,
              **options) -> None:
    from bertkit.inference.jobs import run_use_on_file

    summary = run_use_on_file(use, engine, args.input, args.out, text_field=args.text_field,
                              pair_field=pair_field, resume=args.resume, overwrite=args.overwrite,
                              progress=args.progress, fmt=args.input_format, **options)
    print_file_job(summary, engine)


def _use_engine(args: argparse.Namespace, use: str, **file_options):
    """The engine for `use` over texts on the command line; None once `--input FILE` has been run
    through it into `--out` (file_options: the use's options for the file job)."""
    _inputs(args)
    engine = _engine(args, use)
    if not args.input:
        return engine
    _file_job(args, use, engine, **file_options)
    return None


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "embed", "sentence embeddings (and their cosine similarities)",
                 "model dir (any BERT checkpoint with tokenizer files)")
    add_pooling_argument(p)
    p.add_argument("--no-normalize", action="store_false", dest="normalize", default=None,
                   help="keep the raw pooled vectors (default: the model's setting, else unit length)")
    p.add_argument("--prompt-name", default=None,
                   help="one of the model's prompts (config_sentence_transformers.json) before every text "
                   "(default: its default_prompt_name)")
    p.add_argument("--prompt", default=None, help="your own text before every text")
    p.add_argument("--truncate-dim", type=int, default=None,
                   help="keep the first N dimensions (Matryoshka models), unit length again when normalized")
    p.add_argument("--sparse", action="store_true",
                   help="SPLADE sparse embeddings from the model's masked-LM head: {token: weight} per text "
                   "(--input: JSON Lines of vocabulary indices and values)")
    p.add_argument("--top-k", type=int, default=None,
                   help="with --sparse: keep each text's K largest weights (default: all non-zero)")
    p.add_argument("--output", default=None, metavar="NAMES",
                   help="BGE-M3's outputs from one forward pass, comma-separated: dense, sparse (lexical "
                   "weights), colbert (a vector per token); sparse and colbert need M3's head files "
                   "(--input: JSON Lines with those fields)")
    g = p.add_argument_group("passages (with --input)")
    g.add_argument("--passage-tokens", type=int, default=0,
                   help="cut each document into passages of at most N pieces (sentence-aware; N up to the "
                   "model's length − 2) and write one row per passage, its document's line, id, number, "
                   "passage number and character offsets beside it (OUT.passages.jsonl); 0: one row "
                   "per text, cut at the model's length (default)")
    g.add_argument("--passage-overlap", type=int, default=0, help="pieces shared by neighbouring passages (0)")
    g = p.add_argument_group("on a Ray cluster (with --input; needs `pip install 'bertkit[ray]'`)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="embed --input on Ray Data into --out DIR: Parquet shards of `line` and `embedding` "
                   "and a manifest; run again after a kill and only the missing shards are computed. "
                   "ADDRESS: the cluster's HOST:PORT (default: the cluster this machine runs, else a local one)")
    g.add_argument("--ray-actors", type=int, default=2, help="actors, each with its own engine (2)")
    g.add_argument("--ray-actor-cpus", type=int, default=1, help="each actor's num_cpus, hence its threads (1)")
    g.add_argument("--ray-chunk-size", type=int, default=10_000, help="input rows per shard (10,000)")
    p.set_defaults(func=_run_embed)


def _run_embed(args: argparse.Namespace) -> None:
    if args.output is not None:
        return _run_embed_m3(args)
    if args.sparse and args.ray is not None:
        raise ValueError("--ray writes dense embeddings; leave out --sparse (or --ray)")
    if args.sparse:
        return _run_embed_sparse(args)
    if args.top_k is not None:
        raise ValueError("--top-k goes with --sparse (dense embeddings keep every dimension; see --truncate-dim)")
    from bertkit.inference import embed
    from bertkit.inference.embed import resolve_pooling

    options = dict(pooling=args.pooling, normalize=args.normalize, truncate_dim=args.truncate_dim,
                   prompt=_prompt(args, _settings_dir(args)))
    if args.ray is not None:
        return _embed_on_ray(args, options)
    if args.passage_tokens or args.passage_overlap:
        return _embed_passages(args, options)
    engine = _use_engine(args, "embed", **options)
    if engine is None:
        return
    vectors = embed(engine, args.texts, **options)
    if args.json:
        return print_json({"text": t, "embedding": v} for t, v in zip(args.texts, vectors.tolist()))
    mode, unit = resolve_pooling(engine, args.pooling, args.normalize)
    n = len(args.texts)
    print(f"{n} embedding{'' if n == 1 else 's'} of size {vectors.shape[1]} ({mode} pooling"
          f"{', unit length' if unit else ''}); cosine similarity:")
    unit_vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    sims = unit_vectors @ unit_vectors.T
    for i, text in enumerate(args.texts):
        print("  " + " ".join(f"{float(s):6.3f}" for s in sims[i]) + f"  {text}")


def _embed_on_ray(args: argparse.Namespace, options: dict) -> None:
    """embed --input FILE --out DIR --ray [ADDRESS]: Parquet shards written by a pool of Ray actors."""
    from bertkit.ray.job import embed_on_ray, need_ray
    from bertkit.util.fileio import model_directory

    need_ray()
    _whole_model(args, "--ray")
    if args.texts or not args.input or not args.out:
        raise ValueError("--ray embeds a file: give --input FILE --out DIR, not texts on the command line")
    if args.passage_tokens or args.passage_overlap:
        raise ValueError("--ray writes one embedding per input row; leave out --passage-tokens / --passage-overlap")
    engine_settings = dict(precision=args.precision, max_batch_tokens=args.max_batch_tokens, device=args.device,
                           truncate=args.truncate, max_length=args.max_length)
    summary = embed_on_ray(model_directory(args.model), args.input, args.out, address=args.ray or None,
                           actors=args.ray_actors, actor_cpus=args.ray_actor_cpus, chunk_size=args.ray_chunk_size,
                           overwrite=args.overwrite, fmt=args.input_format, text_field=args.text_field,
                           engine_options=engine_settings, **options)
    state = ("already complete" if summary["already_complete"] else
             f"{summary['written']} written now, {summary['done_before']} done before")
    print(f"{summary['rows']:,} rows ({summary['skipped']:,} skipped) in {summary['shards']} Parquet shards of "
          f"line and embedding ({summary['dim']} floats) under {summary['out']} ({state}) in "
          f"{summary['seconds']:.1f} s")


def _run_embed_sparse(args: argparse.Namespace) -> None:
    """`embed --sparse`: each text's top terms, or a file job of {"indices", "values"} rows."""
    from bertkit.inference.sparse import decode, embed_sparse, sparse_engine

    dense_only = [flag for flag, given in (("--pooling", args.pooling), ("--no-normalize", args.normalize is False),
                                           ("--truncate-dim", args.truncate_dim),
                                           ("--passage-tokens", args.passage_tokens),
                                           ("--passage-overlap", args.passage_overlap)) if given]
    if dense_only:
        raise ValueError(f"{dense_only[0]} is for dense embeddings; --sparse weighs vocabulary terms "
                         "(--top-k keeps the largest)")
    _whole_model(args, "--sparse")
    _inputs(args, kind="embed-sparse")
    options = dict(top_k=args.top_k, prompt=_prompt(args, args.model))
    engine = sparse_engine(args.model, **engine_options(args))
    if args.input:
        return _file_job(args, "embed-sparse", engine, **options)
    rows = embed_sparse(engine, args.texts, **options)
    if args.json:
        return print_json({"text": t, "embedding": dict(decode(engine.tokenizer, ix, v))}
                          for t, (ix, v) in zip(args.texts, rows))
    shown = args.top_k or 10
    for text, (ix, v) in zip(args.texts, rows):
        terms = "  ".join(f"{t} {w:.2f}" for t, w in decode(engine.tokenizer, ix, v, shown))
        print(f"{text}\n  {len(ix)} terms; top {min(shown, len(ix))}: {terms}")


def _run_embed_m3(args: argparse.Namespace) -> None:
    """`embed --output dense,sparse,colbert`: BGE-M3's outputs per text, or a file job of them."""
    from bertkit.inference.m3 import check_outputs, encode_m3
    from bertkit.inference.sparse import decode

    others = [flag for flag, given in (("--sparse", args.sparse), ("--ray", args.ray is not None),
                                       ("--pooling", args.pooling), ("--no-normalize", args.normalize is False),
                                       ("--truncate-dim", args.truncate_dim), ("--top-k", args.top_k),
                                       ("--passage-tokens", args.passage_tokens),
                                       ("--passage-overlap", args.passage_overlap)) if given]
    if others:
        raise ValueError(f"{others[0]} does not go with --output (BGE-M3's dense vector is its unit [CLS] "
                         "state, its lexical weights every one above 0); leave it out")
    outputs = [name.strip() for name in args.output.split(",") if name.strip()]
    _inputs(args, kind="embed-m3")
    engine = _engine(args, "embed")
    outputs = list(check_outputs(engine, outputs))
    prompt = _prompt(args, args.model)
    if args.input:
        return _file_job(args, "embed-m3", engine, outputs=outputs, prompt=prompt)
    got = encode_m3(engine, args.texts, outputs, prompt=prompt)
    for i, text in enumerate(args.texts):
        sparse = decode(engine.tokenizer, *got["sparse"][i]) if "sparse" in got else None
        if args.json:
            print_json([{"text": text, **({"dense": got["dense"][i].tolist()} if "dense" in got else {}),
                         **({"sparse": dict(sparse)} if sparse is not None else {}),
                         **({"colbert": got["colbert"][i].tolist()} if "colbert" in got else {})}])
            continue
        print(text)
        if "dense" in got:
            print(f"  dense: {len(got['dense'][i])} floats, unit length: "
                  + " ".join(f"{v:.3f}" for v in got["dense"][i][:6].tolist()) + " ...")
        if sparse is not None:
            print(f"  sparse: {len(sparse)} terms: " + "  ".join(f"{t} {w:.3f}" for t, w in sparse[:10]))
        if "colbert" in got:
            tokens, dim = got["colbert"][i].shape
            print(f"  colbert: {tokens} vectors of {dim} floats (every token after the first), unit length")


def _embed_passages(args: argparse.Namespace, options: dict) -> None:
    """embed --input FILE --out OUT --passage-tokens N: one row per passage (retrieval.passage_files)."""
    if not args.input:
        raise ValueError("--passage-tokens / --passage-overlap go with --input FILE --out FILE (one row per "
                         "passage); texts on the command line are embedded whole")
    if not args.passage_tokens:
        raise ValueError("--passage-overlap needs --passage-tokens N")
    _inputs(args)
    from bertkit.retrieval.passage_files import embed_passages_file

    engine = _engine(args, "embed")
    summary = embed_passages_file(engine, args.input, args.out, passage_tokens=args.passage_tokens,
                                  passage_overlap=args.passage_overlap, text_field=args.text_field,
                                  fmt=args.input_format, resume=args.resume, overwrite=args.overwrite,
                                  progress=args.progress, **options)
    print(f"{summary['documents']:,} documents → {summary['rows']:,} passages of ≤ {args.passage_tokens} pieces "
          f"(their documents and offsets: {summary['passages_file']})")
    print_file_job(summary, engine)


def _add_fill_mask(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "fill-mask", "top-k candidates with probabilities for each [MASK]",
                 "model dir with an MLM head (ours or Hugging Face's) and tokenizer files", adapter=False)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--targets", nargs="+", default=None, help="score only these words")
    p.set_defaults(func=_run_fill_mask)


def _run_fill_mask(args: argparse.Namespace) -> None:
    from bertkit.inference import fill_mask

    engine = _use_engine(args, "fill-mask", top_k=args.top_k, targets=args.targets)
    if engine is None:
        return
    results = fill_mask(engine, args.texts, top_k=args.top_k, targets=args.targets)
    if args.json:
        from dataclasses import asdict

        return print_json({"text": text, "masks": [[asdict(c) for c in cands] for cands in masks]}
                          for text, masks in zip(args.texts, results))
    _print_under(args.texts, ([f"[MASK] {i + 1}: " + "  ".join(f"{c.token} {c.score:.3f}" for c in cands)
                               for i, cands in enumerate(masks)] for masks in results))


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "classify", "labels and scores of texts or text pairs",
                 "model dir with a sequence-classification head (e.g. made by `bertkit finetune`)")
    p.add_argument("--pair", nargs="+", default=None, help="second texts, one per text (pair models)")
    p.add_argument("--pair-field", default=None, help="with --input: the column of the second text")
    p.add_argument("--function", choices=["softmax", "sigmoid", "none"], default=None,
                   help="scores from logits (default: softmax; sigmoid for multi-label and 1-label heads)")
    p.set_defaults(func=_run_classify)


def _run_classify(args: argparse.Namespace) -> None:
    from bertkit.inference import classify

    engine = _use_engine(args, "classify", pair_field=args.pair_field, function=args.function)
    if engine is None:
        return
    rows = classify(engine, args.texts, args.pair, function=args.function)
    if args.json:
        return print_json({"text": t, **r} for t, r in zip(args.texts, rows))
    for text, row in zip(args.texts, rows):
        if "value" in row:
            print(f"{row['value']:8.4f}  {text}")
        else:
            print(f"{row['label']:>12} {row['score']:.3f}  {text}")


def _add_ner(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "ner", "named entities with character offsets",
                 "model dir with a token-classification head (e.g. made by `bertkit finetune --task ner`)")
    p.set_defaults(func=_run_ner)


def _run_ner(args: argparse.Namespace) -> None:
    from bertkit.inference import ner

    engine = _use_engine(args, "ner")
    if engine is None:
        return
    results = ner(engine, args.texts)
    if args.json:
        return print_json({"text": t, "entities": e} for t, e in zip(args.texts, results))
    _print_under(args.texts, ([f"{e['type']:>6} {e['start']:>4}-{e['end']:<4} {e['score']:.3f}  {e['text']}"
                               for e in entities] for entities in results), none="(no entities)")


def _add_qa(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "qa", "answer spans to questions about a context (windows past the limit)",
                 "model dir with a question-answering head (e.g. made by `bertkit finetune --task qa`)",
                 texts=False)
    p.add_argument("--question", nargs="+", default=None, help="questions")
    p.add_argument("--context", default=None, help="the context (a file path or the text itself)")
    p.add_argument("--pair-field", default="context", help="with --input: the context column (context)")
    p.add_argument("--top-k", type=int, default=1, help="answers per question (1)")
    p.add_argument("--max-answer-length", type=int, default=30, help="longest answer in pieces (30)")
    p.add_argument("--allow-no-answer", action="store_true", help="SQuAD 2.0 models: may answer ''")
    p.set_defaults(func=_run_qa, text_field="question")


def _run_qa(args: argparse.Namespace) -> None:
    from bertkit.inference import qa

    args.texts = args.question
    options = dict(top_k=args.top_k, max_answer_length=args.max_answer_length,
                   allow_no_answer=args.allow_no_answer)
    if not args.input and args.question and not args.context:
        raise ValueError("qa needs --context TEXT_OR_FILE with --question, or --input FILE --out FILE")
    engine = _use_engine(args, "qa", pair_field=args.pair_field, **options)
    if engine is None:
        return
    context = _context_text(args.context)
    results = qa(engine, args.question, context, **options)
    if args.json:
        return print_json({"question": q, "answers": a} for q, a in zip(args.question, results))
    _print_under(args.question, ([f"{a['score']:.3f}  {a['text']!r}  [{a['start']}:{a['end']}]" for a in answers]
                                 for answers in results))


def _print_under(texts: list[str], lines: Iterable[list[str]], none: str | None = None) -> None:
    """Each text, then its results' lines indented under it (`none` when it has none)."""
    for text, found in zip(texts, lines):
        print(text)
        for line in found:
            print("  " + line)
        if none is not None and not found:
            print("  " + none)


def _context_text(value: str) -> str:
    """--context names a file or is the text itself; a paragraph too long to be a path name (the
    OS refuses it: "File name too long") is the text."""
    try:
        is_file = Path(value).is_file()
    except OSError:
        return value
    if not is_file:
        return value
    from bertkit.data.report import read_text

    return read_text(value)


def _add_rerank(sub: argparse._SubParsersAction) -> None:
    p = _add_use(sub, "rerank", "order documents by a cross-encoder's relevance to a query",
                 "cross-encoder dir (a sequence-classification head with one label)")
    p.add_argument("--query", required=True)
    p.add_argument("--top-k", type=int, default=None, help="keep the best K (default all)")
    p.add_argument("--raw-scores", action="store_true", help="logits instead of sigmoid scores")
    p.add_argument("--late-interaction", action="store_true",
                   help="MODEL is a ColBERT model (PyLate's layout): score by MaxSim of query and document "
                   "token vectors instead of a cross-encoder (texts on the command line)")
    p.set_defaults(func=_run_rerank)


def _run_rerank(args: argparse.Namespace) -> None:
    from bertkit.inference import rerank

    if args.late_interaction:
        return _run_late_interaction(args)
    engine = _use_engine(args, "rerank", query=args.query, raw_scores=args.raw_scores)
    if engine is None:
        return
    _print_ranked(args, rerank(engine, args.query, args.texts, top_k=args.top_k, raw_scores=args.raw_scores))


def _run_late_interaction(args: argparse.Namespace) -> None:
    """rerank --late-interaction: the documents on the command line by MaxSim with the query."""
    from bertkit.inference.colbert import Colbert

    for flag, given in (("--input", args.input), ("--adapter", args.adapter), ("--raw-scores", args.raw_scores)):
        if given:
            raise ValueError(f"{flag} does not go with --late-interaction; give the documents on the command line")
    _inputs(args)
    colbert = Colbert.load(args.model, precision=args.precision, max_batch_tokens=args.max_batch_tokens,
                           device=args.device)
    _print_ranked(args, colbert.rerank(args.query, args.texts, top_k=args.top_k))


def _print_ranked(args: argparse.Namespace, ranked: list[dict]) -> None:
    """rerank's answer, best first: one JSON object per document with --json, else a line each
    of score, [input index] and text."""
    if args.json:
        return print_json({**r, "text": args.texts[r["index"]]} for r in ranked)
    for r in ranked:
        print(f"{r['score']:8.4f}  [{r['index']}] {args.texts[r['index']]}")
