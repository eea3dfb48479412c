"""An ASGI app under uvicorn on 127.0.0.1 in a thread, for the tests that talk HTTP to it (a helper
module, not collected)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def running_app(app, wait: float = 20.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<ephemeral> until the block ends; yields its base URL.

    Start and stop are bounded by `wait` seconds: a server that does not come up, or does not go
    down, fails the test instead of hanging it.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # see bertkit.util.web.listen
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + wait
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(wait)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def fuzz_operation(schema, method: str, path: str, mode: str, *, examples: int, checks: tuple[str, ...],
                   steer, statuses, wait: float) -> None:
    """`examples` requests schemathesis generates for one operation of an OpenAPI `schema` (`mode`:
    "positive", valid ones, or "negative", ones the document forbids), each passed to `steer(case)`
    to reach the model, sent, counted by status in `statuses` (a Counter) and held to `checks`
    (names in `schemathesis.checks`). Derandomized: the same requests every run."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode

    operation = schema[path][method]
    check_functions = [getattr(schemathesis.checks, c) for c in checks]

    @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def run(case) -> None:
        steer(case)
        response = case.call(timeout=wait)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=check_functions)

    run()


def hold_runs(monkeypatch, engine, wait: float) -> tuple[threading.Event, threading.Event]:
    """Patch `engine.run` so that a run sets `entered`, then waits (at most `wait` seconds) until
    the test sets `opened`: the model thread held inside a run while requests queue behind it.
    Returns (opened, entered)."""
    opened, entered = threading.Event(), threading.Event()
    real = engine.run

    def held(*args, **kwargs):
        entered.set()
        assert opened.wait(wait)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "run", held)
    return opened, entered
