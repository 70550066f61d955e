"""Benchmarks: a load generator for OpenAI-compatible servers and an in-process engine benchmark."""
