"""Grading: is a predicted answer the expected one?

The equivalence lives in :mod:`mathagent.agent.answer`, where the agent's vote reads it too,
so grading and voting never disagree about a pair; this module is the evaluator's name for it.
"""

from __future__ import annotations

from mathagent.agent.answer import DEFAULT_TIMEOUT_S, answers_match, extract_answer

__all__ = ["DEFAULT_TIMEOUT_S", "answers_match", "extract_answer"]
