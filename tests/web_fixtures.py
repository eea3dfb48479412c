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
