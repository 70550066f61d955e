"""The paged-attention inference engine: scheduler, block manager, runner, models, sampling."""
