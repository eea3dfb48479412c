"""bertkit serve: model dirs over HTTP (text-embeddings-inference and OpenAI shapes)."""

from __future__ import annotations

import argparse

from bertkit.cli.common import add_engine_arguments, engine_options, need_web_stack


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP (text-embeddings-inference and OpenAI APIs)",
                       description="Serve one or more model dirs in one process: POST /embed, "
                       "/embed_all, /similarity, /v1/embeddings, /rerank, /predict, /tokenize, /decode, "
                       "/fill-mask, /ner, /qa, /search (with --index); GET /v1/models, /health, /info, /metrics, "
                       "/openapi.json (OpenAPI 3.1), /docs. Each request picks a model with its `model` field "
                       "(the first is the default); requests are batched together on one model "
                       "thread. --adapter NAME=DIR serves a LoRA adapter over its base model (many "
                       "adapters share the base in memory and in batches). SIGTERM or Ctrl-C: stop "
                       "taking requests, finish those in flight, exit 0.")
    p.add_argument("models", nargs="+", metavar="[NAME=]MODEL_DIR",
                   help="model dirs, each optionally named (default name: the dir's last part); a LoRA "
                   "adapter dir is served over its base (adapter_config.json's, or --base), which is "
                   "served too")
    p.add_argument("--base", metavar="DIR", default=None,
                   help="the base model of the adapter dirs among the models, when their adapter_config.json's "
                   "base_model_name_or_path is not a directory here")
    p.add_argument("--index", action="append", default=[], metavar="[NAME=]INDEX_DIR",
                   help="an index made by `bertkit index`, searched by POST /search (repeatable; the "
                   "first is the default). Its queries are embedded by the served model with its "
                   "fingerprint, else by the index's own model, loaded for it")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this "
                   "machine only; 0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="inputs in flight before new requests get 429 (512)")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="inputs per request (32)")
    p.add_argument("--openai-max-batch-size", type=int, default=2048,
                   help="inputs per /v1/embeddings request (2048, OpenAI's limit), admitted in slices "
                   "of half of --max-concurrent-requests")
    p.add_argument("--served-model-name", action="append", default=[], metavar="[MODEL=]NAME[,NAME]",
                   help="more names a model answers to in `model` (listed by GET /v1/models); without "
                   "MODEL=, the first model's; repeatable. Every name is unique")
    p.add_argument("--default-prompt-name", default=None,
                   help="the prompt (config_sentence_transformers.json `prompts`) put before texts of "
                   "requests that name no `prompt_name`, for every model that declares it")
    p.add_argument("--allow-truncated-dimensions", action="store_true",
                   help="take `dimensions` for any model, not only those declaring a Matryoshka "
                   "truncate_dim (the first N dimensions of other models are not an embedding of "
                   "their own; see docs/serving.md)")
    p.add_argument("--max-input-length", type=int, default=None,
                   help="tokens per input (default: the model's limit); longer → 422, or cut with "
                   "--auto-truncate or the request's \"truncate\": true")
    p.add_argument("--auto-truncate", action="store_true",
                   help="cut over-long inputs instead of refusing them")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="request body bytes (2,000,000)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (not on /health)")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR[@MODEL]",
                   help="serve a LoRA adapter dir as NAME over the served model it was trained on (its "
                   "bertkit_adapter.json says which; @MODEL to choose); adapters of one base share its "
                   "weights and batches; repeatable")
    p.add_argument("--adapter-root", default=None, metavar="DIR",
                   help="allow POST /adapters (load an adapter dir inside DIR) and DELETE /adapters/NAME "
                   "at run time; needs --api-key")
    add_engine_arguments(p, max_batch_tokens_help="real tokens per model run, all requests together (8192)")
    p.add_argument("--model-threads", type=int, default=None, metavar="N",
                   help="threads running the models, each with its share of --threads (default: 2 on "
                   "the CPU with 2 torch threads or more, else 1)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish requests in flight at shutdown (30)")
    p.add_argument("--drain-seconds", type=float, default=0.0,
                   help="seconds between SIGTERM and closing the port, answering every request while GET "
                   "/ready says 503, so a load balancer polling /ready stops sending work first (0)")
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> None:
    need_web_stack("serve")
    import torch

    from bertkit.serve import Limits, Service, load_model, parse_model_args, parse_served_names, serve
    from bertkit.serve.adapters import ServedAdapters, parse_adapter_args
    from bertkit.serve.scheduler import default_model_threads, thread_shares
    from bertkit.util.web import listen

    if args.drain_seconds < 0:
        raise ValueError(f"--drain-seconds must be 0 or more, got {args.drain_seconds}")
    if args.model_threads is not None:  # said before the models load, not after
        thread_shares(torch.get_num_threads(), args.model_threads)
    limits = Limits(max_concurrent_requests=args.max_concurrent_requests,
                    max_client_batch_size=args.max_client_batch_size,
                    openai_max_batch_size=args.openai_max_batch_size,
                    max_batch_tokens=args.max_batch_tokens, payload_limit=args.payload_limit,
                    auto_truncate=args.auto_truncate)
    options = {**engine_options(args), **({"max_length": args.max_input_length} if args.max_input_length else {})}
    named, given_adapters = models_and_adapters(parse_model_args(args.models), args.base)
    aliases = parse_served_names(args.served_model_name, [name for name, _ in named])
    adapter_specs = [*given_adapters, *parse_adapter_args(args.adapter)]
    if args.adapter_root and not args.api_key:
        raise ValueError("--adapter-root lets clients load adapters: it needs --api-key KEY as well")
    taken = [n for n, _, _ in adapter_specs if n in aliases or any(n == m for m, _ in named)]
    if taken:
        raise ValueError(f"--adapter {taken[0]!r}: the name is taken by a model or alias; every name is unique")
    models = {name: load_model(name, directory, **options) for name, directory in named}
    indexes = {}
    if args.index:  # before the adapters: an index is queried by the base model it was built with
        from bertkit.serve.search import load_indexes, parse_index_args

        indexes = load_indexes(parse_index_args(args.index), models, **{k: v for k, v in options.items()
                                                                        if k != "max_length"})
    adapters = ServedAdapters.attach(models, args.adapter_root) if adapter_specs or args.adapter_root else None
    for name, directory, base in adapter_specs:
        models[name] = adapters.load(name, directory, base)
    model_threads = args.model_threads or default_model_threads(list(models.values()))
    service = Service(models, limits, api_key=args.api_key, aliases=aliases,
                      default_prompt_name=args.default_prompt_name,
                      allow_truncated_dimensions=args.allow_truncated_dimensions, adapters=adapters,
                      indexes=indexes, model_threads=model_threads)
    sock = listen(args.host, args.port)  # before announcing: a busy port is an error line
    for model in models.values():
        names = [a for a, m in aliases.items() if m == model.name]
        source = (f"adapter {model.adapter['dir']} over {model.base}" if model.base is not None
                  else model.engine.model_dir)
        print(f"model {model.name}{' (also ' + ', '.join(names) + ')' if names else ''}: "
              f"{source} → {', '.join(model.uses)} "
              f"({model.engine.precision}, {model.engine.device}, ≤ {model.max_length} tokens)")
    for index in indexes.values():
        info = index.describe()
        print(f"index {index.name}: {info['path']} → POST /search ({info['documents']:,} documents, "
              f"{info['passages']:,} passages, {info['backend']}; queries embedded by "
              f"{'its own model ' + info['model_dir'] if index.own_model else 'model ' + index.model.name})")
    print(f"listening on http://{args.host}:{sock.getsockname()[1]} (SIGTERM or Ctrl-C stops, "
          "finishing requests in flight)", flush=True)
    serve(service, sockets=[sock], graceful_timeout=args.graceful_timeout, drain_seconds=args.drain_seconds)


def models_and_adapters(named: list[tuple[str, str]], base: str | None
                         ) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The models to load and the adapters over them: an adapter dir among MODEL_DIRs is served by
    its name over its base, which joins the models (by its dir's last part) unless one of them
    is that directory already."""
    from pathlib import Path

    from bertkit.adapters import is_adapter_dir, resolve

    models = [(name, directory) for name, directory in named if not is_adapter_dir(directory)]
    if base is not None and len(models) == len(named):
        raise ValueError("--base names the base of an adapter dir among the models, and none is one; "
                         "leave out --base")
    adapters: list[tuple[str, str, str]] = []
    for name, directory in named:
        if not is_adapter_dir(directory):
            continue
        base_dir = resolve(directory, None, base)[0].resolve()
        served = next((n for n, d in models if Path(d).resolve() == base_dir), None)
        if served is None:
            served = base_dir.name
            if any(served == n for n, _ in [*models, *named]):
                raise ValueError(f"the base {base_dir} of adapter {directory} would be served as {served!r}, "
                                 f"a name taken already; serve it named: NAME={base_dir}")
            models.append((served, str(base_dir)))
        adapters.append((name, directory, served))
    return models, adapters
