"""The CUDA fast path: Triton kernels, the compiled step, CUDA graphs, decode lookahead.

Imported only when a runner runs on a CUDA device with graphs on; the eager model stays the
reference every piece here is tested against.
"""
