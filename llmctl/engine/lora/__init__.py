"""Multi-LoRA serving: PEFT adapters chosen per request on one base model."""
