"""Speculation on the random-weight shapes, measured only through ``LLMEngine`` (the GPU bench's
speculative section).

A random model has no drafter worth the name, so a replay proposer registered in the engine
(``draft:replay``) proposes the target's own greedy continuation with the draft at position
``a - 1`` corrupted: every verify step then accepts exactly ``a - 1`` drafts and commits ``a``
tokens (acceptance length ``a``; ``a = draft_len + 1`` is no corruption). The continuation is
the engine's own output with always-rejected drafts (verify-shaped steps of the same batch),
since in bf16 a random model's top logits nearly tie and a one-row and a five-row product
round differently; how often that output differs from plain greedy is reported. With such
weights a policy's plain steps leave the recorded path and drafts stop landing, so the GPU bench
runs stable weights by default (``random_model.stabilize_greedy``: same shapes, a wide top-1
margin), where plain greedy and the verify-width output agree in bf16 and fp8 too. With
``inner`` a ReDrafter head of the target's shape drafts inside the loop each step (its drafts
are discarded for the replayed ones), so drafting costs what it would. Each acceptance runs
with the draft-length policy off (``fixed``: every step verifies ``draft_len`` drafts) and on
(``auto``: the engine's default), against plain decoding at batch 1, 8 and 32. The reference
runs ``draft_len`` tokens past the end, so every draft is full length to the last step: the
policy only picks plain or ``draft_len`` drafts, and no verify width but ``draft_len + 1`` is
captured inside a timed run. In float32 a one-row and a verify-width product give the same
greedy tokens, so the reference is plain greedy and a policy's plain steps keep it.

The replay drafts on the device by default (``replay="device"``): its draft is a gather from a
per-slot table of the reference, so :class:`ChainStep` runs the whole step (draft, verify,
accept) as one graph and launches the next step before the host reads this one, the path the
engine takes for EAGLE-3 chains. ``replay="host"`` drafts on the host as n-gram does (the
engine's general path: host drafts, verify graph, acceptance kernels, one read per step).
"""

from __future__ import annotations

import time

import torch

from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod
from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, ChainStep
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow
from mathagent.serving.engine.spec_decode.redrafter_device import DeviceReDrafter
from mathagent.serving.engine.spec_decode.stats import SpecStats

REPLAY = SpecMethod("draft", "replay")


class ReplayProposer:
    """Drafts a known continuation of each prompt, wrong at draft position ``accept - 1``."""

    def __init__(self, refs: dict[tuple, list[int]], accept: int, vocab: int, inner=None) -> None:
        self.refs, self.accept, self.vocab, self.inner = refs, accept, vocab, inner

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        if self.inner is not None:  # the real drafter runs (and costs) first
            self.inner.propose(rows, k)
        out = []
        for row in rows:
            seq = row.seq
            done = len(seq.all_ids) - len(seq.prompt_ids)
            draft = (self.refs[tuple(seq.prompt_ids)] + [0] * k)[done : done + k]
            if self.accept - 1 < len(draft):
                draft[self.accept - 1] = (draft[self.accept - 1] + 1) % self.vocab
            out.append(Draft.chain(seq.last_token, draft))
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass


class _ReplayGraphs:
    """What every device replay of one engine shares: the per-slot reference table, the wrong
    draft's column (a device value, so one captured graph serves every acceptance) and the
    whole-step graphs. With ``inner`` (a ReDrafter proposer) the engine's one-graph ReDrafter
    drafter (:class:`DeviceReDrafter`) runs inside the step first, from the per-slot context the
    step's verify updates; its drafts are discarded for the replayed ones."""

    def __init__(self, runner, vocab: int, inner=None) -> None:
        self.device, self.vocab = runner.device, vocab
        slots, self.max_seq = runner.cache.k.shape[1], runner.max_seq_len
        self.table = torch.zeros(slots, self.max_seq, dtype=torch.long, device=self.device)
        self.wrong = torch.zeros((), dtype=torch.long, device=self.device)
        self.owner: dict[int, str] = {}  # slot -> the request whose reference the table holds
        self.inner = None if inner is None else DeviceReDrafter(inner, slots, self.device)
        self.steps = ChainStep(self, runner.graphs)

    def run(self, inp: ChainInputs, k: int) -> torch.Tensor:
        """Tokens at ``c + 1 .. c + k`` of each slot's reference, column ``wrong`` changed."""
        if self.inner is not None:  # the real drafter runs (and costs) first
            self.inner.run(inp, k)
        c = inp.start + inp.window.shape[1]  # the root's position
        cols = torch.arange(k, device=self.device)
        idx = (c[:, None] + 1 + cols).clamp(max=self.max_seq - 1)
        drafts = self.table[inp.slots[:, None], idx]
        drafts = torch.where(cols == self.wrong, (drafts + 1) % self.vocab, drafts)
        return torch.cat([inp.window[:, -1:], drafts], 1)

    def verified(self, inp: ChainInputs, pos: torch.Tensor, captured) -> None:
        pass

    def settled(self, inp: ChainInputs, last: torch.Tensor) -> None:
        """The inner drafter's next context: the target's state at the last accepted node."""
        if self.inner is not None:
            self.inner.settled(inp, last)


