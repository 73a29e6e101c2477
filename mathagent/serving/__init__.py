"""Engines behind one OpenAI-compatible surface: the embedded engine and external launchers."""
