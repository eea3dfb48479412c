"""What the two web apps (`bertkit serve`, `bertkit explore`) share: the listening socket and the
uvicorn server that stops cleanly.

Both bind before they announce themselves, so a busy port is one error line, and both end with
exit status 0 on SIGTERM or Ctrl-C once the requests in flight are answered: uvicorn re-raises the
signal after draining, so without `run` a process manager would see "killed by SIGTERM" (143) for
an orderly stop.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from typing import Any, Callable


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (so a busy port is reported before any model is loaded)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and accepted sockets inherit it. Without it a response's body waits for the ACK of its
    # headers (Nagle + the client's delayed ACK): 40 ms added to every answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror or err}; choose another "
                      "--port (or --host)") from None
    return sock


def run(app: Any, *, sockets: list[socket.socket] | None = None, host: str = "127.0.0.1", port: int = 8000,
        graceful_timeout: float | None = None, lifespan: str = "auto", drain: float = 0.0,
        on_signal: Callable[[], None] | None = None) -> None:
    """Serve `app` (ASGI) under uvicorn until SIGINT / SIGTERM, then stop taking connections,
    finish the requests in flight (up to `graceful_timeout` s; None: no limit) and return.

    on_signal: called at the first signal (the app's readiness turns false there).
    drain: seconds between that signal and closing the listening socket, while every request is
    still answered: a load balancer that polls readiness takes the process out of its pool in
    that time, instead of learning of the stop from refused connections. A second signal ends the
    wait at once.
    """
    import uvicorn

    class Server(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.signalled:
                self.signalled = True
                if on_signal is not None:
                    on_signal()
                if drain > 0:
                    timer = threading.Timer(drain, lambda: setattr(self, "should_exit", True))
                    timer.daemon = True
                    timer.start()
                    return
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own handler re-raises the signal once drained; a drained stop is a clean exit.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    # access_log=False: at log level "warning" no access line is ever shown, but uvicorn would
    # still format its arguments (client address, path) for every answer
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=graceful_timeout, lifespan=lifespan)
    Server(config).run(sockets=sockets)
