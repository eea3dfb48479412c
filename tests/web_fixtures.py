"""An ASGI app under uvicorn on 127.0.0.1 in a thread, `bertkit serve` in a process of its own, and
nginx in front of replicas, for the tests (and bench/scale_out.py) that talk HTTP to them (a helper
module, not collected)."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


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


def documented_nginx_config() -> str:
    """The nginx text of docs/scaling.md: its one ```nginx block."""
    page = (ROOT / "docs" / "scaling.md").read_text()
    blocks = re.findall(r"^```nginx\n(.*?)^```", page, flags=re.S | re.M)
    assert len(blocks) == 1, "docs/scaling.md should show one nginx block"
    return blocks[0]


@contextlib.contextmanager
def nginx(prefix: Path, balancer: int, replicas: list[str], wait: float = 60.0) -> Iterator[str]:
    """nginx on 127.0.0.1:`balancer` in front of `replicas` (host:port), run as this user from
    `prefix` with docs/scaling.md's configuration (its ports replaced); yields its URL once it
    answers /ready, and stops it (gracefully, then by force) on the way out."""
    import httpx

    conf = documented_nginx_config().replace("127.0.0.1:8080", f"127.0.0.1:{balancer}")
    for documented, replica in zip(("127.0.0.1:8081", "127.0.0.1:8082"), replicas):
        conf = conf.replace(documented, replica)
    (prefix / "bertkit.conf").write_text(conf)
    temps = "\n".join(f"    {kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                               "uwsgi", "scgi"))
    # `user`: heeded only when run as root (workers would otherwise drop to nobody, who cannot
    # write the prefix); ignored with a warning otherwise.
    (prefix / "nginx.conf").write_text(f"""user {getpass.getuser()};
worker_processes 1;
daemon off;
pid {prefix / 'nginx.pid'};
error_log {prefix / 'error.log'} info;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix / 'access.log'};
{temps}
    include {prefix / 'bertkit.conf'};
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e",
                             str(prefix / "error.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{balancer}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until_up(proc, ready, "nginx", wait, (prefix / "error.log").read_text)
        yield url
    finally:
        proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
