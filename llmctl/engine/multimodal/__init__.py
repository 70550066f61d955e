"""Images in prompts: inputs → the model's processor → items with content hashes → encoder budget and cache
→ embeddings merged at the placeholder positions."""
