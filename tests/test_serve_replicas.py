"""Two `bertkit serve` replicas behind a real nginx, one killed (SIGKILL) under load: no request
lost, no 5xx. nginx runs as the test's user from a prefix in tmp_path, on 127.0.0.1, with the
`upstream` and `server` blocks that docs/scaling.md shows (only the ports changed); it retries a
request whose replica fails on the other one (`proxy_next_upstream`). Bounded: a fixed number of
requests, every wait with a deadline, every process stopped on the way out. Skips, saying so,
where nginx is not installed (Debian: `apt-get install nginx-light`; .ci/run installs it).
"""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from web_fixtures import NGINX, free_port, nginx, serve_process

REQUESTS = 120  # the load: this many /embed requests from CLIENTS threads
CLIENTS = 6
KILL_AFTER = 30  # answers before replica A is killed
WAIT = 120.0  # seconds: the bound on the whole load, and on every start
TEXTS = ["A man is playing a guitar.", "Stocks fell.", "Paris is the capital of France.",
         "The central bank raised interest rates by a quarter of a point."]

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install "
                                "nginx-light; .ci/run installs it), so the replica test cannot run")


def test_a_replica_killed_under_load_loses_no_request(minilm_dir, tmp_path):
    args = [str(minilm_dir), "--port", "0", "--threads", "1"]
    with serve_process(args) as (a, url_a), serve_process(args) as (b, url_b):
        replica_a, replica_b = url_a.removeprefix("http://"), url_b.removeprefix("http://")
        with nginx(tmp_path, free_port(), [replica_a, replica_b], WAIT) as url:
            answered: list[int] = []

            def post(i: int) -> tuple[int, str, list[float] | None]:
                response = httpx.post(f"{url}/embed", json={"inputs": TEXTS[i % len(TEXTS)]}, timeout=WAIT)
                answered.append(i)
                ok = response.status_code == 200
                return response.status_code, response.headers.get("x-upstream", ""), \
                    response.json()[0] if ok else None

            start = time.monotonic()
            with ThreadPoolExecutor(CLIENTS) as pool:
                futures = [pool.submit(post, i) for i in range(REQUESTS)]
                deadline = start + WAIT
                while len(answered) < KILL_AFTER:
                    assert time.monotonic() < deadline, f"only {len(answered)} answers before the kill"
                    time.sleep(0.005)
                a.kill()  # SIGKILL: nothing is drained, requests in flight on A are cut
                killed_at = len(answered)
                results = [f.result(max(1.0, deadline - time.monotonic())) for f in futures]
            assert a.wait(10) == -signal.SIGKILL
            assert killed_at < REQUESTS, "the load ended before the kill; raise REQUESTS"

    statuses = [status for status, _, _ in results]
    assert statuses == [200] * REQUESTS, f"not every request answered 200: {statuses}"
    upstreams = [upstream for _, upstream, _ in results]
    assert {replica_a, replica_b} <= set(upstreams), "nginx should have used both replicas"
    # the requests that met the dead replica were answered by the other one: "A, B"
    assert any(u == f"{replica_a}, {replica_b}" for u in upstreams), upstreams
    vectors: dict[int, np.ndarray] = {}
    for i, (_, _, vector) in enumerate(results):  # the same text: the same vector, whichever replica
        first = vectors.setdefault(i % len(TEXTS), np.array(vector))
        assert np.abs(np.array(vector) - first).max() <= 1e-5
    log = (tmp_path / "error.log").read_text()
    assert re.search(r"(connect\(\) failed|upstream prematurely closed|recv\(\) failed).*" + re.escape(replica_a),
                     log), "nginx's log should say it met the dead replica"
