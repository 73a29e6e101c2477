"""The embedded PyTorch engine: model, KV cache, scheduler, speculative decoding."""
