"""The FP8 accuracy guard: two servers' greedy evals on the same sets, and where they part.

``mathagent eval --no-tools --temperature 0`` runs on each set against the reference row
(BF16) and the candidate (FP8), all evals at once (they are graded, not timed). Per set: each
row's accuracy and the problems where the two differ in correctness; per problem, whether the
generations are identical and, when not, the first divergence in tokens (the length, in the
model's tokenizer, of the two texts' common prefix; characters when no tokenizer is found).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from bench_fleet import Row, cli_json


def guard(ref: Row, cand: Row, args: Any, tokenizer: Any | None) -> dict:
    """Evals of both rows on every ``args.eval_set``, compared set by set."""
    jobs = {}
    with ThreadPoolExecutor(2 * len(args.eval_set)) as pool:
        for spec in args.eval_set:
            for row in (ref, cand):
                out = args.work / f"eval-{Path(spec).stem}-{row.name}"
                cmd = ["eval", "--dataset", spec, "--out", str(out), "--no-tools"]
                cmd += ["--limit", str(args.eval_limit), "--temperature", "0", "--concurrency"]
                cmd += [str(max(int(c) for c in args.concurrency.split(",")))]
                cmd += ["--max-tokens", str(args.eval_max_tokens)]
                env = {"MATHAGENT_BASE_URL": f"{row.url}/v1"}
                jobs[spec, row.name] = (out, pool.submit(cli_json, cmd, env, 1800), cmd)
    sets = {}
    for spec in args.eval_set:
        (ref_out, ref_job, cmd), (cand_out, cand_job, _) = (
            jobs[spec, ref.name],
            jobs[spec, cand.name],
        )
        summaries = {ref.name: ref_job.result(), cand.name: cand_job.result()}
        sets[Path(spec).stem] = {
            "command": "mathagent " + " ".join(cmd),
            "accuracy": {n: _accuracy(s) for n, s in summaries.items()},
            "errors": {n: s["error"] for n, s in summaries.items() if "error" in s},
            **compare(_records(ref_out), _records(cand_out), tokenizer),
        }
    return {"reference": ref.name, "candidate": cand.name, "tools": False, "sets": sets}


def _accuracy(summary: dict) -> float | None:
    return next((v for k, v in summary.items() if k.startswith("pass@1")), None)


def _records(out: Path) -> dict[str, dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["id"]): r for r in rows if r.get("sample", 0) == 0}


def compare(ref: dict[str, dict], cand: dict[str, dict], tokenizer: Any | None) -> dict:
    """Correctness and first-divergence statistics of the problems both rows finished."""
    both = [k for k in ref if k in cand]
    firsts, flips = [], []
    identical = same_answer = 0
    for key in both:
        a, b = ref[key].get("generation") or "", cand[key].get("generation") or ""
        identical += a == b
        same_answer += ref[key].get("predicted_answer") == cand[key].get("predicted_answer")
        if a != b:
            firsts.append(_first_divergence(a, b, tokenizer))
        if bool(ref[key].get("is_correct")) != bool(cand[key].get("is_correct")):
            flips.append({"id": key, "reference_correct": bool(ref[key].get("is_correct"))})
    correct = {n: sum(bool(r[k].get("is_correct")) for k in both) for n, r in (("ref", ref), ("cand", cand))}  # fmt: skip
    return {
        "problems": len(both),
        "correct": {"reference": correct["ref"], "candidate": correct["cand"]},
        "identical_generations": identical,
        "same_answer": same_answer,
        "correctness_flips": flips,
        "first_divergence_unit": "tokens" if tokenizer is not None else "characters",
        "first_divergence": _stats(firsts),
        "first_divergences": sorted(firsts),
    }


def _first_divergence(a: str, b: str, tokenizer: Any | None) -> int:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if tokenizer is None:
        return n
    return len(tokenizer.encode(a[:n], add_special_tokens=False).ids)


def _stats(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "min": min(values), "median": median(values), "max": max(values)}
