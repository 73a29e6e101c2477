"""The one answer module: extraction, normal form and equivalence, for every reader of answers.

The agent's vote (:func:`~mathagent.agent.solver.majority_vote`), the grader
(:func:`mathagent.evals.grading.answers_match`), ``/solve`` and the report all read answers
here, so a pair the grader calls equal is one answer to the vote.
"""

from mathagent.agent.answer.equivalence import (
    DEFAULT_TIMEOUT_S,
    answers_match,
    cluster_answers,
    same_answer,
)
from mathagent.agent.answer.extract import (
    DEFAULT_THINK,
    ThinkTags,
    after_thinking,
    extract_answer,
    last_boxed,
)
from mathagent.agent.answer.normal import normalize_answer

__all__ = [
    "DEFAULT_THINK",
    "DEFAULT_TIMEOUT_S",
    "ThinkTags",
    "after_thinking",
    "answers_match",
    "cluster_answers",
    "extract_answer",
    "last_boxed",
    "normalize_answer",
    "same_answer",
]
