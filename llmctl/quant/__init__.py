"""4-bit quantization written in torch: GPTQ, AWQ, their on-disk formats, calibration, perplexity."""
