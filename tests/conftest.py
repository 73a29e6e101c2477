"""Shared fixtures: settings isolated from the developer's environment."""

from __future__ import annotations

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Remove every MATHAGENT_* variable so tests see the defaults."""
    import os

    for key in list(os.environ):
        if key.startswith("MATHAGENT_"):
            monkeypatch.delenv(key)
    return monkeypatch
