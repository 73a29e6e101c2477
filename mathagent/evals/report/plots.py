"""The report's plots, drawn with matplotlib and embedded as PNG data."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt


def png(fig: Any) -> str:
    """An <img> holding the figure (closed afterwards)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f"<img alt='plot' src='data:image/png;base64,{data}'>"


def k_plot(summary: Mapping[str, Any], ks: list[int]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(ks, [summary[f"majority@{k}"] for k in ks], "o-", label="majority@k")
    ax.plot(ks, [summary.get(f"pass@{k}", 0) for k in ks], "s--", label="pass@k")
    ax.set(xlabel="k (samples)", ylabel="accuracy (%)", xscale="log", ylim=(0, 100))
    ax.minorticks_off()
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def tokens_plot(records: Sequence[Mapping[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    right = [r["num_generated_tokens"] for r in records if r["is_correct"]]
    wrong = [r["num_generated_tokens"] for r in records if not r["is_correct"]]
    ax.hist(
        [right, wrong], bins=20, stacked=True, label=["correct", "wrong"], color=["#4a4", "#c44"]
    )
    ax.set(xlabel="generated tokens per sample", ylabel="samples")
    ax.legend()
    return fig


def latency_plot(records: Sequence[Mapping[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([r["latency_s"] for r in records], bins=20, color="#48c")
    ax.set(xlabel="latency per sample (s)", ylabel="samples")
    return fig


def speed_plot(rows: Sequence[Mapping[str, Any]]) -> Any:
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    axes[0].bar(names, [r["batch_tokens_per_s"] for r in rows], color="#48c")
    axes[0].set(title="batch tokens/s")
    axes[1].bar(
        names,
        [r["per_request_tokens_per_s"] for r in rows],
        yerr=[r["per_request_tokens_per_s_sd"] for r in rows],
        color="#4a4",
        capsize=4,
    )
    axes[1].set(title="per-request tokens/s (± sd)")
    axes[2].bar(names, [r["ttft_s"] for r in rows], color="#c84")
    axes[2].set(title="time to first token (s)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
