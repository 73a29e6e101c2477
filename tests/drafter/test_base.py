"""The frozen base trains on a runner and KV cache of its own, never on a serving engine's."""

from __future__ import annotations

from mathagent.drafter.base import FrozenBase


def test_the_base_gets_its_own_cache_even_from_an_engines_weights(engine) -> None:
    base = FrozenBase(engine.loaded, engine.config)
    assert base.model is engine.runner.model  # the weights are shared, not copied
    ours, theirs = base.runner.cache, engine.runner.cache
    assert ours is not theirs and base.runner is not engine.runner
    for mine, other in ((ours.k, theirs.k), (ours.v, theirs.v)):
        assert mine.untyped_storage().data_ptr() != other.untyped_storage().data_ptr()
    hidden, preds = base.features([engine.encode("1 + 1 =")])[0]
    assert hidden.shape == (len(engine.encode("1 + 1 =")), 576) and preds.shape == hidden.shape[:1]
