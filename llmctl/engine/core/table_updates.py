"""Block tables sent as what changed: each live sequence has a row in every worker's copy of the
tables (llmctl.engine.worker.block_tables), and a step carries only the entries written since the
last step that sent that row — new blocks appended, and the few rewritten in place (copy-on-write,
slid out of the window, trimmed after speculation, all of them after preemption), which the block
manager marks on the sequence. As vLLM v1's scheduler sends new block ids, not whole tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.engine.core.block_manager import SLID_OUT
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import TableUpdate

UNCHANGED = 1 << 62  # a sequence's tables_changed_from once its tables were sent


@dataclass
class TableRows:
    """The driver's side: which row each live sequence has, and how much of its tables was sent."""

    rows: dict[int, int] = field(default_factory=dict)  # seq_id -> row
    sent: dict[int, int] = field(default_factory=dict)  # seq_id -> entries the workers hold
    free_rows: list[int] = field(default_factory=list)
    next_row: int = 0

    def release(self, seq_ids: list[int]) -> None:
        """Sequences whose blocks were freed (finished, aborted, preempted): their rows are reused."""
        for seq_id in seq_ids:
            row = self.rows.pop(seq_id, None)
            if row is not None:
                self.free_rows.append(row)
                del self.sent[seq_id]
        seq_ids.clear()

    def update(self, seq: Sequence) -> tuple[int, TableUpdate | None]:
        """The sequence's row, and what the workers must write into it before this step (None: nothing)."""
        row = self.rows.get(seq.seq_id)
        if row is None:
            row = self.free_rows.pop() if self.free_rows else self._new_row()
            self.rows[seq.seq_id], self.sent[seq.seq_id] = row, 0
        length = len(seq.block_table)
        start = min(self.sent[seq.seq_id], seq.tables_changed_from, length)
        unchanged = start == length == self.sent[seq.seq_id]
        self.sent[seq.seq_id], seq.tables_changed_from = length, UNCHANGED
        if unchanged:
            return row, None
        return row, TableUpdate(row, start, [[0 if b == SLID_OUT else b for b in table[start:]]
                                             for table in seq.block_tables])

    def _new_row(self) -> int:
        self.next_row += 1
        return self.next_row - 1
