"""Drafter tests share the session engine of tests/conftest.py."""

from __future__ import annotations

import torch

torch.set_num_threads(1)  # the machine is shared; one thread degrades least under load
