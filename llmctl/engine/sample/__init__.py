"""Sampling: the sampler (temperature, top-k/p, penalties, logit bias), the step sampler, bad words, and
speculative decoding's rejection sampling."""
