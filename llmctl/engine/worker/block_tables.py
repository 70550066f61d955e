"""A worker's copy of every live sequence's block tables, kept in step by the changes each batch
carries (llmctl.engine.core.table_updates).

The host copy is one list per row and KV group: a batch's `block_tables` are filled with those
lists themselves, nothing copied. For the Triton backend the copy also lives on the device, one
int32 [rows, blocks] tensor per group: a step writes only its changed entries there (one small
transfer and an index_put), and attention reads its sequences' rows with one gather on the device
— not a host tensor of every table rebuilt and copied each step.
"""

from __future__ import annotations

import torch

from llmctl.engine.core.step_messages import StepBatch
from llmctl.kernels.transfer import to_device


class BlockTableCopy:
    def __init__(self, groups: int, device: torch.device | None) -> None:
        """`device`: where the tensor copy lives (None: host lists only, for backends that read lists)."""
        self.host: list[list[list[int]]] = [[] for _ in range(groups)]  # group -> row -> block ids
        self.device = device
        self.tables = [torch.zeros(16, 64, dtype=torch.int32, device=device)
                       for _ in range(groups)] if device is not None else []
        self.rows: torch.Tensor | None = None  # this step's rows on the device, in batch order

    def apply(self, batch: StepBatch) -> bool:
        """Write the batch's changes and fill its block tables from the copy. False: the batch came
        with whole tables (built outside the driver's step: profiling, draft proposals)."""
        if not batch.table_rows:
            self.rows = None
            return False
        written: list[list[int]] = [[] for _ in self.host]  # per group: row, column, block, row, column, ...
        for update in batch.table_updates:
            for group, blocks in enumerate(update.blocks):
                rows = self.host[group]
                rows.extend([] for _ in range(update.row + 1 - len(rows)))
                rows[update.row][update.start:] = blocks  # also drops entries past the new end
                for column, block in enumerate(blocks, update.start):
                    written[group] += (update.row, column, block)
        tables = [[self.host[group][row] for row in batch.table_rows] for group in range(len(self.host))]
        batch.block_tables, batch.group_block_tables = tables[0], tables[1:]
        if self.device is not None:
            self._write_device(written, max(batch.table_rows) + 1)
            self.rows = to_device(batch.table_rows, torch.long, self.device)
        return True

    def gathered(self, group: int, width: int) -> torch.Tensor | None:
        """This step's rows of one group's table, [B, width] int32 on the device (None: no device copy)."""
        if self.rows is None or not self.tables:
            return None
        return self.tables[group][:, :max(1, width)].index_select(0, self.rows)

    def _write_device(self, written: list[list[int]], rows_needed: int) -> None:
        for group, entries in enumerate(written):
            self._grow(group, rows_needed, max(entries[1::3], default=-1) + 1)
            if entries:
                where = to_device(entries, torch.long, self.device).view(-1, 3)
                self.tables[group][where[:, 0], where[:, 1]] = where[:, 2].to(torch.int32)

    def _grow(self, group: int, rows: int, columns: int) -> None:
        """Room for `rows` rows and `columns` blocks a row, doubling what is short."""
        table = self.tables[group]
        if rows <= table.shape[0] and columns <= table.shape[1]:
            return
        height, width = table.shape
        grown = torch.zeros(max(rows, 2 * height) if rows > height else height,
                            max(columns, 2 * width) if columns > width else width, dtype=torch.int32, device=self.device)
        grown[:height, :width] = table
        self.tables[group] = grown
