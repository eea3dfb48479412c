"""Where the engine's time goes: stage by stage and op by op, over MiniLM embeddings.

    python bench/profile_engine.py                                  # 1,500 BBC sentences, fp32, 2 threads
    python bench/profile_engine.py --workload short --precision int8 --sentences 3000
    python bench/profile_engine.py --ops                            # also torch.profiler's op table

Workloads: `bbc`, the first N sentences of the built-in BBC corpus (truncated at 256 tokens);
`short`, the first N of its sentences of at most 64 tokens ([CLS]/[SEP] included; ~30 tokens
on average, the length of a tweet or a search query), where the fixed costs of a batch and of a
layer weigh most.

One warm-up pass, then `--passes` timed passes with a timer around each stage (the fastest pass
is reported; the timers cost a few microseconds per call, printed as their own line):

- tokenize: `Engine.encode` (the Rust tokenizer, batched);
- pack: `Packed.from_lengths` (lengths, positions, runs of equal length);
- embeddings: the three lookups and their LayerNorm;
- qkv / attn_out / ffn_in / ffn_out: each Linear (fp32 and bf16: oneDNN's fused GEMM; int8: the
  compiled quantize → int8 GEMM → dequantize kernel; int8 runs attn_out, ffn_in and ffn_out, with
  both LayerNorms, as two fused kernels per row block, counted together as `after attention`);
- attention: `Packed.attend` (SDPA calls, one per run of equal lengths, and their copies);
- after attention: the rest of the layer after attention (LayerNorms; int8: everything there);
- encoder, outside the above: the layer loop, the input checks, the pooler;
- pooling: mean pooling of each sequence;
- the rest: the wall time none of the stages took: batching, building the batch tensors, putting
  the vectors back in input order, normalising, Python between the stages.

Each GEMM stage is set beside its GEMMs' time at the rate measured for its shape at the
workload's batch size (oneDNN's fp32/bf16 linear, or `torch._int_mm`: what `bench/gemm_shapes.py`
measures), so what a stage costs beyond its arithmetic reads directly. With `--ops`, a profiled
pass prints torch.profiler's self CPU time per op; its sum against the wall time is the share of
the time spent outside ATen's kernels (Python, the dispatcher).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infer import MINILM_MAX_LENGTH, bbc_sentences, minilm_dir, token_lengths  # noqa: E402

SHORT_MAX_TOKENS = 64
LINEARS = ("qkv", "attn_out", "ffn_in", "ffn_out")


def short_sentences(n: int) -> list[str]:
    """The first n BBC sentences of at most SHORT_MAX_TOKENS tokens, in corpus order."""
    from bertkit.data.corpus import load_builtin

    sentences = [s for doc in load_builtin("bbc-news").documents for s in doc]
    lengths = token_lengths(minilm_dir() / "tokenizer.json", sentences, MINILM_MAX_LENGTH)
    short = [s for s, n_tokens in zip(sentences, lengths) if n_tokens <= SHORT_MAX_TOKENS]
    if n > len(short):
        raise SystemExit(f"--sentences {n} exceeds the {len(short)} BBC sentences of at most "
                         f"{SHORT_MAX_TOKENS} tokens; pass at most {len(short)}")
    return short[:n]


class Stages:
    """Exclusive wall time per stage: a stage inside another is subtracted from the outer one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter = Counter()
        self.stack: list[float] = []  # time spent in the children of each open stage
        self.batches: list[tuple[int, int, int]] = []  # (sequences, tokens, runs) per packed batch
        self.on = False

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.batches.clear()

    def timed(self, original, stage):
        """original, timed under `stage` (a name, or a function of the call's arguments → name)."""
        timer = self

        def call(*args, **kwargs):
            if not timer.on:
                return original(*args, **kwargs)
            start = time.perf_counter()
            timer.stack.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = timer.stack.pop()
                label = stage if isinstance(stage, str) else stage(*args)
                timer.seconds[label] += elapsed - children
                timer.calls[label] += 1
                if timer.stack:
                    timer.stack[-1] += elapsed
        return call

    def wrap(self, owner, name: str, stage) -> None:
        """Time owner.name (a function or method) under `stage`."""
        setattr(owner, name, self.timed(getattr(owner, name), stage))

    def overhead(self) -> float:
        """Seconds one timed call costs beyond the call itself (the timers' own cost)."""
        def nothing():
            return None
        probe = Stages()
        probe.on = True
        wrapped = probe.timed(nothing, "probe")
        n = 20000
        start = time.perf_counter()
        for _ in range(n):
            wrapped()
        timed = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n):
            nothing()
        return (timed - (time.perf_counter() - start)) / n


