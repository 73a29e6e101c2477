"""The lookahead's captured decode steps, as bookkeeping (CPU; the captures themselves and the
tokens they give run in tests/serving/engine/cuda): one per bucket, warp and sink count, made
again when the runner captures its one-token graph again, and the stale ones let go."""

from __future__ import annotations

from mathagent.serving.engine.cuda import lookahead


class _Runner:
    """The part of ``CudaGraphRunner`` the lookahead reads to find a step's forward graph."""

    def __init__(self) -> None:
        self.graphs: dict[tuple[int, int], tuple] = {}

    def decode_entry(self, bucket: int) -> tuple[tuple[int, int], tuple]:
        key = (bucket, 1)
        if key not in self.graphs:
            self.graphs[key] = (object(), object(), ())  # a new capture: a new entry
        return key, self.graphs[key]


def test_steps_are_kept_per_bucket_and_let_go_with_the_forward_they_were_captured_on(monkeypatch):
    look = object.__new__(lookahead.DecodeLookahead)  # no CUDA stream on this host
    look.graphs, look.sinks, look._steps = _Runner(), [], {}
    captured = []

    def capture(source, bucket, cuts):
        captured.append(bucket)
        return lookahead._StepGraphs(source, (None, None), None, None, cuts is not None)

    monkeypatch.setattr(look, "_capture", capture)
    one, four = look._step_graphs(1, None), look._step_graphs(4, None)
    assert look._step_graphs(1, None) is one and look._step_graphs(4, None) is four
    assert captured == [1, 4]
    look.graphs.graphs.clear()  # the runner dropped its graphs (an EAGLE-3 head's kept layers)
    look.sinks.append(lambda slots, write, streams: None)
    again = look._step_graphs(1, None)
    assert again is not one and again.source is look.graphs.graphs[(1, 1)]
    assert captured == [1, 4, 1]
    assert list(look._steps.values()) == [again]  # bucket 4's old steps went too
