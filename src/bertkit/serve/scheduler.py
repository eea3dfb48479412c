"""Batching across requests: one queue, model threads, runs formed from whatever is queued.

Handlers put a `Job` (a model, a use, the options its inputs share, the inputs) on the queue and
await its future. A model thread takes jobs from the head of the queue up to the token
budget (`max_batch_tokens`; one job always, however long), merges the jobs of the same model,
use and options into one runner call (the engine then sorts them by length into packed,
padding-free batches), and hands each job its slice of the results back on the event loop.

On the CPU there are two model threads by default (`model_threads`, `bertkit serve
--model-threads`), each running its own runs with half of torch's threads. One model thread
with every torch thread splits each run's kernels between the cores, and a kernel ends only
when its slowest share does: whenever the event loop (parsing, tokenizing, answering) takes a
core, or holds the GIL the model thread needs between two kernels, the other core waits with it.
Two model threads of one torch thread each wait for nobody: while one is held up the other
computes (`bench/model_threads.py`; docs/design.md#serving-measurements has the figures). Each
sequence's result is the same whichever thread runs it and with how many torch threads (the
engine's kernels are batch- and thread-independent), so answers do not depend on this.

So the event loop never runs the model, the model threads never parse HTTP or tokenize, and
long requests are tokenized on a thread of their own (`tokenize`), so that overlaps the model's
work without stalling the loop (short ones are tokenized on the loop: cheaper than the hop). A job whose client went
away (its future cancelled) is dropped before it is run. `stop` lets the threads finish every
queued job, then ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from bertkit.backend.malloc import bound_thread_heaps, glibc, resident_bytes
from bertkit.serve.errors import ErrorType, ServeError, validation
from bertkit.serve.metrics import Metrics
from bertkit.serve.mixed import run_mixed
from bertkit.serve.models import ServedModel
from bertkit.serve.runners import LIBRARY_USES, RUNNERS

log = logging.getLogger(__name__)

TRIM_EVERY = 2.0  # seconds between giving the C heap's free memory back to the OS (see _trimmer)
TRIM_GROWTH = 0.1  # ... or sooner, once resident memory is this share above what the last trim left


def _trimmer() -> Callable[[], Any] | None:
    """glibc's malloc_trim, or None elsewhere.

    Why: tensors of every batch shape come and go on several threads (the model thread, torch's
    workers, the tokenizer's), and glibc keeps what they freed in its per-thread arenas. Measured
    on MiniLM at 64 clients for 10 minutes: resident memory 742 MiB after the first minute, 1,281
    at the end, still rising; with a fixed mmap threshold instead (MALLOC_MMAP_THRESHOLD_) it
    stayed at ~385 MiB but every large tensor paid for a fresh mapping (-20% requests/s).
    malloc_trim(0) every TRIM_EVERY seconds returns the free pages for a few milliseconds' work,
    and once more TRIM_EVERY after the last run when the queue stays empty, so a server that falls
    idle gives back what its last runs freed (at rest after warm-up, int8: 348 MiB against 390
    without it; docs/serving.md). A clock alone bounds memory by the runs that fit in TRIM_EVERY,
    more on a faster machine (fp32 at 64 clients: 1.43× its rest on a quiet machine, 1.22× on a
    busy one), so a run also trims once resident memory (one read of /proc/self/statm) is
    TRIM_GROWTH above what the last trim left: the bound is then the growth, whatever the rate.
    """
    libc = glibc()  # None where the C library is not glibc (musl, macOS): nothing to trim with
    return None if libc is None else libc.malloc_trim


@dataclass
class Timing:
    """Where a request's time went, in seconds (sent back in TEI's x-...-time headers), and what
    it computed. The model thread adds queue and inference time before it resolves the job."""
    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0
    characters: int = 0
    tokens: int = 0
    start: float = field(default_factory=time.perf_counter)


@dataclass
class Job:
    model: ServedModel
    use: str  # a key of runners.RUNNERS
    key: tuple  # options every input of a merged run must share (top_k, ...)
    items: list[Any]  # the inputs, as the runner takes them
    tokens: int  # real tokens (or an estimate), for the run's budget
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)
    timing: Timing | None = None

    @property
    def group(self) -> tuple:
        # adapters of one base (and the base) run together: serve/adapters.py's run_mixed
        return (self.model.base or self.model.name, self.use, self.key)


def default_model_threads(models: list[ServedModel]) -> int:
    """2 where every model runs on the CPU and torch has 2 threads or more, else 1 (a GPU's
    kernels are queued on one stream: a second thread would only wait for it)."""
    on_cpu = all(model.engine.device.type == "cpu" for model in models)
    return 2 if on_cpu and torch.get_num_threads() >= 2 else 1


def thread_shares(threads: int, model_threads: int) -> list[int | None]:
    """Torch threads of each model thread: `threads` split as evenly as they go (the first ones
    take the rest); [None] for one model thread, which keeps torch's setting as it is."""
    if model_threads < 1:
        raise ValueError(f"--model-threads must be at least 1, got {model_threads}")
    if model_threads == 1:
        return [None]
    if model_threads > threads:
        raise ValueError(f"--model-threads {model_threads} is more than the {threads} torch threads "
                         "(--threads) it splits; give each model thread one at least")
    return [threads // model_threads + (i < threads % model_threads) for i in range(model_threads)]


class Scheduler:
    def __init__(self, max_batch_tokens: int, metrics: Metrics, model_threads: int = 1):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.max_batch_tokens = max_batch_tokens
        self.metrics = metrics
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._loop, args=(share,), name=f"bertkit-model-{i}", daemon=True)
                         for i, share in enumerate(thread_shares(torch.get_num_threads(), model_threads))]
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix="bertkit-tokenize")
        self.runs = 0  # runner calls made (each one or more engine batches)
        self._running: dict[int, list[Job]] = {}  # the jobs each model thread runs now
        # the library's uses tokenize on the model thread with the engine's own tokenizer, whose
        # truncation is state: two model threads never run them on one tokenizer at once
        self._tokenizing: dict[int, threading.Lock] = {}
        self._trim, self._trimmed = _trimmer(), time.monotonic()
        self._untrimmed = False  # runs have freed memory since the last trim (glibc only)
        self._floor = resident_bytes()  # resident memory the last trim left (None: unknown)
        bound_thread_heaps()  # the model threads' heaps are beyond malloc_trim's reach (backend.malloc)
        for thread in self._threads:
            thread.start()

    # -- the event loop's side ---------------------------------------------------------------
    async def tokenize(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the tokenizing thread (the one user of each model's serve tokenizer)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer, fn, *args)

    async def submit(self, model: ServedModel, use: str, key: tuple, items: list[Any], tokens: int,
                     timing: Timing | None = None) -> list[Any]:
        """The runner's results for `items`, computed on the model thread with other jobs."""
        loop = asyncio.get_running_loop()
        job = Job(model, use, key, items, tokens, loop.create_future(), loop, timing=timing)
        with self._cond:
            if self._stopping:
                raise ServeError(ErrorType.UNHEALTHY, "the server is shutting down; retry on another "
                                 "instance", retry_after=1)
            self._queue.append(job)
            self.metrics.queue_size.set(len(self._queue))
            self._cond.notify()
        return await job.future  # cancelled with the request: the model thread then skips it

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads) and not self._stopping

    def pending(self, model: ServedModel) -> bool:
        """Whether a job for `model` is queued or running (DELETE /adapters waits for none)."""
        with self._cond:
            running = [job for jobs in self._running.values() for job in jobs]
            return any(job.model is model for job in (*self._queue, *running))

    async def stop(self, timeout: float = 60.0) -> None:
        """Finish every queued job, then end the model threads (called at shutdown)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            await asyncio.to_thread(thread.join, max(0.0, deadline - time.monotonic()))
        self._tokenizer.shutdown(wait=True)

    # -- the model thread --------------------------------------------------------------------
    def _take(self) -> list[Job]:
        """Jobs from the head of the queue within the token budget (at least one)."""
        jobs: list[Job] = []
        tokens = 0
        while self._queue:
            job = self._queue[0]
            if job.future.cancelled():  # the client is gone: drop its work
                self._queue.popleft()
                continue
            if jobs and tokens + job.tokens > self.max_batch_tokens:
                break
            jobs.append(self._queue.popleft())
            tokens += job.tokens
        self.metrics.queue_size.set(len(self._queue))
        return jobs

    def _loop(self, torch_threads: int | None) -> None:
        if torch_threads is not None:  # this thread's own count (OpenMP's is per thread)
            torch.set_num_threads(torch_threads)
        me = threading.get_ident()
        while True:
            with self._cond:
                if self._untrimmed and not self._queue and not self._stopping:
                    self._cond.wait(TRIM_EVERY)  # idle after runs: wake once to give their memory back
                idle = self._untrimmed and not self._queue and not self._stopping
                if not idle:
                    while not self._queue and not self._stopping:
                        self._cond.wait()
                    if not self._queue:
                        return  # stopping, and nothing left to do
                    jobs = self._running[me] = self._take()
            if idle:  # outside the lock: a request arriving meanwhile is queued, not held up
                self._give_back()
                continue
            groups: dict[tuple, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.group, []).append(job)
            for group in groups.values():
                self._run(group)
            with self._cond:
                self._running[me] = []
            self._untrimmed = self._trim is not None
            if self._untrimmed and (time.monotonic() - self._trimmed > TRIM_EVERY or self._grown()):
                self._give_back()

    def _grown(self) -> bool:
        """Whether resident memory is TRIM_GROWTH above what the last trim left."""
        now = resident_bytes()
        return now is not None and self._floor is not None and now > self._floor * (1 + TRIM_GROWTH)

    def _give_back(self) -> None:
        """The C heap's free pages back to the OS (malloc_trim), timed in /metrics."""
        start = time.monotonic()
        self._trim(0)
        self._trimmed, self._untrimmed = time.monotonic(), False
        self._floor = resident_bytes()
        self.metrics.trim_seconds.observe(self._trimmed - start)

    def _tokenizer_of(self, job: Job) -> contextlib.AbstractContextManager:
        """The lock of the engine tokenizer `job`'s run uses, or nothing when its inputs are token ids."""
        if job.use not in LIBRARY_USES or len(self._threads) == 1:
            return contextlib.nullcontext()
        with self._cond:
            return self._tokenizing.setdefault(id(job.model.engine.tokenizer), threading.Lock())

    def _run(self, jobs: list[Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]
        if not jobs:
            return
        first = jobs[0]
        start = time.perf_counter()
        for job in jobs:
            self.metrics.queue_seconds.labels(first.model.name).observe(start - job.enqueued)
        items = [item for job in jobs for item in job.items]
        try:
            with self._tokenizer_of(first):
                if any(job.model is not first.model for job in jobs):  # adapters of one base, mixed
                    results = run_mixed(first.use, [j.model for j in jobs for _ in j.items], first.key, items)
                else:
                    results = RUNNERS[first.use](first.model, first.key, items)
        except ValueError as err:  # the library refused an input (a text without [MASK], ...)
            if len(jobs) > 1:  # only the request at fault should fail: run them one by one
                for job in jobs:
                    self._run([job])
                return
            _resolve(first, error=validation(str(err)))
            return
        except Exception as err:  # noqa: BLE001  a model failure must answer, not hang the request
            log.exception("model %s failed on a %s run", first.model.name, first.use)
            for job in jobs:
                _resolve(job, error=ServeError(ErrorType.BACKEND, f"model {first.model.name} failed: "
                                               f"{type(err).__name__}: {err}"))
            return
        elapsed = time.perf_counter() - start
        labels = (first.model.name, first.use)
        self.metrics.inference_seconds.labels(*labels).observe(elapsed)
        self.metrics.batch_size.labels(*labels).observe(len(items))
        self.metrics.batch_tokens.labels(*labels).observe(sum(j.tokens for j in jobs))
        self.metrics.batch_requests.labels(*labels).observe(len(jobs))
        with self._cond:
            self.runs += 1
        offset = 0
        for job in jobs:
            if job.timing is not None:  # read by the request once its future is resolved
                job.timing.queue += start - job.enqueued
                job.timing.inference += elapsed
            _resolve(job, results[offset:offset + len(job.items)])
            offset += len(job.items)


def _resolve(job: Job, result: Any = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if job.future.done():  # cancelled meanwhile
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass
