"""The source's speed table from the project's own tools, and the FP8 accuracy guard.

Rows are embedded servers (``mathagent serve --engine embedded``, one per configuration:
BF16, FP8, FP8+ReDrafter, FP8+EAGLE-3 on a Hopper GPU; fp32/bf16 twins elsewhere, where fp8 is
refused). ``mathagent bench`` runs over all of them at each concurrency (total generation
time, batch tok/s, per-request tok/s, TTFT, acceptance length from ``/metrics``, accuracy),
after an untimed warm-up bench on other problems (CUDA graphs are captured per batch and
width shape on first use; prefix caching would otherwise credit the timed run with the
warm-up's prompts). Then the guard: ``mathagent eval --no-tools`` greedy on each set for
the two guard rows, with per-set accuracy and where their generations first diverge
(:mod:`bench_guard`). Prints and writes one JSON. On the H200 (see GPU_NOTES.md):

    python benchmarks/bench_table.py --model MODEL.gguf --bench-set c1.jsonl \
        --bench-set c16.jsonl --warm-set sample --eval-set sample --eval-set gsm8k100.jsonl --out table.json

The 8B shape's rows: ``--model random:llama-3-8b:stable --tokenizer DEFAULT.gguf --rows
bf16,fp8,fp8+replay3`` (random weights whose greedy path rounding cannot change, so the
replayed continuation holds when the policy takes plain steps: with ``random:llama-3-8b`` the
replay rows of run 37 measured acceptance 1.0; the stand-in tokenizer's ids are valid in the 8B
vocabulary, its generated ids beyond the tokenizer's decode to nothing and are counted from
``usage``). ``+replayN`` rows are acceptance-controlled speculation: ``replay_server.py`` (the
project's server and engine, the replay proposer its default method) drafts the target's own
continuation with acceptance length N.

Tools-on evaluation needs the Docker sandbox; where none exists (the GPU machine) the guard is
tools off, and the JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_fleet import Fleet, Row, cli_json, default_rows
from bench_guard import guard

MAIN = Path(__file__).resolve().parents[1]
DRAFTERS = MAIN / "mathagent" / "serving" / "drafters"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model path (the default model's GGUF)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--tokenizer", help="for a random: model: a tokenizer (the default model's "
                   "GGUF) so the servers take chat requests (MATHAGENT_ENGINE__TOKENIZER)")  # fmt: skip
    p.add_argument("--rows", help="comma list of BASE[+SPEC] (default: by device)")
    p.add_argument("--redrafter", default=str(DRAFTERS / "SmolLM2-135M-Instruct"))
    p.add_argument("--eagle3", default=str(DRAFTERS / "SmolLM2-135M-Instruct-eagle3"))
    p.add_argument(
        "--bench-set",
        action="append",
        default=[],
        help="dataset of the timed bench, one per concurrency in order (distinct "
        "problems, so no level reuses another's cached prompts); none: the guard alone",
    )
    p.add_argument("--warm-set", default="sample", help="dataset of the untimed warm-up")
    p.add_argument("--replay-draft-len", type=int, default=4,
                   help="draft length of +replayN rows (gpu_bench.py's: 4)")  # fmt: skip
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--limits", default="8,32", help="problems per timed bench, per concurrency")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--eval-set", action="append", default=[], help="guard set, repeatable")
    p.add_argument("--eval-limit", type=int, default=100)
    p.add_argument("--eval-max-tokens", type=int, default=1024)
    p.add_argument("--guard-rows", help="two rows: reference,candidate (default: first two)")
    p.add_argument("--port", type=int, default=8100, help="first server's port")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--work", type=Path, default=Path("bench-table-work"))
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def bench_all(
    rows: list[Row], args: argparse.Namespace, levels: list[int], into: dict, save: Callable
) -> None:
    """Warm every server at each concurrency (in parallel: untimed), then the timed benches;
    each level's table goes ``into`` {"tables", "warm_s"}, then ``save``."""
    endpoints = [a for r in rows for a in ("--endpoint", f"{r.name}={r.url}")]
    base = ["--max-tokens", str(args.max_tokens), "--temperature", "0"]
    timed, warm_s = into["tables"], into["warm_s"]
    limits = [int(n) for n in args.limits.split(",")]
    for c, limit, dataset in zip(levels, limits, args.bench_set, strict=True):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(rows) or 1) as pool:
            warm = [
                pool.submit(cli_json, ["bench", "--endpoint", f"{r.name}={r.url}", "--dataset",
                            args.warm_set, "--limit", str(max(c, 2)), "--concurrency", str(c),
                            "--out", str(args.work / f"warm-c{c}-{r.name}"), *base], {}, 900)
                for r in rows
            ]  # fmt: skip
            warm_errors = [w.result().get("error") for w in warm]
        warm_s[f"c{c}"] = round(time.perf_counter() - t0, 2)
        cmd = ["bench", *endpoints, "--dataset", dataset, "--limit", str(limit)]
        cmd += ["--concurrency", str(c), "--out", str(args.work / f"bench-c{c}"), *base]
        table = cli_json(cmd, {}, 1800)
        table["command"] = "mathagent " + " ".join(cmd)
        table["warm_errors"] = [e for e in warm_errors if e]
        timed[f"c{c}"] = table
        save(f"bench c{c}")


