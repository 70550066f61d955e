"""Code the tests share (no test module imports another): models, references, servers, hub caches."""
