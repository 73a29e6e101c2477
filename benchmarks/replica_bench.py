"""Eval throughput over two embedded replicas against one, on the CPU.

Starts ``mathagent serve --engine embedded --replicas 2`` (the default model, from
``MATHAGENT_CACHE_DIR``'s ``models/`` as the CLI finds it; ``--device cpu``, eager; on CPU each
replica gets ``--threads-per-replica`` torch threads: 1 on the 2-core machine, 4 on a 16-core
one so two replicas and the eval process fit), then runs the same ``mathagent eval`` (greedy, tools off, fixed
problems, samples and token budget) against replica 0 alone with ``--concurrency C`` and
against both with ``--concurrency 2C`` (the same load per replica), alternating, ``--rounds``
times. Throughput is taken from results.jsonl: samples and generated tokens over the span from
the first sample's start to the last one's end (process start-up excluded). Prints one JSON
object: each run, the median speedup, the load average around the runs, and how many answers
agree between the one- and two-replica runs; ``--json-out`` also writes it after every
round, so a run cut short keeps the rounds it finished. Goal: two replicas >= 1.8x one.

    flock /tmp/mathagent-bench.lock .venv/bin/python benchmarks/replica_bench.py
    python benchmarks/replica_bench.py --threads-per-replica 4 --rounds 3 --json-out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_replicas(port: int, threads: int) -> tuple[subprocess.Popen, list[str]]:
    env = {**os.environ, "MATHAGENT_ENGINE__THREADS": str(2 * threads)}  # split in two
    env["MATHAGENT_ENGINE__DEVICE"] = "cpu"  # also where a GPU is visible: this is the CPU bench
    cmd = [sys.executable, "-m", "mathagent", "serve", "--engine", "embedded"]
    cmd += ["--replicas", "2", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("MATHAGENT_BASE_URL="):
            return proc, line.strip().split("=", 1)[1].split(",")
    raise RuntimeError(f"the replicas did not start (status {proc.wait()})")


def run_eval(urls: list[str], args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "mathagent", "eval", "--dataset", args.dataset]
    cmd += ["--out", str(out), "--no-tools", "--json", "--limit", str(args.problems)]
    cmd += ["--samples", str(args.samples), "--max-tokens", str(args.max_tokens)]
    cmd += ["--temperature", "0", "--concurrency", str(args.concurrency * len(urls))]
    for url in urls:
        cmd += ["--base-url", url]
    load = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    span = max(r["finished_at"] for r in rows) - min(r["started_at"] for r in rows)
    tokens = sum(r["num_generated_tokens"] for r in rows)
    return {
        "replicas": len(urls),
        "concurrency": args.concurrency * len(urls),
        "samples": len(rows),
        "tokens": tokens,
        "span_s": round(span, 2),
        "samples_per_s": round(len(rows) / span, 4),
        "tokens_per_s": round(tokens / span, 2),
        "load_avg_1m_before": round(load, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "per_replica": summary["replicas"],
        "answers": {f"{r['id']}#{r['sample']}": r["predicted_answer"] for r in rows},
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def build_report(args: argparse.Namespace, runs: list[dict]) -> dict:
    """The JSON report over the rounds finished so far (each round: one run of 1, then of 2)."""
    one = [r for r in runs if r["replicas"] == 1]
    two = [r for r in runs if r["replicas"] == 2]
    pairs = list(zip(one, two, strict=False))
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs]
    sample_ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in pairs]
    agree = sum(one[0]["answers"][k] == v for k, v in two[0]["answers"].items()) if pairs else 0
    return {
        "workload": {**vars(args), "model": "default (SmolLM2-135M-Instruct)", "tools": False},
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "cpu_model": cpu_model(),
        },
        "runs": [{k: v for k, v in r.items() if k != "answers"} for r in runs],
        "speedup_tokens_per_s": [round(x, 3) for x in ratios],
        "speedup_samples_per_s": [round(x, 3) for x in sample_ratios],
        "median_speedup_tokens_per_s": round(statistics.median(ratios), 3) if ratios else None,
        "answers_agreeing_one_vs_two": f"{agree}/{len(two[0]['answers']) if pairs else 0}",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sample")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=4, help="samples in flight per replica")
    parser.add_argument("--threads-per-replica", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--json-out", type=Path, help="also write the report here, every round")
    args = parser.parse_args()
    proc, urls = start_replicas(args.port, args.threads_per_replica)
    runs: list[dict] = []
    try:
        httpx.get(f"{urls[0]}/models", timeout=10).raise_for_status()
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                for chosen in (urls[:1], urls):
                    runs.append(run_eval(chosen, args, Path(tmp) / f"r{i}-{len(chosen)}"))
                    shown = {k: v for k, v in runs[-1].items() if k != "answers"}
                    print(json.dumps(shown), file=sys.stderr, flush=True)
                if args.json_out:
                    report = build_report(args, runs)
                    args.json_out.write_text(json.dumps(report, indent=2, default=str))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(json.dumps(build_report(args, runs), indent=2, default=str))


if __name__ == "__main__":
    main()
