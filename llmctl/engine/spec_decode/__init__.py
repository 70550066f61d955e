"""Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the verifier that
accepts their tokens exactly as the target model would have produced them."""
