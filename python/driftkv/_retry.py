"""The retry and deadline rules of docs/api.md ("Retries and deadlines"),
shared by driftkv.Client and driftkv.aio.Client.

Every attempt has its own deadline (`timeout`). A call is retried only on
UNAVAILABLE (the request may not have reached the server, or its answer was
lost) and only where a repeat is harmless:

  Append                         retried (stored tokens are acknowledged, not stored twice)
  Attend without decode steps    retried (read-only)
  Attend, every step indexed     retried (the repeat is acknowledged)
  Attend, a step without index   never (a repeat would append the token twice)
  Read                           retried, resuming after the last chunk received
  Release                        retried; NOT_FOUND on a repeat means the first attempt freed it
  Fork                           never (a repeat would be ALREADY_EXISTS; Length says if it was made)
  Length, Info, Stats            retried (read-only)
  Lookup, Prefetch               retried (read-only; idempotent)
  Pin                            retried (a repeat replaces the pin with itself)
  Unpin                          never (a repeat after a lost answer would be NOT_FOUND)
  WatchPages                     never (subscribe again and rebuild the picture)

Backoff: 20 ms doubling to 1 s, each sleep drawn uniformly in
[backoff / 2, backoff], at most `max_attempts` attempts (4).
"""
import random
from dataclasses import dataclass
from typing import Iterator

import grpc


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4          # attempts of a retried call (first try + 3)
    initial_backoff: float = 0.020  # seconds
    max_backoff: float = 1.0

    def sleeps(self, idempotent: bool) -> Iterator[float]:
        """Seconds to sleep before each attempt (0 before the first)."""
        attempts = max(1, self.max_attempts) if idempotent else 1
        backoff = self.initial_backoff
        for attempt in range(attempts):
            if attempt == 0:
                yield 0.0
            else:
                yield backoff * random.uniform(0.5, 1.0)
                backoff = min(backoff * 2, self.max_backoff)


def retryable(error: grpc.RpcError) -> bool:
    return error.code() == grpc.StatusCode.UNAVAILABLE
