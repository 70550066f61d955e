"""The arithmetic `plan` and the engine share, on plain values: weights per rank, KV bytes and pools, memory
budgets, LoRA slots, and which TP × PP layouts a model allows."""
