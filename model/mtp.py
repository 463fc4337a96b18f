"""Multi-token prediction heads (DeepSeek-V3 §2.2; Nemotron 3 trains with MTP too).

Why: predicting a few tokens further ahead densifies the training signal, and the heads can
later serve as a draft model for speculative decoding. The heads live on the causal LM as
`model.mtp`, so `save_pretrained` writes them as `mtp.*` tensors; transformers' NemotronH
ignores those on load (`_keys_to_ignore_on_load_unexpected = [r"mtp.*"]`), so a checkpoint
with heads is still a plain HF checkpoint. `load_model` (build.py) re-attaches them.

Head k (k = 1..K), at position t, chained over depths as in DeepSeek-V3:
    h^k_t = Block_k( W_k [ RMSNorm(h^{k-1}_t) ; RMSNorm(Emb(x_{t+k})) ] )
    p^k_t = softmax( lm_head( norm_f(h^k_t) ) )        predicts x_{t+k+1}
with h^0 the trunk's last hidden state, Emb / norm_f / lm_head shared with the trunk, and
Block_k = x + MLP(RMSNorm(x)) (NemotronH's relu2 MLP). With labels[t] = x_{t+1}, the target
of head k at t is labels[t+k]: positions whose target lies beyond the sequence drop out,
so depth k covers T - k positions.

Where the settings of a saved checkpoint come from (`read_mtp_settings`): `stagewise.json`'s
`"mtp": {"num_heads", "loss_weight"}` (top level, or under `"extra"`) when present; else
config.json's `num_nextn_predict_layers` (which build.py always sets) with the default
loss weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMLP, NemotronHRMSNorm

from stagewise.model.config import MTPConfig

PREFIX = "mtp."


class MTPHead(nn.Module):
    """One depth: merge the previous depth's state with the next token's embedding, one MLP block."""

    def __init__(self, config) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_epsilon
        self.hidden_norm = NemotronHRMSNorm(h, eps=eps)
        self.embed_norm = NemotronHRMSNorm(h, eps=eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.block_norm = NemotronHRMSNorm(h, eps=eps)
        self.mlp = NemotronHMLP(config)
        std = config.initializer_range
        for lin in (self.proj, self.mlp.up_proj, self.mlp.down_proj):
            nn.init.normal_(lin.weight, std=std)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embedded)], dim=-1))
        return x + self.mlp(self.block_norm(x))


class MTPHeads(nn.Module):
    """K chained MTP heads; `losses` gives one cross-entropy per head."""

    def __init__(self, config, num_heads: int, loss_weight: float = 0.3) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"MTPHeads needs num_heads >= 1, got {num_heads}")
        self.heads = nn.ModuleList(MTPHead(config) for _ in range(num_heads))
        self.loss_weight = float(loss_weight)

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def losses(self, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor, model) -> list[torch.Tensor]:
        """Cross-entropy (mean over valid targets, ignore_index -100) of each head, depth 1 first.

        hidden: [B, T, H] trunk output (`last_hidden_state`, which is also `hidden_states[-1]`;
        each head re-normalises its input anyway). input_ids, labels: [B, T] with labels[:, t] = input_ids[:, t+1]
        (or -100). model: the NemotronHForCausalLM whose embeddings, norm_f and lm_head are shared.
        """
        embed, norm_f, lm_head = model.get_input_embeddings(), model.model.norm_f, model.lm_head
        seq = input_ids.shape[1]
        out, h = [], hidden
        for k, head in enumerate(self.heads, start=1):
            if seq - k <= 0:  # sequence too short for this depth: an exact zero, still in the graph
                out.append(h.sum() * 0.0)
                continue
            h = head(h[:, : seq - k], embed(input_ids[:, k:]))
            logits = lm_head(norm_f(h)).float()
            target = labels[:, k:]
            if (target != -100).any():
                out.append(F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100))
            else:  # nothing to predict (fully masked SFT row): zero, not NaN
                out.append(logits.sum() * 0.0)
        return out

    def weighted(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """loss_weight x mean of the per-head losses: the term added to the LM loss."""
        return self.loss_weight * torch.stack(losses).mean()


def attach_mtp(model, num_heads: int, loss_weight: float = 0.3) -> None:
    """Give `model` K fresh heads as `model.mtp` (or remove them when K = 0); records K in its config."""
    if num_heads > 0:
        model.mtp = MTPHeads(model.config, num_heads, loss_weight).to(
            device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype
        )
        model.config.mtp_layers_block_type = ["mlp"]
    elif hasattr(model, "mtp"):
        del model.mtp
    model.config.num_nextn_predict_layers = num_heads


def read_mtp_settings(ckpt_dir: str | Path) -> MTPConfig:
    """MTP settings of a checkpoint: stagewise.json's "mtp" if present, else config.json's count."""
    ckpt_dir = Path(ckpt_dir)
    meta_path = ckpt_dir / "stagewise.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        found = meta.get("mtp") or (meta.get("extra") or {}).get("mtp")
        if found:
            return MTPConfig(**found)
    config = json.loads((ckpt_dir / "config.json").read_text())
    return MTPConfig(num_heads=int(config.get("num_nextn_predict_layers") or 0))


def mtp_state_dict(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """The `mtp.*` tensors of a saved checkpoint (single or sharded safetensors), prefix removed."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for name in files:
        with safe_open(str(ckpt_dir / name), framework="pt") as f:
            for key in f.keys():
                if key.startswith(PREFIX):
                    state[key[len(PREFIX):]] = f.get_tensor(key)
    return state
