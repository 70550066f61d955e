"""The workers' side of image encoders: each image's embeddings, computed once by the model's encoder and
kept by content hash until the scheduler frees them; merged into a step's token embeddings."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from llmctl.engine.core.step_messages import StepBatch


class EncoderCache:
    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.outputs: dict[str, torch.Tensor] = {}  # content hash -> [placeholders, hidden]
        self.encoded: Counter[str] = Counter()  # encodes by content hash (tests read it: a chunked or preempted
        # prompt encodes each image once)

    def update(self, batch: StepBatch) -> None:
        for content_hash in batch.encoder_frees:
            self.outputs.pop(content_hash, None)
        for image in batch.encoder_inputs:
            data = {name: tensor.to(self.device) for name, tensor in image.data.items()}
            self.outputs[image.content_hash] = self.model.encode_image(data)  # type: ignore[operator]
            self.encoded[image.content_hash] += 1

    def merge(self, batch: StepBatch, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's token embeddings with each image placeholder's row replaced by its image's embedding;
        and where an encoder output is wider than the embeddings (Qwen3-VL's DeepStack features beside it),
        the rest of each row, zero for text."""
        hidden, extra = embeddings.shape[-1], None
        for piece in batch.embedding_slices:
            output = self.outputs[piece.content_hash]
            rows = torch.tensor(piece.rows, device=embeddings.device)
            picked = output[torch.tensor(piece.sources, device=output.device)].to(embeddings.dtype)
            embeddings[rows] = picked[:, :hidden]
            if picked.shape[1] > hidden:
                if extra is None:
                    extra = embeddings.new_zeros(embeddings.shape[0], picked.shape[1] - hidden)
                extra[rows] = picked[:, hidden:]
        return embeddings, extra