_SHARED: dict[tuple[int, int], _ReplayGraphs] = {}  # (runner, inner drafter) -> graphs


class DeviceReplay:
    """:class:`ReplayProposer` drafting on the device, inside the whole step's graph."""

    def __init__(self, refs: dict[tuple, list[int]], accept: int, vocab: int, runner,
                 inner=None) -> None:  # fmt: skip
        # steps the fused graph does not take: the host replay, its drafter drafting too
        self.host = ReplayProposer(refs, accept, vocab, inner)
        self.refs = refs
        key = (id(runner), id(inner))
        if key not in _SHARED:
            _SHARED[key] = _ReplayGraphs(runner, vocab, inner)
        self.shared = _SHARED[key]
        self.shared.steps.drop()
        self.shared.owner.clear()  # these references, not the last proposer's
        self.shared.wrong.fill_(accept - 1)  # >= k: nothing wrong
        self.steps = self.shared.steps

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        return self.host.propose(rows, k)

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass

    def fused_step(self, rows: list[SpecRow], k: int, sinks: int, ahead: bool = False):
        if not (self.steps.fits(len(rows), k) and all(
            r.greedy and r.seq.num_cached > k and r.seq.slot is not None for r in rows
        )):  # fmt: skip
            self.steps.drop()
            return None
        return self.steps.step_rows(rows, k, ahead, self._load)

    def _load(self, row: SpecRow) -> None:
        """Put the row's reference into its slot's table when a new request holds the slot."""
        seq, shared = row.seq, self.shared
        if shared.owner.get(seq.slot) != seq.request_id:
            full = (seq.prompt_ids + self.refs[tuple(seq.prompt_ids)])[: shared.max_seq]
            shared.table[seq.slot].zero_()  # past the reference: zeros, as the host pads
            shared.table[seq.slot, : len(full)] = torch.tensor(full, device=shared.device)
            shared.owner[seq.slot] = seq.request_id

    def drop_ahead(self) -> None:
        self.steps.drop()


def replay_proposer(engine: LLMEngine, refs, accept: int, vocab: int, inner=None,
                    replay: str = "device"):  # fmt: skip
    """The device replay where it can run (CUDA graphs), else the host one; an ``inner``
    ReDrafter drafts inside the device replay's step as in the engine's one-graph step."""
    if replay == "device" and engine.runner.graphs is not None:
        return DeviceReplay(refs, accept, vocab, engine.runner, inner)  # graphs captured in run()
    return ReplayProposer(refs, accept, vocab, inner)


