"""bertkit serve: model dirs over HTTP (text-embeddings-inference and OpenAI shapes)."""

from __future__ import annotations

import argparse

from bertkit.cli.common import add_engine_arguments, need_web_stack


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP (text-embeddings-inference and OpenAI APIs)",
                       description="Serve one or more model dirs in one process: POST /embed, "
                       "/v1/embeddings, /rerank, /predict, /tokenize, /fill-mask, /ner, /qa; GET "
                       "/health, /info, /metrics. Each request picks a model with its `model` field "
                       "(the first is the default); requests are batched together on one model "
                       "thread. SIGTERM or Ctrl-C: stop taking requests, finish those in flight, exit 0.")
    p.add_argument("models", nargs="+", metavar="[NAME=]MODEL_DIR",
                   help="model dirs, each optionally named (default name: the dir's last part)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this "
                   "machine only; 0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="inputs in flight before new requests get 429 (512)")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="inputs per request (32)")
    p.add_argument("--max-input-length", type=int, default=None,
                   help="tokens per input (default: the model's limit); longer → 422, or cut with "
                   "--auto-truncate or the request's \"truncate\": true")
    p.add_argument("--auto-truncate", action="store_true",
                   help="cut over-long inputs instead of refusing them")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="request body bytes (2,000,000)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (not on /health)")
    add_engine_arguments(p, max_batch_tokens_help="real tokens per model run, all requests together (8192)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish requests in flight at shutdown (30)")
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> None:
    need_web_stack("serve")
    from bertkit.serve import Limits, Service, load_model, parse_model_args, serve
    from bertkit.web import listen

    limits = Limits(max_concurrent_requests=args.max_concurrent_requests,
                    max_client_batch_size=args.max_client_batch_size,
                    max_batch_tokens=args.max_batch_tokens, payload_limit=args.payload_limit,
                    auto_truncate=args.auto_truncate)
    options = {"precision": args.precision, "device": args.device, "max_batch_tokens": args.max_batch_tokens,
               **({"max_length": args.max_input_length} if args.max_input_length else {})}
    named = parse_model_args(args.models)
    models = {name: load_model(name, directory, **options) for name, directory in named}
    sock = listen(args.host, args.port)  # before announcing: a busy port is an error line
    for model in models.values():
        print(f"model {model.name}: {model.engine.model_dir} → {', '.join(model.uses)} "
              f"({model.engine.precision}, {model.engine.device}, ≤ {model.max_length} tokens)")
    print(f"listening on http://{args.host}:{sock.getsockname()[1]} (SIGTERM or Ctrl-C stops, "
          "finishing requests in flight)", flush=True)
    serve(Service(models, limits, api_key=args.api_key), sockets=[sock],
          graceful_timeout=args.graceful_timeout)