def replay_command(row: Row, args: argparse.Namespace, levels: list[int]) -> None:
    """A ``+replayN`` row serves through ``replay_server.py``, told every problem it will see
    (each timed set at its concurrency, the warm-up set at the highest)."""
    spec = row.name.partition("+")[2]
    if not spec.startswith("replay"):
        return
    sets = [f"{d}:{c}" for d, c in zip(args.bench_set, levels, strict=False)]
    sets.append(f"{args.warm_set}:{max(levels)}")
    limit = max([*(int(n) for n in args.limits.split(",")), *levels, 2])
    row.command = [sys.executable, str(MAIN / "benchmarks" / "replay_server.py"),
                   "--accept", spec.removeprefix("replay"), "--max-tokens", str(args.max_tokens),
                   "--limit", str(limit), *(a for s in sets for a in ("--prompts", s))]  # fmt: skip
    row.env["MATHAGENT_ENGINE__DRAFT_LEN"] = str(args.replay_draft_len)


def main() -> None:
    args = parse_args()
    device = resolve_device(args.device)
    names = args.rows.split(",") if args.rows else default_rows(device)
    drafters = {"redrafter": args.redrafter, "eagle3": args.eagle3}
    rows = [Row.parse(n, args.port + i, device, drafters) for i, n in enumerate(names)]
    levels = [int(c) for c in args.concurrency.split(",")]
    for row in rows:
        replay_command(row, args, levels)
    common = {"MATHAGENT_MODEL": args.model, "MATHAGENT_ENGINE__MAX_BATCH_SIZE": str(max(levels))}
    if args.tokenizer:
        common["MATHAGENT_ENGINE__TOKENIZER"] = args.tokenizer
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict = {"meta": _meta(args, device, rows, common)}

    def save(phase: str) -> None:  # after every phase: a run cut short keeps what it finished
        result["done"], result["wall_s"] = phase, round(time.perf_counter() - t0, 1)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    with Fleet(rows, common, args.start_timeout) as fleet:
        result["servers"] = {r.name: {"start_s": r.start_s, "error": r.error} for r in rows}
        save("servers")
        result["bench"] = {"tables": {}, "warm_s": {}}
        if fleet.up and args.bench_set:
            bench_all(fleet.up, args, levels, result["bench"], save)
        ref, _, cand = (args.guard_rows or ",".join(names[:2])).partition(",")
        up = {r.name: r for r in fleet.up}
        if args.eval_set and ref in up and cand in up:  # (one row: no guard)
            result["guard"] = guard(up[ref], up[cand], args, _tokenizer(args))
    save("all")
    print(args.out.read_text())


def _tokenizer(args: argparse.Namespace) -> object | None:
    """The converted model's tokenizer (first divergence in tokens), if the cache has it."""
    from mathagent.config import Settings

    found = sorted(Settings().model_dir.glob(f"{Path(args.model).stem}*/tokenizer.json"))
    if not found:
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(found[0]))


def _meta(args: argparse.Namespace, device: str, rows: list[Row], common: dict) -> dict:
    meta = {"device": device, "host": platform.node(), "model": args.model, "env": common,
            "rows": {r.name: r.env for r in rows}, "max_tokens": args.max_tokens,
            "limits": args.limits, "bench_sets": args.bench_set,
            "warm_set": args.warm_set, "tools": False}  # fmt: skip
    # settings the servers inherit from this process's environment shape the rows too
    inherited = {k: v for k, v in os.environ.items() if k.startswith("MATHAGENT_")}
    meta["inherited_env"] = {k: v for k, v in sorted(inherited.items()) if k not in common}
    try:
        import torch

        meta["torch"] = torch.__version__
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return meta


if __name__ == "__main__":
    main()
