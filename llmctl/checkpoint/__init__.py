"""What a checkpoint is, without running it: source, config facts (ModelSpec), weights files and headers,
tokenizer, license, on-disk quantization formats. No engine code is imported here."""