def linear_name(model) -> dict[int, str]:
    """id(module) → qkv / attn_out / ffn_in / ffn_out for every encoder layer's Linears."""
    from bertkit.encoder.model import encoder_of

    names = {}
    for layer in encoder_of(model).layers:
        for name in LINEARS:
            names[id(getattr(layer, name))] = name
    return names


def instrument(engine, stages: Stages) -> None:
    import importlib

    from bertkit.backend import int8
    from bertkit.encoder import fused, model, packing
    from bertkit.inference.engine import Engine

    embed_module = importlib.import_module("bertkit.inference.embed")  # the package exports a function of that name

    names = linear_name(engine.model)
    stages.wrap(Engine, "encode", "tokenize")
    from_lengths = stages.timed(packing.Packed.from_lengths.__func__, "pack")

    def counted(cls, lengths, device="cpu"):
        packed = from_lengths(cls, lengths, device)
        if stages.on:
            stages.batches.append((len(lengths), sum(lengths), len(packed.runs)))
        return packed
    packing.Packed.from_lengths = classmethod(counted)
    stages.wrap(model.Embeddings, "forward_packed", "embeddings")
    # every encoder Linear goes through fused.linear (an Int8Linear runs its own forward inside it)
    stages.wrap(fused, "linear", lambda module, *_: names.get(id(module), "other Linear"))
    stages.wrap(packing.Packed, "attend", "attention")
    stages.wrap(model.EncoderLayer, "feed_forward", "after attention")
    stages.wrap(int8.Int8EncoderLayer, "feed_forward", "after attention")
    stages.wrap(model.BertModel, "forward_packed", "encoder, outside the above")
    stages.wrap(embed_module, "pool", "pooling")


def fastest(fn, *args, reps: int = 6) -> float:
    """Seconds of the fastest of `reps` calls fn(*args), after two warm-ups."""
    with torch.inference_mode():
        for _ in range(2):
            fn(*args)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            fn(*args)
            best = min(best, time.perf_counter() - start)
    return best


