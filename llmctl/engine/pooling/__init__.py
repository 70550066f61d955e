"""Pooling models on the paged engine: embeddings, classifiers (cross-encoders, rerankers) and reward models."""
