"""A job to enqueue: its payload and options, checked as rowclaim's own `NewJob` checks them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional, Sequence, Union

#: The attempts a job gets unless told otherwise (rowclaim's `DEFAULT_MAX_ATTEMPTS`).
DEFAULT_MAX_ATTEMPTS = 25

Seconds = Union[timedelta, int, float]


@dataclass(frozen=True)
class Job:
    """One job: a JSON-serialisable payload and its options (None: rowclaim's default).

    - ``queue``: the queue (1 to 255 characters); default ``"default"``.
    - ``kind``: the job's kind, for routing; default ``""``.
    - ``priority``: higher runs first; default 0.
    - ``run_at``: run no earlier than this (timezone-aware) time, or
    - ``delay``: no earlier than now plus this (a timedelta or seconds), by the database's clock.
    - ``max_attempts``: runs before it is dead; default 25.
    - ``unique_key``: while a job with this key is ready or running, enqueueing returns its id.
    - ``limit_key``: the key its queue's per-key limits count it under.
    - ``timeout``: how long one run may take (a timedelta or seconds); default the worker's.
    - ``after``: the ids of jobs it waits for: it is enqueued ``waiting`` and runs once all of
      them completed; if one ended dead or cancelled, it is cancelled (naming that job).
    - ``run_anyway``: with ``after``, run also when one of them ended dead or cancelled.
    """

    payload: Any = None
    queue: Optional[str] = None
    kind: Optional[str] = None
    priority: Optional[int] = None
    run_at: Optional[datetime] = None
    delay: Optional[Seconds] = None
    max_attempts: Optional[int] = None
    unique_key: Optional[str] = None
    limit_key: Optional[str] = None
    timeout: Optional[Seconds] = None
    after: Optional[Sequence[int]] = None
    run_anyway: Optional[bool] = None

    def payload_json(self) -> str:
        """The payload as JSON text (None: ``{}``)."""
        return json.dumps({} if self.payload is None else self.payload)

    def check(self) -> None:
        """Raises ValueError, naming the option, for what rowclaim would refuse."""
        if self.queue is not None and not 1 <= len(self.queue) <= 255:
            raise ValueError("queue name must have 1 to 255 characters")
        if self.kind is not None and len(self.kind) > 255:
            raise ValueError("kind is longer than 255 characters")
        if self.priority is not None and not -(2**31) <= self.priority < 2**31:
            raise ValueError(f"priority must be a 32-bit integer, not {self.priority}")
        if self.max_attempts is not None and not 1 <= self.max_attempts < 2**31:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.unique_key is not None and len(self.unique_key) > 255:
            raise ValueError("unique_key is longer than 255 characters")
        if self.limit_key is not None and not 1 <= len(self.limit_key) <= 255:
            raise ValueError("limit_key must have 1 to 255 characters")
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware, e.g. datetime.now(timezone.utc)")
        if self.delay is not None and _seconds(self.delay) < 0:
            raise ValueError("delay must not be negative")
        if self.timeout is not None and self.timeout_ms() == 0:
            raise ValueError("timeout must be at least one millisecond")
        ids = self.after_ids()
        if ids and self.unique_key is not None:
            raise ValueError("a job that waits for other jobs (after) cannot have a unique key")
        if self.run_anyway is not None and not isinstance(self.run_anyway, bool):
            raise ValueError(f"run_anyway must be True or False, not {self.run_anyway!r}")
        self.payload_json()

    def after_ids(self) -> Optional[list[int]]:
        """``after`` as a list of job ids (None when it waits for nothing)."""
        if self.after is None:
            return None
        if isinstance(self.after, (str, bytes)):
            raise ValueError("after must be a sequence of job ids, not a string")
        ids = list(self.after)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise ValueError(f"after must hold job ids (integers), not {i!r}")
        return ids or None

    def run_at_ms(self) -> Optional[int]:
        """``run_at`` in milliseconds since the Unix epoch."""
        if self.run_at is None:
            return None
        return int(self.run_at.timestamp() * 1000)

    def delay_ms(self) -> int:
        """``delay`` in milliseconds (0 when none)."""
        return 0 if self.delay is None else int(_seconds(self.delay) * 1000)

    def delay_interval(self) -> Optional[timedelta]:
        """``delay`` as a timedelta (None when none)."""
        return None if self.delay is None else timedelta(seconds=_seconds(self.delay))

    def timeout_ms(self) -> Optional[int]:
        """``timeout`` in milliseconds."""
        if self.timeout is None:
            return None
        ms = int(_seconds(self.timeout) * 1000)
        if ms <= 0:
            return 0
        return ms


def _seconds(value: Seconds) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a timedelta or seconds, not {type(value).__name__}")
    return float(value)