def gemm_seconds(precision: str, tokens: int, shapes: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Seconds of one (tokens, in) × (in, out) GEMM per Linear name: the engine's own kernels
    (oneDNN's linear, as `encoder.fused` calls it, for fp32 / bf16; torch._int_mm for int8, the
    arithmetic alone without quantization)."""
    out = {}
    for name, (k, n) in shapes.items():
        if precision == "int8":
            a = torch.randint(-128, 127, (tokens, k), dtype=torch.int8)
            out[name] = fastest(torch._int_mm, a, torch.randint(-127, 127, (k, n), dtype=torch.int8))
            continue
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        a, w, bias = (torch.randn(tokens, k, dtype=dtype), torch.randn(n, k, dtype=dtype),
                      torch.zeros(n, dtype=dtype))
        out[name] = fastest(torch.ops.mkldnn._linear_pointwise, a, w, bias, "none", [], "")
    return out


def stage_table(stages: Stages, wall: float, engine, precision: str) -> list[str]:
    """The per-stage lines: seconds, share of the wall time, calls per batch, and for GEMM stages
    the GEMMs' time at the measured rate."""
    config = engine.config
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    shapes = {"qkv": (hidden, 3 * hidden), "attn_out": (hidden, hidden), "ffn_in": (hidden, inner),
              "ffn_out": (inner, hidden)}
    batches = max(1, len(stages.batches))
    tokens = sum(b[1] for b in stages.batches)
    mean_tokens = max(17, round(tokens / batches))
    per_batch = gemm_seconds(precision, mean_tokens, shapes)
    # GEMM time for all tokens of the pass: per-batch time scaled to the pass's token count
    gemm = {name: per_batch[name] * layers * tokens / mean_tokens for name in shapes}
    if precision == "int8":  # the fused kernels after attention hold three of the four Linears
        gemm = {"qkv": gemm["qkv"], "after attention": gemm["attn_out"] + gemm["ffn_in"] + gemm["ffn_out"]}
    rest = wall - sum(stages.seconds.values())
    rows = sorted(stages.seconds.items(), key=lambda kv: -kv[1]) + [("the rest (Python, batching, results)", rest)]
    lines = [f"{'stage':40s} {'seconds':>8s} {'share':>6s} {'calls/batch':>11s} {'GEMM at rate':>13s}"]
    for name, seconds in rows:
        calls = f"{stages.calls[name] / batches:11.1f}" if name in stages.calls else f"{'':11s}"
        at_rate = f"{gemm[name]:8.3f} s {gemm[name] / seconds:3.0%}" if name in gemm and seconds > 0 else ""
        lines.append(f"{name:40s} {seconds:8.3f} {seconds / wall:6.1%} {calls} {at_rate:>13s}")
    total_gemm = sum(gemm.values())
    unit = "GOP/s" if precision == "int8" else "GFLOP/s"
    flops = 2 * tokens * layers * sum(k * n for k, n in shapes.values())
    lines.append(f"GEMMs at their measured rate ({flops / total_gemm / 1e9:,.0f} {unit} at {mean_tokens} rows): "
                 f"{total_gemm:.3f} s = {total_gemm / wall:.1%} of the wall time")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bbc", choices=["bbc", "short"])
    parser.add_argument("--sentences", type=int, default=1500)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3, help="timed passes, the fastest reported (3)")
    parser.add_argument("--ops", action="store_true", help="also a profiled pass: torch.profiler's op table")
    parser.add_argument("--top", type=int, default=12, help="ops listed with --ops (12)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from bertkit.inference.embed import embed
    from bertkit.inference.engine import Engine

    texts = bbc_sentences(args.sentences) if args.workload == "bbc" else short_sentences(args.sentences)
    engine = Engine.load(minilm_dir(), use="embed", precision=args.precision, max_length=MINILM_MAX_LENGTH)
    stages = Stages()
    instrument(engine, stages)
    embed(engine, texts[:200])
    plain = []  # passes without the timers, for the sentences/s figure
    timed: list[tuple[float, dict, Counter, list]] = []
    for _ in range(args.passes):
        start = time.perf_counter()
        embed(engine, texts)
        plain.append(time.perf_counter() - start)
        stages.reset()
        stages.on = True
        start = time.perf_counter()
        embed(engine, texts)
        wall = time.perf_counter() - start
        stages.on = False
        timed.append((wall, dict(stages.seconds), Counter(stages.calls), list(stages.batches)))
    wall, seconds, calls, batches = min(timed, key=lambda t: t[0])
    stages.seconds, stages.calls, stages.batches = defaultdict(float, seconds), calls, batches
    tokens = sum(b[1] for b in batches)
    cost = stages.overhead()
    print(f"{args.workload}: {len(texts):,} sentences, {tokens / len(texts):.1f} tokens each on average; "
          f"{args.precision}, {args.threads} threads; {len(batches)} batches of {tokens / len(batches):,.0f} tokens, "
          f"{statistics.mean(b[0] for b in batches):.0f} sequences and {statistics.mean(b[2] for b in batches):.0f} "
          "runs of equal length on average")
    print(f"{len(texts) / min(plain):.1f} sentences/s without timers (fastest of {args.passes}); "
          f"with timers {wall:.3f} s, of which the timers' own cost ≈ {cost * sum(calls.values()):.4f} s")
    for line in stage_table(stages, wall, engine, args.precision):
        print(line)
    if args.ops:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            embed(engine, texts)
            profiled = time.perf_counter() - start
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(f"profiled pass {profiled:.2f} s; ops' self CPU time {total / 1e6:.2f} s")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
            print(f"{e.key[:60]:60s} {100 * e.self_cpu_time_total / total:5.1f}%  {e.count} calls")


if __name__ == "__main__":
    main()
