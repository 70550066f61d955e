"""The queue limit: a request's sequences (prompts × n) are counted when it arrives and given back
when its response ends, however it ends (finished, failed, or the client went away)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llmctl.server.protocol import APIError


@dataclass
class InFlight:
    """Sequences admitted and not yet given back, against max_num_seqs + max_queue_len."""

    max_num_seqs: int
    max_queue_len: int | None  # None: no limit, requests wait
    sequences: int = 0

    def admit(self, sequences: int) -> Admission:
        """Count at once, so simultaneous requests cannot all slip past the limit; beyond it refuse with
        503 + Retry-After rather than dropping anything."""
        if self.max_queue_len is not None:
            capacity = self.max_num_seqs + self.max_queue_len
            if self.sequences + sequences > capacity:
                raise APIError(f"the server is at capacity ({capacity} sequences in flight or queued, this "
                               f"request needs {sequences}); retry later", 503, headers={"Retry-After": "1"})
        self.sequences += sequences
        return Admission(self, sequences)


@dataclass
class Admission:
    counter: InFlight
    sequences: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.counter.sequences -= self.sequences


class AdmittedStream(StreamingResponse):
    """A streaming response that gives its admission back however it ends (done, error, disconnect)."""

    def __init__(self, admission: Admission, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.admission.release()
