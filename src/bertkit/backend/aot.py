"""Kernels compiled ahead of time and kept on disk: a second process loads them in milliseconds.

`torch.compile` caches inductor's output on disk, but every new process still traces the Python
function again (Dynamo), rebuilds its guards and loads the graph through AOTAutograd: seconds per
kernel, paid by every CLI call and every service restart. Here a kernel is exported once
(`torch.export`, the row count dynamic) and compiled by AOTInductor into a package; later
processes open the package with the C++ loader (`torch._C._aoti.AOTIModelPackageLoader`), which
neither traces nor imports inductor.

The cache lives in `fileio.cache_dir()` (`$BERTKIT_CACHE_DIR`, else `$XDG_CACHE_HOME/bertkit`,
else `~/.cache/bertkit`), under `kernels/`. A package's name is a hash of everything its code
depends on: `precision.machine_key()` (torch's version, the CPU's model name and flags and torch's
detected vector capability, the thread count, which inductor writes into the C++ code), the
kernel's source file, its name, and the dtypes and fixed sizes of its arguments. Delete the
directory to clear it; a package that fails to load is compiled anew.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from bertkit.backend.precision import machine_key
from bertkit.util.fileio import cache_dir

log = logging.getLogger(__name__)


def signature(tensors: Sequence[torch.Tensor]) -> str:
    """Dtypes and sizes past the first dimension (the rows, which vary) of a kernel's arguments."""
    return ",".join(f"{t.dtype}{tuple(t.shape[1:])}" for t in tensors)


class AotKernel:
    """One function of tensors, compiled ahead of time for arguments shaped as `example`
    (dimension 0 of the tensors at the positions in `rows` varies; every other size is fixed),
    loaded from the cache when there.

    fn: the function; it may write into its arguments (the package writes into them too). Any
      other value it depends on (an epsilon, an activation) is fixed in it and must be in `name`.
    source: the file whose code the function comes from (its contents are part of the key).
    Calling it returns the function's outputs as a list of tensors.
    """

    def __init__(self, name: str, fn: Callable, example: Sequence[torch.Tensor], rows: Sequence[int],
                 source: str):
        self.name, self.fn, self.example, self.rows = name, fn, tuple(example), set(rows)
        digest = hashlib.sha256()
        for part in (machine_key(), name, signature(example)):
            digest.update(part.encode())
        digest.update(Path(source).read_bytes())
        self.path = cache_dir() / "kernels" / f"{name}-{digest.hexdigest()[:24]}.pt2"
        self._loader = None

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        if self._loader is None:
            self._loader = self._load()
        return self._loader.run(list(tensors))

    def _load(self):
        if self.path.is_file():
            try:
                return torch._C._aoti.AOTIModelPackageLoader(str(self.path), "model", False, 1, -1)
            except Exception as err:  # a package from an interrupted write or another build: compile anew
                log.warning("%s: cannot load (%s); compiling it again", self.path, type(err).__name__)
        started = time.perf_counter()
        log.warning("compiling the %s kernel for this CPU (once; kept in %s)", self.name, self.path.parent)
        self._compile()
        log.warning("compiled the %s kernel in %.1f s", self.name, time.perf_counter() - started)
        return torch._C._aoti.AOTIModelPackageLoader(str(self.path), "model", False, 1, -1)

    def _compile(self) -> None:
        fn = self.fn

        class Kernel(torch.nn.Module):
            def forward(self, *args):
                return fn(*args)

        n = torch.export.Dim("rows", min=1, max=1 << 24)
        dynamic = tuple({0: n} if i in self.rows else None for i in range(len(self.example)))
        exported = torch.export.export(Kernel(), self.example, dynamic_shapes=(dynamic,), strict=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.name}.", suffix=".pt2")
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=tmp)
            os.replace(tmp, self.path)  # whole or absent: another process never loads half a package
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

