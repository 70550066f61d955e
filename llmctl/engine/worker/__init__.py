"""A worker's side: load the model, size and allocate its KV cache, run forward passes
(with captured CUDA graphs where they apply). Workers own weights, KV and forwards only."""
