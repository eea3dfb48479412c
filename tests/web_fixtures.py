"""An ASGI app under uvicorn on 127.0.0.1 in a thread, for the tests that talk HTTP to it (a helper
module, not collected)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator


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


@contextlib.contextmanager
def serve_process(args: list[str], wait: float = 60.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """`bertkit serve ARGS` in a process of its own (ARGS should bind port 0); yields the process
    and the URL it announced. The process is killed on the way out if it still runs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + wait
        while not any("listening on" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        yield proc, re.search(r"listening on (http://\S+)", lines[-1]).group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(proc: subprocess.Popen, ready: Callable[[], bool], what: str, wait: float,
                  output: Callable[[], str] = lambda: "") -> None:
    """Poll `ready()` (its OSErrors count as not yet) until true; fail, showing `output()`, when
    `proc` ends first or `wait` seconds pass."""
    deadline = time.monotonic() + wait
    while True:
        assert proc.poll() is None, f"{what} stopped: {output()}"
        assert time.monotonic() < deadline, f"{what} did not start in {wait:.0f} s"
        with contextlib.suppress(OSError):
            if ready():
                return
        time.sleep(0.05)
