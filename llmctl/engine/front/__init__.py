"""The engine's front: LLMEngine (the step), the output processor, the async engine, data
parallelism, the offline LLM class and the outputs users receive."""
