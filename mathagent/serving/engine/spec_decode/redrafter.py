"""ReDrafter: a recurrent draft head over the target's last hidden state (apple/ml-recurrent-drafter).

The drafter reads the target's final (normed) hidden state ``h`` at the last committed position
and the target's own token embeddings. An RNN state ``s`` starts at zero and advances once per
drafted token, ``s = silu(W e(token) + U s)``; the head maps ``[h, s]`` through optional
``input_proj``, residual blocks ``x + silu(Linear(x))`` and a vocabulary projection. Beam search
over ``draft_len`` steps yields candidates for tree verification.

Checkpoint: ``config.json`` (``vocab_size``, ``hidden_size``, ``exit_dim``, ``num_draft_layers``,
``rnn``, ...) and ``model.safetensors`` with the names TensorRT-LLM's
``examples/redrafter/convert_checkpoint.py`` reads: ``input_proj.{weight,bias}`` (only when
``exit_dim != 2 * hidden_size``), ``lm_head.{i}.linear.{weight,bias}`` for each residual block,
``lm_head.{num_draft_layers}.weight``, ``rnn_u.{weight,bias}`` and ``rnn_w.weight``.
A compact checkpoint may leave out the vocabulary projection when ``config["lm_head_from_base"]``
says it equals the base model's token embedding (it is then filled in from the base at load).
:class:`ReDrafterProposer` drafts with it inside the engine's speculative steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from mathagent.serving.engine.spec_decode.chain_step import OneGraphProposer
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow


@dataclass
class DrafterConfig:
    """The keys of a ReDrafter ``config.json`` (apple/ml-recurrent-drafter, TensorRT-LLM)."""

    vocab_size: int
    hidden_size: int
    exit_dim: int
    num_draft_layers: int = 2
    rnn: bool = True
    num_lookback_tokens: int = -1
    model_type: str = "recurrent_drafting_drafter"
    lm_head_from_base: bool = False  # vocab projection initialised from (and frozen to) the base
    draft_vocab_size: int = 0  # >0: drafts only from these token ids (tensor ``draft_vocab``)


class ResBlock(nn.Module):
    """``x + silu(Linear(x))``, the drafter's residual layer."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim, bias=True)
        nn.init.zeros_(self.linear.weight)  # starts as the identity, like the reference

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class Drafter(nn.Module):
    """The recurrent draft head; parameter names match the ReDrafter checkpoint format."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        h, d = config.hidden_size, config.exit_dim
        self.input_proj = nn.Linear(2 * h, d) if 2 * h != d else None
        blocks: list[nn.Module] = [ResBlock(d) for _ in range(config.num_draft_layers)]
        self.lm_head = nn.Sequential(*blocks, nn.Linear(d, config.vocab_size, bias=False))
        if config.rnn:
            self.rnn_u = nn.Linear(h, h, bias=True)
            self.rnn_w = nn.Linear(h, h, bias=False)
        # EAGLE-3's draft vocabulary: the few thousand tokens a model's own math text uses cover
        # ~99% of what it writes, and projecting onto them costs a tenth of the full head.
        size = config.draft_vocab_size
        self.register_buffer("draft_vocab", torch.zeros(size, dtype=torch.long) if size else None)

    def set_draft_vocab(self, token_ids: Tensor | None) -> None:
        """Draft only from ``token_ids`` (None: the whole vocabulary)."""
        if token_ids is None:
            self.config.draft_vocab_size = 0
            self.register_buffer("draft_vocab", None)
            return
        ids = token_ids.to(torch.long).flatten().unique()
        self.config.draft_vocab_size = int(ids.numel())
        self.register_buffer("draft_vocab", ids.to(self.lm_head[-1].weight.device))

    def head_weight(self) -> Tensor:
        """The vocabulary projection [V', exit_dim]: the draft vocabulary's rows when set."""
        weight = self.lm_head[-1].weight
        return weight if self.draft_vocab is None else weight[self.draft_vocab]

    def to_tokens(self, index: Tensor) -> Tensor:
        """Token ids of logit columns (the identity without a draft vocabulary)."""
        return index if self.draft_vocab is None else self.draft_vocab[index]

    def step_state(self, state: Tensor, emb: Tensor) -> Tensor:
        """Advance the recurrent state by one drafted token's embedding."""
        return F.silu(self.rnn_w(emb) + self.rnn_u(state)) if self.config.rnn else state + emb

    def features(self, context: Tensor, state: Tensor) -> Tensor:
        """The vector [..., exit_dim] the vocabulary projection reads."""
        x = torch.cat([context, state], dim=-1)
        if self.input_proj is not None:
            x = self.input_proj(x)
        for block in self.lm_head[:-1]:
            x = block(x)
        return x

    def use_head(self, head: Callable[[Tensor], Tensor] | None) -> None:
        """Project features [N, exit_dim] to logits [N, V'] with ``head`` (None: own weight).

        A head tied to the base embedding is the target's own LM head, so drafting can run
        through the target's (possibly quantized) projection instead of a float32 copy; with
        a draft vocabulary, ``head`` must produce the draft vocabulary's columns only.
        """
        self._head = head

    def logits(self, context: Tensor, state: Tensor) -> Tensor:
        """Draft logits [..., V'] over the draft vocabulary (or all V) from the target's
        hidden state and the recurrent state; :meth:`to_tokens` maps columns to token ids."""
        x = self.features(context, state)
        head = getattr(self, "_head", None)
        if head is None:
            return F.linear(x, self.head_weight()).float()
        return head(x.reshape(-1, x.shape[-1])).float().view(*x.shape[:-1], -1)

    def teacher_forced_features(self, hidden: Tensor, embs: Tensor, steps: int) -> list[Tensor]:
        """Training forward: features of step i at position t predict token t + 2 + i.

        hidden: [B, T, H] target hidden states; embs: [B, T, H] embeddings of the input tokens.
        Returns ``steps`` tensors [B, T - 1 - i, exit_dim] (positions whose inputs exist).
        """
        t = hidden.shape[1]
        state = torch.zeros_like(hidden)
        out = []
        for i in range(steps):
            # step i at position t consumes the embedding of token t + 1 + i
            state = self.step_state(state[:, : t - 1 - i], embs[:, 1 + i :])
            out.append(self.features(hidden[:, : t - 1 - i], state))
        return out

    @torch.no_grad()
    def beam_search(
        self, context: Tensor, root: Tensor, embedding: Tensor, width: int, length: int
    ) -> Tensor:
        """Greedy-mode candidates: beams [B, W, 1 + length] starting with ``root``.

        context: [B, H] target hidden state at the last committed position; root: [B] the token
        the target just produced there; embedding: [V, H] the target's token embedding.
        """
        if width == 1:
            return self.greedy_chain(context, root, embedding, length)[:, None]
        b, h = context.shape
        # step one has a single live beam: score it once, spread its top-W tokens over beams
        state = self.step_state(context.new_zeros(b, h), embedding[root])  # [B, H]
        score, first = F.log_softmax(self.logits(context, state), dim=-1).topk(width, dim=-1)
        first = self.to_tokens(first)
        beams = torch.stack([root[:, None].expand(b, width), first], -1)  # [B, W, 2]
        state = state[:, None].expand(b, width, h)
        ctx = context[:, None].expand(b, width, h)
        for _ in range(length - 1):
            state = self.step_state(state, embedding[beams[..., -1]])
            logp = F.log_softmax(self.logits(ctx, state), dim=-1)  # [B, W, V']
            vocab = logp.shape[-1]
            flat = (score[..., None] + logp).view(b, width * vocab)
            score, idx = flat.topk(width, dim=-1)
            src = idx // vocab
            new = self.to_tokens(idx % vocab)
            beams = torch.cat(
                [beams.gather(1, src[..., None].expand_as(beams)), new[..., None]], -1
            )
            state = state.gather(1, src[..., None].expand_as(state))
        return beams

    @torch.no_grad()
    def greedy_chain(self, context: Tensor, root: Tensor, embedding: Tensor, length: int) -> Tensor:
        """One beam of argmax drafts [B, 1 + length] (no scores: the cheapest draft)."""
        state = context.new_zeros(context.shape)
        out = [root]
        for _ in range(length):
            state = self.step_state(state, embedding[out[-1]])
            out.append(self.to_tokens(self.logits(context, state).argmax(-1)))
        return torch.stack(out, 1)

    @torch.no_grad()
    def sample_chain(
        self,
        context: Tensor,
        root: Tensor,
        embedding: Tensor,
        length: int,
        warp,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sampling-mode draft: one chain drawn from the warped drafter distribution q.

        ``warp`` maps logits [B, V'] to probabilities with the request's temperature/top-p/top-k.
        Returns drafts [B, length] and q [B, length, V] (zero outside a draft vocabulary).
        """
        state = context.new_zeros(context.shape)
        tok, drafts, qs = root, [], []
        for _ in range(length):
            state = self.step_state(state, embedding[tok])
            q = warp(self.logits(context, state))
            tok = self.to_tokens(torch.multinomial(q, 1, generator=generator).squeeze(1))
            if self.draft_vocab is not None:
                full = q.new_zeros(q.shape[0], embedding.shape[0])
                q = full.index_copy_(1, self.draft_vocab, q)
            drafts.append(tok)
            qs.append(q)
        return torch.stack(drafts, 1), torch.stack(qs, 1)

    def head_name(self) -> str:  # the vocabulary projection's key in the checkpoint
        return f"lm_head.{self.config.num_draft_layers}.weight"

    def save_pretrained(self, out: Path, compact: bool = False) -> None:
        """Write ``config.json`` + ``model.safetensors``; ``compact`` drops a base-tied head."""
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if compact and self.config.lm_head_from_base:
            del state[self.head_name()]
        save_file(state, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, path: Path, base_embedding: Tensor | None = None) -> Drafter:
        """Load a checkpoint folder; a compact one takes its head from ``base_embedding``."""
        path = Path(path)
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"{path} is not a ReDrafter checkpoint (config.json + model.safetensors)"
            )
        raw = json.loads((path / "config.json").read_text())
        fields = DrafterConfig.__dataclass_fields__
        drafter = cls(DrafterConfig(**{k: v for k, v in raw.items() if k in fields}))
        state = load_file(str(path / "model.safetensors"))
        if drafter.head_name() not in state:
            if base_embedding is None:
                raise ValueError(
                    f"{path} leaves out {drafter.head_name()}; pass the base embedding"
                )
            state[drafter.head_name()] = base_embedding
        drafter.load_state_dict(
            {k: v if k == "draft_vocab" else v.float() for k, v in state.items()}
        )
        return drafter


class ReDrafterProposer(OneGraphProposer):
    """ReDrafter over the target's hidden state and token embeddings."""

    def __init__(self, drafter: Drafter, embedding: Tensor, beams: int) -> None:
        # On a CPU the drafter's small one-row products are fastest in float32 (a bf16 product
        # of one row has a high fixed cost); on CUDA it follows the target's dtype.
        self.dtype = torch.float32 if embedding.device.type == "cpu" else embedding.dtype
        self.drafter = drafter.to(embedding.device, self.dtype).eval()
        self.embedding = embedding.to(self.dtype)  # [V, H] the target's own token embedding
        self.beams = beams

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        for r in rows if self.fused is not None else ():  # the device's contexts are behind
            self.fused.drafter.forget(r.seq.slot)
        out = [Draft.chain(r.seq.last_token, []) for r in rows]
        greedy = [i for i, r in enumerate(rows) if r.hidden is not None and r.greedy]
        if greedy:
            ctx = torch.stack([rows[i].hidden for i in greedy]).to(self.dtype)  # [B, H]
            root = torch.tensor([rows[i].seq.last_token for i in greedy], device=ctx.device)
            beams = self.drafter.beam_search(ctx, root, self.embedding, self.beams, k)
            for j, i in enumerate(greedy):
                out[i] = Draft(beams[j])  # stays on the device: the step lays drafts out there
        for i, row in enumerate(rows):
            if row.hidden is None or row.greedy:
                continue
            root = torch.tensor([row.seq.last_token], device=row.hidden.device)
            drafts, q = self.drafter.sample_chain(
                row.hidden[None].to(self.dtype),
                root,
                self.embedding,
                k,
                row.warp,
                row.seq.generator,
            )
            out[i] = Draft.chain(row.seq.last_token, drafts[0].tolist(), q[0])
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass
