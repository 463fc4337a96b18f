"""MoE health: the Switch load-balancing loss, MaxVio and dead experts (ALGORITHMS.md §9).

Why a monitor: a router that collapses onto a few experts wastes the model's capacity
silently; the loss pushes against it and the metrics show whether it works.
`RoutingMonitor` puts a forward hook on every NemotronHTopkRouter. Each hook keeps the
router logits *with their graph* (for the loss of this micro-batch) and adds the detached
expert counts (one `bincount`) to the step's totals. Engine protocol per optimizer step:

    for each micro-batch: forward -> loss = lm + coeff * mon.lb_loss() -> backward -> mon.clear()
    metrics = mon.step_metrics()       # MaxVio / dead experts of the step, then a new step

Forwards under `torch.no_grad()` / inference mode (evaluation, generation, reference
models) and gradient-checkpointing recomputations inside backward are not recorded.

Load-balancing loss per MoE layer, over the T tokens of the micro-batch, E experts, top-k:
    E * sum_i f_i * P_i,  f_i = count_i / (T k),  P_i = mean_t p_t,i
NemotronH's router scores with a sigmoid, so p_t = sigmoid(logits_t) normalised to sum 1
per token. Uniform routing gives exactly 1 (the minimum for balanced counts); the value is
averaged over layers and returned without the coefficient (the engine multiplies).
"""

from __future__ import annotations

from collections import deque

import torch
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter


def max_violation(loads) -> float:
    """MaxVio = max load / mean load - 1 (0 for an idle layer). [120,80,100,0,140,60,90,50] -> 0.75."""
    loads = torch.as_tensor(loads, dtype=torch.float64)
    mean = loads.mean()
    return 0.0 if mean <= 0 else float(loads.max() / mean - 1.0)


def load_balancing_loss(router_logits: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch loss E * sum_i f_i P_i of one layer (router_logits [T, E]; counts [E], no grad)."""
    tokens, experts = router_logits.shape
    scores = torch.sigmoid(router_logits.float())
    probs = scores / scores.sum(dim=-1, keepdim=True)
    frac = counts.to(probs.dtype) / (tokens * top_k)
    return experts * (frac * probs.mean(dim=0)).sum()


def _in_backward() -> bool:
    # A hook that fires while autograd runs is a checkpoint recomputation, not a new forward.
    return torch._C._current_graph_task_id() != -1


class RoutingMonitor:
    """Hooks on every router of `model`; see the module docstring for the protocol."""

    def __init__(self, model: torch.nn.Module, window: int = 20) -> None:
        self.window = window
        self.routers: dict[int, NemotronHTopkRouter] = {}
        for name, module in model.named_modules():
            if isinstance(module, NemotronHTopkRouter) and not name.startswith("mtp."):
                self.routers[_layer_index(name)] = module
        self._logits: dict[int, list[torch.Tensor]] = {i: [] for i in self.routers}
        self._counts: dict[int, list[torch.Tensor]] = {i: [] for i in self.routers}
        self._step: dict[int, torch.Tensor | None] = dict.fromkeys(self.routers)
        self._history: dict[int, deque[list[int]]] = {i: deque(maxlen=window) for i in self.routers}
        self.last_loads: dict[int, list[int]] = {}
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in self.routers.items()]

    def _hook(self, idx: int):
        def record(module: NemotronHTopkRouter, args, output) -> None:
            if not torch.is_grad_enabled() or _in_backward():
                return
            router_logits, _, topk_indices = output
            counts = torch.bincount(topk_indices.detach().flatten(), minlength=module.num_experts)
            self._logits[idx].append(router_logits)
            self._counts[idx].append(counts)
            step = self._step[idx]
            self._step[idx] = counts.clone() if step is None else step + counts

        return record

    def lb_loss(self) -> torch.Tensor:
        """Mean over MoE layers of the micro-batch's Switch loss (differentiable; 0 if nothing ran)."""
        per_layer = []
        for idx, logits in self._logits.items():
            if logits:
                k = self.routers[idx].top_k
                per_layer.append(load_balancing_loss(torch.cat(logits), torch.stack(self._counts[idx]).sum(0), k))
        if not per_layer:
            return torch.zeros(())
        return torch.stack(per_layer).mean()

    def clear(self) -> None:
        """Drop this micro-batch's logits (frees their graph); the step's counts stay."""
        for idx in self.routers:
            self._logits[idx].clear()
            self._counts[idx].clear()

    def step_metrics(self) -> dict[str, float]:
        """Close the optimizer step: `moe/layer{idx}/max_vio` and `/dead_experts`, then reset the counts.

        Dead = zero tokens over the last `window` steps (fewer while the run is younger).
        """
        self.clear()
        metrics: dict[str, float] = {}
        for idx, router in self.routers.items():
            step = self._step[idx]
            loads = [0] * router.num_experts if step is None else step.tolist()
            self._history[idx].append(loads)
            self.last_loads[idx] = loads
            self._step[idx] = None
            seen = torch.tensor(list(self._history[idx])).sum(0)
            metrics[f"moe/layer{idx}/max_vio"] = max_violation(loads)
            metrics[f"moe/layer{idx}/dead_experts"] = float((seen == 0).sum())
        return metrics

    def state_dict(self) -> dict:
        """JSON-able: the rolling window of per-step loads (taken at a step boundary)."""
        return {"window": self.window, "history": {str(i): [list(s) for s in h] for i, h in self._history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.window = int(state["window"])
        for idx in self.routers:
            steps = state["history"].get(str(idx), [])
            self._history[idx] = deque((list(s) for s in steps), maxlen=self.window)

    def remove(self) -> None:
        """Detach the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _layer_index(module_name: str) -> int:
    # "model.layers.12.mixer.gate" -> 12
    parts = module_name.split(".")
    return int(parts[parts.index("layers") + 1])
