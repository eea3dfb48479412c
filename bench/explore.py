"""Explorer latency: how long each interaction of the `bertkit explore` page takes to answer.

Every view's route is called through the ASGI app in process (JSON parsing, the view's model work,
JSON encoding; the page's own drawing is not included), with the page's example texts for the
model's language, and timed over --repeat calls after one warm-up. The issue's goal: each
interaction answers in < 300 ms on the 2-core CPU with the demo model.

    python bench/explore.py                                # runs/quickstart/model, else MiniLM
    python bench/explore.py MODEL_DIR --model NAME=DIR ... # with task models

Prints one row per interaction (median and max ms) and, last, the slowest median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertkit.explore import Explorer, build_app, default_model_dir


def interactions(info: dict) -> list[tuple[str, str, dict]]:
    """(label, route, body) for every request the page makes, with its example texts."""
    ex = info["examples"]
    out = [("who sees whom", "visibility", {"text": ex["text"], "position": 2}),
           ("input assembly (pair)", "assembly", {"text": ex["text"], "pair": ex["pair"], "position": 3}),
           ("masking", "masking", {"text": ex["text"] + ex["pair"], "seed": 1}),
           ("masking, whole words", "masking", {"text": ex["text"] + ex["pair"], "seed": 1, "whole_word": True}),
           ("attention (all layers, padding)", "attention", {"text": ex["text"], "pair": ex["pair"], "pad": 4})]
    if info["model"]["has_mlm"]:
        out.insert(4, ("fill-mask, two contexts", "fill-mask", {"texts": ex["mask_pair"]}))
    fields = {"classify": {"text": ex["classify"]}, "ner": {"text": ex["ner"]},
              "qa": {"question": ex["question"], "context": ex["context"]},
              "embed": {"texts": ex["similar"]}, "rerank": {"query": ex["query"], "texts": ex["documents"]}}
    for task in info["tasks"]:
        out.append((f"task {task['name']} ({task['use']})", "task", {"model": task["name"], **fields[task["use"]]}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--model", dest="tasks", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from starlette.testclient import TestClient

    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    explorer = Explorer.load(model_dir, [tuple(t.split("=", 1)) for t in args.tasks])
    print(f"model: {model_dir} ({explorer.model.config.num_hidden_layers} layers, hidden "
          f"{explorer.model.config.hidden_size}); {args.threads} threads; {args.repeat} calls each")
    slowest = (0.0, "")
    with TestClient(build_app(explorer)) as client:
        info = client.get("/api/info").json()
        print(f"{'interaction':<34} {'median ms':>10} {'max ms':>8}")
        for label, route, body in interactions(info):
            times = []
            for i in range(args.repeat + 1):
                start = time.perf_counter()
                response = client.post(f"/api/{route}", json=body)
                elapsed = (time.perf_counter() - start) * 1000
                if response.status_code != 200:
                    raise SystemExit(f"{label}: {response.status_code} {response.text}")
                if i:  # the first call warms up
                    times.append(elapsed)
            median = statistics.median(times)
            print(f"{label:<34} {median:>10.1f} {max(times):>8.1f}")
            slowest = max(slowest, (median, label))
    print(f"slowest interaction: {slowest[0]:.1f} ms median ({slowest[1]}); goal < 300 ms")


if __name__ == "__main__":
    main()
