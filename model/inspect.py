"""What a model costs before building it: parameters, active parameters, training memory.

The model is instantiated on the meta device (no memory, ~50 ms even for 30B), so
`stagewise inspect` can size a published shape on a laptop. Counts are exact (sum of the
state_dict's numel, buffers such as the routers' e_score_correction_bias included, which
is how the presets' `_about.total_params` were counted). Memory is an estimate.

Active parameters per token: a routed expert is used by k of E slots, so routed-expert
tensors count k/E of their size; the shared expert, router, norms, Mamba, attention,
embeddings and lm_head count fully. "Without embeddings" also drops embeddings + lm_head.

Training-step memory, P = all parameters (every expert is resident), s x b tokens:
    weights      P x (2 bf16 | 4 fp32)
    grads        P x 4          (fp32)
    AdamW        P x 8          (fp32 exp_avg + exp_avg_sq)
    master       P x 4          (fp32 copy, only when the weights are bf16)
    activations  s x b x sum over layers of the bytes/token each layer saves for backward
                 (`_activation_bytes`) + final norm and fp32 logits (+ the same per MTP
                 head), no activation checkpointing, fused (flash/SDPA
                 memory-efficient) attention: eager attention adds s x heads x a bytes per
                 token per attention layer for the score matrix, and allocator slack and
                 temporaries are not counted. Treat it as an order of magnitude.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from rich.table import Table
from transformers import NemotronHForCausalLM

from stagewise.model.build import build_hf_config
from stagewise.model.config import ModelConfig
from stagewise.model.mtp import attach_mtp

SYMBOL = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
KIND = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


@dataclass
class LayerRow:
    index: int
    kind: str
    params: int
    active_params: int
    activation_bytes: int


@dataclass
class MemoryEstimate:
    precision: str
    seq_length: int
    micro_batch: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    master_bytes: int
    activations_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.master_bytes + self.activations_bytes


@dataclass
class ModelReport:
    name: str
    pattern: str
    vocab_size: int
    hidden_size: int
    total_params: int
    active_params: int
    embedding_params: int  # input embeddings + lm_head
    mtp_params: int
    memory: MemoryEstimate
    layers: list[LayerRow] = field(default_factory=list)

    @property
    def total_params_no_embeddings(self) -> int:
        return self.total_params - self.embedding_params

    @property
    def active_params_no_embeddings(self) -> int:
        return self.active_params - self.embedding_params

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["total_params_no_embeddings"] = self.total_params_no_embeddings
        d["active_params_no_embeddings"] = self.active_params_no_embeddings
        d["memory"]["total_bytes"] = self.memory.total_bytes
        return d

    def render(self) -> Table:
        """One rich Table: per-layer rows, then totals, then the training-step memory."""
        t = Table(title=f"{self.name}  [{self.pattern}]  vocab {self.vocab_size}, hidden {self.hidden_size}")
        for col in ("#", "layer", "params", "active/token", "activations"):
            t.add_column(col, justify="left" if col == "layer" else "right")
        for r in self.layers:
            t.add_row(str(r.index), r.kind, _n(r.params), _n(r.active_params), _b(r.activation_bytes))
        t.add_section()
        t.add_row("", "embeddings + lm_head", _n(self.embedding_params), _n(self.embedding_params), "")
        if self.mtp_params:
            t.add_row("", "mtp heads", _n(self.mtp_params), _n(self.mtp_params), "")
        t.add_row("", "total", _n(self.total_params), _n(self.active_params), "")
        t.add_row("", "total w/o embeddings", _n(self.total_params_no_embeddings), _n(self.active_params_no_embeddings), "")
        t.add_section()
        m = self.memory
        wb = "bf16" if m.precision == "bf16" else "fp32"
        for label, value in [
            (f"weights ({wb})", m.weights_bytes),
            ("grads (fp32)", m.grads_bytes),
            ("AdamW states (fp32)", m.optimizer_bytes),
            ("master weights (fp32)", m.master_bytes),
            (f"activations (est., {m.seq_length}x{m.micro_batch})", m.activations_bytes),
            ("training step (est.)", m.total_bytes),
        ]:
            t.add_row("", label, "", "", _b(value))
        return t


def _n(x: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return str(x)


def _b(x: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x} B"


def _numel(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in module.state_dict().values())


def _activation_bytes(c, kind: str, a: int) -> int:
    """Bytes per token one layer keeps for backward (a = bytes per activation element)."""
    h = c.hidden_size
    block = 2 * h * a  # residual input + RMSNorm output
    if kind == "linear_attention":
        d_in = c.mamba_num_heads * c.mamba_head_dim
        conv = d_in + 2 * c.n_groups * c.ssm_state_size
        proj = d_in + conv + c.mamba_num_heads
        states = c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size / c.chunk_size  # chunk boundary states
        return block + int((proj + 2 * conv + 3 * d_in + states) * a)  # in_proj out, conv, act, y, gated norm, out_proj in
    if kind == "full_attention":
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        return block + (2 * q + 2 * kv) * a + c.num_attention_heads * 4  # q, k, v, attn out; fp32 log-sum-exp
    if kind == "mlp":
        return block + 2 * c.intermediate_size * a  # up out, relu2 out
    k, e = c.num_experts_per_tok, c.n_routed_experts
    router = 2 * e * 4  # fp32 logits + sigmoid scores
    routed = k * (2 * h + 2 * c.moe_intermediate_size) * a  # gathered input, up, act, weighted output per slot
    shared = 2 * c.moe_shared_expert_intermediate_size * a
    return block + router + routed + shared


def meta_model(cfg: ModelConfig, vocab_size: int | None) -> NemotronHForCausalLM:
    """The network `cfg` builds (MTP heads included), on the meta device: its modules and shapes, no memory."""
    config = build_hf_config(cfg, vocab_size)
    with torch.device("meta"):
        model = NemotronHForCausalLM(config)
        if cfg.mtp.num_heads:
            attach_mtp(model, cfg.mtp.num_heads, cfg.mtp.loss_weight)
    return model


def inspect_model(
    cfg: ModelConfig,
    vocab_size: int | None,
    seq_length: int,
    micro_batch: int,
    precision: Literal["bf16", "fp32"] = "bf16",
) -> ModelReport:
    """Size `cfg` on the meta device: exact (active) parameter counts and a memory estimate."""
    model = meta_model(cfg, vocab_size)
    config = model.config
    a = 2 if precision == "bf16" else 4
    tokens = seq_length * micro_batch
    rows = []
    for block in model.model.layers:
        params = _numel(block)
        active = params
        if block.block_type == "moe":
            routed = _numel(block.mixer.experts)
            active = params - routed + routed * config.num_experts_per_tok // config.n_routed_experts
        act = _activation_bytes(config, block.block_type, a) * tokens
        rows.append(LayerRow(block.layer_idx, KIND[block.block_type], params, active, act))
    total = _numel(model)
    embedding = _numel(model.model.embeddings) + _numel(model.lm_head)
    mtp = _numel(model.mtp) if cfg.mtp.num_heads else 0
    active = total - sum(r.params - r.active_params for r in rows)
    head_act = (config.hidden_size * a + 2 * config.vocab_size * 4) * tokens  # norm_f out, fp32 logits + log-softmax
    # each MTP head: 2 norms + concat (4h), its MLP block (2h + 2I), then its own norm_f + logits
    mtp_act = cfg.mtp.num_heads * ((6 * config.hidden_size + 2 * config.intermediate_size) * a * tokens + head_act)
    memory = MemoryEstimate(
        precision=precision,
        seq_length=seq_length,
        micro_batch=micro_batch,
        weights_bytes=total * a,
        grads_bytes=total * 4,
        optimizer_bytes=total * 8,
        master_bytes=total * 4 if precision == "bf16" else 0,
        activations_bytes=sum(r.activation_bytes for r in rows) + head_act + mtp_act,
    )
    name = cfg.preset if cfg.from_ is None else str(cfg.from_)
    return ModelReport(
        name=name,
        pattern=config.hybrid_override_pattern,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        total_params=total,
        active_params=active,
        embedding_params=embedding,
        mtp_params=mtp,
        memory=memory,
        layers=rows,
    )
