"""The embedded PyTorch engine, inference only: model, loader, KV cache, scheduler, runner.

``cuda/`` holds the CUDA fast path (imported only when a runner uses it), ``spec_decode/``
speculative decoding, ``spec_config`` the one ``--speculative`` parser (torch-free).
"""
