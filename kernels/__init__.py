"""Triton kernels, installed as ``llmctl.kernels`` (never as a top-level ``kernels`` package:
that name belongs to a Hugging Face package which transformers imports)."""
