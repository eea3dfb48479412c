"""SIGKILL a command part-way through: the harness of every kill-then-resume test.

A real kill, not an exception: nothing runs after it (no finally, no atexit, no flush), so a test
that resumes afterwards proves that what was on disk at any moment was enough.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable


def kill_when(command: list[str], env: dict[str, str], ready: Callable[[], bool], *,
              timeout: float = 120, poll: float = 0.01) -> None:
    """Run `command` in a process group of its own; once `ready()` is true, SIGKILL the whole
    group (DataLoader workers included) and check that it died of that signal.

    Fails when the command ends before it could be killed (its stderr is shown) or when `ready()`
    stays false for `timeout` seconds. The group is killed on every way out of this function.
    """
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "run made no progress"
            time.sleep(poll)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
