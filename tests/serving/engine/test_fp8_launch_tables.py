"""Which launch shape an FP8 multi-row product takes (``cuda/fp8.py``): pure dispatch, no GPU."""

from __future__ import annotations

from mathagent.serving.engine.cuda import fp8
from mathagent.serving.engine.cuda.fp8 import RowsConfig


def test_verify_widths_take_the_split_shapes_and_wider_batches_the_rows_table(monkeypatch):
    monkeypatch.setitem(fp8.ROWS_CONFIGS, (640, 512), RowsConfig(64, 256, 4, 5))
    monkeypatch.setitem(fp8.FEW_ROWS_CONFIGS, (640, 512), RowsConfig(64, 128, 4, 3, split=2))
    monkeypatch.setitem(fp8.ROWS_CONFIGS, (320, 512), RowsConfig(64, 128, 4, 2))
    for rows in range(2, fp8.FEW_ROWS + 1):
        assert fp8.rows_config(640, 512, rows).split == 2
    for rows in range(fp8.FEW_ROWS + 1, fp8.MAX_ROWS + 1):
        assert fp8.rows_config(640, 512, rows) == fp8.ROWS_CONFIGS[(640, 512)]
    assert fp8.rows_config(320, 512, 4) == fp8.ROWS_CONFIGS[(320, 512)]  # no split shape listed


def test_every_listed_launch_shape_fits_its_weight():
    """A split must divide K into whole tiles: a table entry that does not would read past
    its stretch of K."""
    for table in (fp8.ROWS_CONFIGS, fp8.FEW_ROWS_CONFIGS):
        for (_, k), cfg in table.items():
            assert cfg.fits(k), (k, cfg)
    assert not RowsConfig(64, 256, 4, 3, split=3).fits(4096)
    assert not RowsConfig(64, 256, 4, 3, split=32).fits(4096)  # 128-wide stretches of 256 tiles
    assert RowsConfig(64, 256, 4, 3, split=2).fits(14336)
