"""Several models behind one `llmctl serve --models NAME=PATH …`: each model is a `llmctl serve` process of its own,
started on first use and stopped when the least recently used must make room (catalog, model_process, pool), and
one front routes each request by its `model` field (app)."""
