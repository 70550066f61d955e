"""The driver's core: sequences, the scheduler, the KV block manager, the sampler and the
messages a driver sends its workers each step. Nothing here runs a model."""