def timed(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Run ``prompts`` concurrently; steady tokens/s counts steps while all of them decode.

    Also what tells two rows of the same prompts apart when their steady rates differ: the
    whole batch's rate (ramp and tail included: speculation during the ramp shows there) and
    the mean cached length per row over the steady steps (rows that got further during the
    ramp make every steady step's attention read more K/V)."""
    ids = [engine.add_request(p, params) for p in prompts]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    started: set[str] = set()
    steady_tokens, steady_s, steps, tokens, cached = 0, 0.0, 0, 0, 0
    start = time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    while engine.has_unfinished():
        all_in = len(started) == len(ids)
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        n = sum(len(o.delta_token_ids) for o in outs)
        tokens += n
        if all_in and not any(o.finished for o in outs):
            steady_tokens, steady_s, steps = steady_tokens + n, steady_s + dt, steps + 1
            running = [engine.sequence(i) for i in ids]
            cached += sum(s.num_cached for s in running if s is not None) // len(ids)
        for o in outs:
            outputs[o.request_id] += o.delta_token_ids
        started.update(o.request_id for o in outs)
    wall = tokens / max(time.perf_counter() - start, 1e-9)
    return {"tok_s": steady_tokens / steady_s if steps else wall, "steps": steps,
            "whole_batch_tok_s": wall, "steady_mean_cached": cached / max(steps, 1),
            "outputs": [outputs[i] for i in ids]}  # fmt: skip


class NeverDrafts(DraftPolicy):
    """A policy that always picks plain: the speculative path's own cost when it never drafts
    (the speculator's host work per step, requests that take speculation), apart from what
    probes and the ramp cost."""

    def choose(self, batch: int) -> int:
        return 0

    def keeps(self, batch: int, k: int) -> bool:
        return k == 0


# untimed passes that warm an auto row's policy (gpu_bench --auto-warm-passes): more of them
# move its first probes, and the verify graphs they capture, out of the timed pass
AUTO_WARM_PASSES = 1


def spec_run(engine, prompts, max_tokens, proposer, adaptive: bool, draft_len: int,
             policy: DraftPolicy | None = None) -> dict:  # fmt: skip
    engine.speculator.proposers.register(REPLAY, proposer)
    engine.speculator.policy = policy or DraftPolicy(draft_len, adaptive)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            speculative=str(REPLAY))  # fmt: skip
    if adaptive:  # a serving engine's policy has measured earlier requests: warm it untimed
        for _ in range(AUTO_WARM_PASSES):
            timed(engine, prompts, params)
    engine.speculator.stats = SpecStats()
    res = timed(engine, prompts, params)
    stats = engine.speculator.stats.as_dict()
    res["acceptance_length"] = stats["acceptance_length"]
    res["spec_forwards"] = stats["target_forwards"]
    res["policy"] = engine.speculator.policy.describe()
    return res


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def batch_section(engine, prompts, max_tokens, vocab, draft_len, inner=None, acceptances=None,
                  replays=("device",)):  # fmt: skip
    """Plain, then each acceptance length fixed and auto, for one batch of prompts; the first
    of ``replays`` fills ``fixed`` / ``auto``, others ``fixed_<replay>`` / ``auto_<replay>``."""
    plain_params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    timed(engine, prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    plain = timed(engine, prompts, plain_params)
    refs = {tuple(p): o for p, o in zip(prompts, plain["outputs"], strict=True)}
    longer = max_tokens + draft_len
    wide = spec_run(engine, prompts, longer, ReplayProposer(refs, 1, vocab), False, draft_len)
    wide_out = [o[:max_tokens] for o in wide["outputs"]]
    diverged = [first_difference(a, b) for a, b in zip(plain["outputs"], wide_out, strict=True)]
    res: dict = {"rows": len(prompts), "plain_tok_s": plain["tok_s"],
                 "verify_width_output_differs_from_plain_rows": sum(d is not None for d in diverged),
                 "first_difference_positions": diverged,
                 "plain_whole_batch_tok_s": plain["whole_batch_tok_s"],
                 "plain_steady_mean_cached": plain["steady_mean_cached"]}  # fmt: skip
    refs = {tuple(p): o for p, o in zip(prompts, wide["outputs"], strict=True)}
    # the speculative path with a policy that never drafts: what auto costs where it stays plain
    never = spec_run(engine, prompts, max_tokens, ReplayProposer(refs, 1, vocab), False, draft_len,
                     policy=NeverDrafts(draft_len))  # fmt: skip
    res["never_drafts"] = {"speedup": never["tok_s"] / plain["tok_s"], "steps": never["steps"],
                           "identical_to_reference": never["outputs"] == wide_out}  # fmt: skip
    for accept in acceptances or range(1, draft_len + 2):
        row: dict = {}
        for i, replay in enumerate(replays):
            for mode in ("fixed", "auto"):
                if mode == "fixed" and accept == 1:
                    continue
                proposer = replay_proposer(engine, refs, accept, vocab, inner, replay)
                run = spec_run(engine, prompts, max_tokens, proposer, mode == "auto", draft_len)
                name = mode if i == 0 else f"{mode}_{replay}"
                row[name] = {"tok_s": run["tok_s"], "speedup": run["tok_s"] / plain["tok_s"],
                             "acceptance_length": run["acceptance_length"],
                             "spec_forwards": run["spec_forwards"], "steps": run["steps"],
                             "whole_batch_speedup": run["whole_batch_tok_s"]
                             / plain["whole_batch_tok_s"],
                             "steady_mean_cached": run["steady_mean_cached"],
                             "identical_to_reference": run["outputs"] == wide_out,
                             "replay": type(proposer).__name__,
                             "launched_ahead": getattr(getattr(proposer, "steps", None),
                                                       "claimed", 0)}  # fmt: skip
                if mode == "auto":
                    row[name]["policy"] = run["policy"]
        if "fixed" in row:
            row["fixed"]["goal_0.8x_acceptance"] = row["fixed"]["speedup"] >= 0.8 * accept
        row["auto_never_slower"] = row["auto"]["speedup"] >= 0.97  # 3%: run-to-run noise
        res[f"acceptance_{accept}"] = row
    # plain against itself, after everything else: how far apart two runs of the same steps
    # land (the yardstick for an auto row within a few percent of 1.0)
    res["plain_again_over_plain"] = timed(engine, prompts, plain_params)["tok_s"] / plain["tok_s"]
    return res


def random_prompts(n: int, vocab: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def run(engine: LLMEngine, vocab: int, draft_len: int, batches=(1, 8, 32), max_tokens=128,
        acceptances=None, out: dict | None = None, replays=("device",)) -> dict:  # fmt: skip
    """The whole section for one shape: replay at every batch (filled into ``out`` as it goes)."""
    graphs = engine.runner.graphs
    t0 = time.perf_counter()
    for b in batches if graphs is not None else ():  # the widths the policy picks, first
        for width in (1, draft_len + 1):
            graphs.capture(graphs.bucket(b), width)
        if "device" in replays:  # and the device replay's whole steps
            DeviceReplay({}, 1, vocab, engine.runner).steps.prepare(b, draft_len)
    out = {} if out is None else out
    out.update({"draft_len": draft_len, "max_tokens": max_tokens,
                "capture_s": time.perf_counter() - t0})  # fmt: skip
    for b in batches:
        prompts = random_prompts(b, vocab, 32, seed=b)
        # each prompt is prefilled in its own step while the others decode: at acceptance 5 the
        # first of 32 rows had 128 tokens before the last joined (run 17: no steady window)
        tokens = max(max_tokens, 12 * b)
        out[f"batch_{b}"] = batch_section(
            engine, prompts, tokens, vocab, draft_len, acceptances=acceptances, replays=replays
        )
        out[f"batch_{b}"]["max_tokens"] = tokens
        print({f"batch_{b}": out[f"batch_{b}"]}, flush=True)
    return out


def goals(spec: dict, draft_len: int) -> dict:
    """Batch 1 fixed draft length: speedup >= 0.8 x acceptance; auto never slower anywhere."""
    b1 = spec.get("batch_1", {})
    fixed = [b1[f"acceptance_{a}"]["fixed"] for a in range(2, draft_len + 2)
             if f"acceptance_{a}" in b1]  # fmt: skip
    return {
        "spec_speedup_ge_0.8x_acceptance_b1": all(f["goal_0.8x_acceptance"] for f in fixed),
        "auto_never_slower_b1_b8_b32": all(
            spec[k][a]["auto_never_slower"]
            for k in spec if k.startswith("batch_") for a in spec[k] if a.startswith("acceptance_")
        ),
    }  # fmt: skip


def redrafter_section(engine: LLMEngine, vocab: int, draft_len: int, max_tokens=128) -> dict:
    """Batch 1 with a ReDrafter head of the target's shape drafting (one beam) every step."""
    from mathagent.serving.engine.spec_decode.redrafter import (
        Drafter,
        DrafterConfig,
        ReDrafterProposer,
    )

    args = engine.loaded.model.args
    cfg = DrafterConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                        exit_dim=args.hidden_size, num_draft_layers=2)  # fmt: skip
    emb = engine.loaded.model.tok_embeddings.weight
    drafter = Drafter(cfg).to(emb.device, emb.dtype).eval()
    inner = ReDrafterProposer(drafter, emb.detach(), 1)
    prompts = random_prompts(1, vocab, 32, seed=101)
    return batch_section(engine, prompts, max_tokens, vocab, draft_len, inner,
                         replays=("device", "host"))  # fmt: skip
