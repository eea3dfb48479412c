"""Admission and back-pressure: how much work the service takes, and what it refuses.

As text-embeddings-inference does (`core/infer.rs`): a pool of permits, one per input in flight
(queued, tokenizing or in the model); a request takes one permit per input before any work and
gives them back when it answers, however it ends (success, error, client gone). When too few are
free it is answered 429 at once, with Retry-After, instead of waiting: a queue that grows without
bound only turns overload into timeouts for everyone.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertkit.serve.errors import ErrorType, ServeError, validation


@dataclass
class Limits:
    # TEI's defaults, so a client tuned against TEI sees the same limits.
    max_concurrent_requests: int = 512  # inputs in flight, all requests together
    max_client_batch_size: int = 32  # inputs in one request
    # inputs in one /v1/embeddings request: OpenAI's own limit, since its client libraries send
    # hundreds at a time; admitted a slice at a time (`slice_size`), so it never needs more
    # permits than a slice's.
    openai_max_batch_size: int = 2048
    max_batch_tokens: int = 8192  # real tokens per model run (the engine's token budget)
    payload_limit: int = 2_000_000  # bytes of request body
    auto_truncate: bool = False  # True: inputs over the model's limit are cut, not refused
    retry_after: int = 1  # seconds a 429 asks the client to wait

    def __post_init__(self) -> None:
        for name in ("max_concurrent_requests", "max_client_batch_size", "max_batch_tokens",
                     "payload_limit", "openai_max_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_client_batch_size > self.max_concurrent_requests:
            raise ValueError(f"--max-client-batch-size {self.max_client_batch_size} is more than "
                             f"--max-concurrent-requests {self.max_concurrent_requests}, so a full "
                             "request could never be admitted; lower it or raise the other")

    def check_batch(self, field: str, n: int, openai: bool = False) -> None:
        limit, flag = ((self.openai_max_batch_size, "openai_max_batch_size") if openai
                       else (self.max_client_batch_size, "max_client_batch_size"))
        if n > limit:
            raise validation(f"`{field}` has {n} inputs, more than {flag} {limit}; split the request "
                             f"(or start the server with a larger --{flag.replace('_', '-')})")

    @property
    def slice_size(self) -> int:
        """Inputs a request has in flight at once, hence the permits it holds: a request larger
        than this (only /v1/embeddings allows one) runs in slices of this many, one after the
        other, holding this many permits throughout. Half the pool, so two large requests run
        side by side and a third is told to come back (429) rather than queued without bound;
        at least a full --max-client-batch-size, so every TEI request runs in one slice."""
        return max(self.max_client_batch_size, self.max_concurrent_requests // 2)


class Admission:
    """Permits for inputs in flight. Used from the event loop only, so a counter is enough."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.capacity = limits.max_concurrent_requests
        self.free = self.capacity

    def acquire(self, n: int) -> "Permit":
        if n > self.free:
            raise ServeError(ErrorType.OVERLOADED,
                             f"model is overloaded: {self.capacity - self.free} of "
                             f"max_concurrent_requests {self.capacity} inputs in flight, this "
                             f"request needs {n}; retry after {self.limits.retry_after} s",
                             retry_after=self.limits.retry_after)
        self.free -= n
        return Permit(self, n)

    @property
    def in_flight(self) -> int:
        return self.capacity - self.free


class Permit:
    def __init__(self, admission: Admission, n: int):
        self.admission, self.n = admission, n

    def release(self) -> None:
        if self.n:
            self.admission.free += self.n
            self.n = 0

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
