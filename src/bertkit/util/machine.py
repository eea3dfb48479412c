"""What this machine is, for the keys of what bertkit compiles or measures once per machine."""

from __future__ import annotations

import platform


def cpu_identity() -> str:
    """This CPU's model name and flags (what code compiled with -march=native holds for)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            first = f.read().split("\n\n", 1)[0]
        cpu = "|".join(line.split(":", 1)[1].strip() for line in first.splitlines()
                       if line.split(":", 1)[0].strip() in ("model name", "flags"))
    except OSError:
        pass
    return cpu
