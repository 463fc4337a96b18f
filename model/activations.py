"""Residual-stream RMS after every NemotronH block: the early warning for a diverging run.

Why: a layer whose output RMS grows step after step usually precedes a loss spike; one
number per layer, sampled every few steps, is cheap and catches it. The engine sets
`enabled = True` for the steps it samples (MonitorConfig.act_rms_every_steps); the hooks
then accumulate the sum of squares of each block's output over the step's micro-batches
(detached, on the device: no sync per layer), and `metrics()` returns
`act/layer{idx}/rms` = sqrt(sum x^2 / count) over every element seen, then resets.
Forwards under no_grad are measured too (the flag decides); recomputations by gradient
checkpointing inside backward are not.
"""

from __future__ import annotations

import torch
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHBlock


class ActivationMonitor:
    """Forward hooks on each NemotronHBlock of `model`, active only while `enabled`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.enabled = False
        self._sumsq: dict[int, torch.Tensor] = {}
        self._count: dict[int, int] = {}
        blocks = [m for n, m in model.named_modules() if isinstance(m, NemotronHBlock) and not n.startswith("mtp.")]
        self._handles = [b.register_forward_hook(self._hook(b.layer_idx)) for b in blocks]

    def _hook(self, idx: int):
        def record(module, args, output) -> None:
            if not self.enabled or torch._C._current_graph_task_id() != -1:
                return
            out = output[0] if isinstance(output, tuple) else output
            sq = out.detach().float().pow(2).sum()
            self._sumsq[idx] = sq if idx not in self._sumsq else self._sumsq[idx] + sq
            self._count[idx] = self._count.get(idx, 0) + out.numel()

        return record

    def metrics(self) -> dict[str, float]:
        """{"act/layer{idx}/rms": float} for the layers seen since the last call; then reset."""
        if not self._sumsq:
            return {}
        idxs = sorted(self._sumsq)
        sums = torch.stack([self._sumsq[i] for i in idxs]).cpu().tolist()  # one sync for all layers
        out = {f"act/layer{i}/rms": (s / self._count[i]) ** 0.5 for i, s in zip(idxs, sums)}
        self._sumsq.clear()
        self._count.clear()
        return out

    def remove(self) -> None:
        """Detach the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
