"""mathagent: a tool-calling math agent with sandboxed execution on a speculative-decoding engine."""

__version__ = "0.1.0"
