"""The training engine: a Trainer that runs optimizer steps over a batch source.

    trainer = Trainer(model, train_cfg, batches, LMObjective(train_cfg.lb_loss_coeff),
                      out_dir, stage="pretrain", tokenizer_dir=tok, recipe_hash=h, log=tracker)
    trainer.resume(latest_checkpoint(out_dir))      # optional
    result = trainer.fit(until_tokens=None)         # the whole budget, or a gate's chunk

One optimizer step: set lr = lr_at(tokens seen at the step's start), take a global batch,
split it into micro-batches (gradient accumulation), forward/backward each through the
objective, measure the gradient (pre-clip norm, exact zeros) and weights, refuse NaN/Inf,
clip, AdamW. Metrics are buffered and handed to `log` every monitor.log_every_steps steps
as [(step, tokens_seen, {name: value})], never one call per scalar. Checkpoints: at the
first step boundary at or past every multiple of checkpoint_every_tokens, and at the end
of each fit(); `resume` restores everything needed to continue bit-for-bit on the CPU
(same torch build and thread count: `numerics()`; tests/model/test_exact_resume.py).

The batch source is duck-typed: next_batch() -> LongTensor [global_batch, seq_length + 1]
(or an object with the same `.to`/`.split`, e.g. a dict of tensors), state_dict(),
load_state_dict(). A batch may carry `metrics` ({name: float}, named in full, e.g. RL's
`rl/reward/total`): they are logged with the step's own. A source that raises StopIteration or an exception named
DataExhausted (data/loader.py) ends the fit early with stop_reason "data_exhausted".
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from stagewise.model import checkpoint as ck
from stagewise.model.activations import ActivationMonitor
from stagewise.model.config import TrainConfig
from stagewise.model.mfu import flops_per_token, peak_flops
from stagewise.model.moe import RoutingMonitor
from stagewise.model.objectives import LossContext
from stagewise.model.optim import build_optimizer
from stagewise.model.progress import TrainProgress
from stagewise.model.rng import capture_rng, restore_rng
from stagewise.model.schedules import lr_at
from stagewise.model.step import accumulate, collect, grad_stats, resolve_precision

log = logging.getLogger(__name__)

LogFn = Callable[[list[tuple[int, int, dict[str, float]]]], None]


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: nothing was applied and nothing was saved."""

    def __init__(self, step: int, quantity: str, value: float, last_checkpoint: Path | None) -> None:
        self.step, self.quantity, self.value, self.last_checkpoint = step, quantity, value, last_checkpoint
        super().__init__(
            f"training diverged at step {step}: {quantity} is {value}; "
            f"last good checkpoint: {last_checkpoint or 'none'}"
        )


@dataclass
class FitResult:
    """Where a fit() ended."""

    step: int
    tokens_seen: int
    checkpoint: Path | None
    metrics: dict[str, float] = field(default_factory=dict)
    """The last step's metrics."""
    stop_reason: str = "budget"
    """budget (the stage's tokens are done), until_tokens (the chunk asked for), data_exhausted."""


def numerics() -> dict[str, Any]:
    """What, besides the checkpoint, decides the bits a CPU step computes: the torch build and
    its intra-op thread count (a kernel may split a reduction by thread). Recorded in every
    checkpoint; a resume under different numerics warns instead of silently differing."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads()}


def _is_exhausted(err: BaseException) -> bool:
    return isinstance(err, StopIteration) or any(c.__name__ == "DataExhausted" for c in type(err).__mro__)


def _monitors(model: torch.nn.Module, cfg: TrainConfig) -> tuple[Any, Any]:
    """RoutingMonitor (None without MoE layers) and ActivationMonitor."""
    routing = RoutingMonitor(model, window=cfg.monitor.dead_expert_window)
    if not routing.routers:
        routing.remove()
        routing = None
    return routing, ActivationMonitor(model)


def _remove_hooks(*monitors: Any) -> None:
    for monitor in monitors:
        if monitor is not None:
            monitor.remove()


class Trainer:
    """Trains `model` on `batches` with `objective` under `cfg`; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainConfig,
        batches: Any,
        objective: Any,
        out_dir: str | Path,
        stage: str,
        tokenizer_dir: str | Path | None,
        recipe_hash: str,
        log: LogFn | None = None,
        device: str | torch.device = "cpu",
        progress: bool = True,
        parent: str | Path | None = None,
        meta_extra: dict[str, Any] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.cfg, self.batches, self.objective = cfg, batches, objective
        self.out_dir, self.stage = Path(out_dir), stage
        self.tokenizer_dir, self.recipe_hash = tokenizer_dir, recipe_hash
        self.log, self.progress = log, progress
        self.parent = str(parent) if parent is not None else None
        self.meta_extra = dict(meta_extra or {})
        self.optimizer = build_optimizer(model, cfg.optimizer)
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        self.routing, self.act = _monitors(model, cfg)
        # The monitors' hooks live on the model, which may outlive this Trainer (the next
        # chunk, an evaluation): a forgotten RoutingMonitor would keep every forward's router
        # graph. Remove them with the Trainer (or earlier, with close()).
        self._finalizer = weakref.finalize(self, _remove_hooks, self.routing, self.act)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.total_numel = sum(p.numel() for p in self.params)
        self.flops_per_token = flops_per_token(model, cfg.seq_length)
        self.step = 0
        self.tokens_seen = 0
        self.last_checkpoint: Path | None = None
        self._saved_step: int | None = None
        self._buffer: list[tuple[int, int, dict[str, float]]] = []
        self._peak: float | None = None

    def close(self) -> None:
        """Take the monitors' hooks off the model (also done when the Trainer is collected)."""
        self._finalizer()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ one step

    def _set_lr(self) -> float:
        c = self.cfg
        lr = lr_at(self.tokens_seen, c.schedule, c.optimizer, c.tokens)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _check_finite(self, values: dict[str, float]) -> None:
        for name in ("loss", *sorted(k for k in values if k.endswith("_loss")), "grad_norm"):
            if name in values and not math.isfinite(values[name]):
                self.optimizer.zero_grad(set_to_none=True)  # refuse the step: nothing is applied
                self.flush()
                raise TrainingDiverged(self.step + 1, name, values[name], self.last_checkpoint)

    def train_step(self, batch: torch.Tensor, started: float | None = None) -> dict[str, float]:
        """One optimizer step on a global batch; returns the step's metrics (`train/...`).

        `started` (a time.perf_counter() value, default now) is where the step's wall time
        starts; fit() passes the time before it asked for the batch, so tokens_per_s counts
        data loading too."""
        c = self.cfg
        t0 = time.perf_counter() if started is None else started
        lr = self._set_lr()
        batch = batch.to(self.device, non_blocking=True)
        micros = batch.split(c.micro_batch)
        act_due = self.act is not None and (self.step + 1) % c.monitor.act_rms_every_steps == 0
        if self.act is not None:
            self.act.enabled = act_due
        if self.routing is not None:
            self.routing.clear()
        try:
            sums = accumulate(self.model, self.objective, micros, LossContext(self.routing), self.amp_dtype)
        finally:
            if self.act is not None:
                self.act.enabled = False
        sums.update(grad_stats(self.params, self.total_numel))
        values = collect(sums)  # the step's one host sync, before the update
        self._check_finite(values)
        if c.optimizer.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, c.optimizer.grad_clip, sums["grad_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += c.tokens_per_step
        metrics = {f"train/{k}": v for k, v in values.items()}
        metrics["train/lr"] = lr
        if self.routing is not None:
            metrics.update(self.routing.step_metrics())
        if act_due:
            metrics.update(self.act.metrics())
        elapsed = time.perf_counter() - t0
        metrics["train/tokens_per_s"] = c.tokens_per_step / elapsed
        if self._peak:
            metrics["train/mfu"] = self.flops_per_token * metrics["train/tokens_per_s"] / self._peak
        return metrics

    # ------------------------------------------------------------ the loop

    def fit(self, until_tokens: int | None = None, past_budget: bool = False) -> FitResult:
        """Train until `until_tokens` (rounded up to whole steps) or the stage's budget
        (`cfg.tokens`, rounded down), save a checkpoint, and return where it stopped.

        `past_budget`: `until_tokens` may lie beyond the budget (a person extended it at the gate); the
        learning rate goes on as the schedule has it after its end (a decayed schedule stays at min)."""
        c = self.cfg
        target = c.tokens if until_tokens is None else until_tokens if past_budget else min(until_tokens, c.tokens)
        last_step = max(c.total_steps, -(-target // c.tokens_per_step)) if past_budget else c.total_steps
        compute_dtype = self.amp_dtype or self.params[0].dtype
        self._peak = peak_flops(self.device, compute_dtype)
        metrics: dict[str, float] = {}
        stop = "budget"
        with TrainProgress(self.progress, last_step, self.step, self.stage) as bar:
            while self.step < last_step and self.tokens_seen < target:
                started = time.perf_counter()
                try:
                    batch = self.batches.next_batch()
                except Exception as err:  # noqa: BLE001 - only end-of-data is swallowed
                    if not _is_exhausted(err):
                        raise
                    stop = "data_exhausted"
                    break
                metrics = self.train_step(batch, started)
                metrics.update(getattr(batch, "metrics", None) or {})  # what the source measured (RL rewards)
                self._buffer.append((self.step, self.tokens_seen, metrics))
                if self.step % c.monitor.log_every_steps == 0:
                    self.flush()
                bar.update(self.step, self.tokens_seen, metrics.get("train/lm_loss", metrics["train/loss"]),
                           metrics["train/tokens_per_s"])
                if self._checkpoint_due():
                    self.save()
        if stop != "data_exhausted" and self.step < last_step:
            stop = "until_tokens"
        self.flush()
        if self._saved_step != self.step:
            self.save()
        return FitResult(self.step, self.tokens_seen, self.last_checkpoint, metrics, stop)

    def _checkpoint_due(self) -> bool:
        every = self.cfg.checkpoint_every_tokens
        if not every:
            return False
        before = self.tokens_seen - self.cfg.tokens_per_step
        return self.tokens_seen // every > before // every

    def flush(self) -> None:
        """Hand the buffered metrics to `log` in one call."""
        if self._buffer and self.log is not None:
            self.log(self._buffer)
        self._buffer = []

    # ------------------------------------------------------------ checkpoints

    def _meta_extra(self) -> dict[str, Any]:
        extra = dict(self.meta_extra)
        mtp = getattr(self.model, "mtp", None)
        if mtp is not None:
            extra["mtp"] = {"num_heads": mtp.num_heads, "loss_weight": mtp.loss_weight}
        return extra

    def weights_for_checkpoint(self) -> torch.nn.Module:
        """Hook: the module whose weights a checkpoint holds (`save_pretrained` is called on it).
        The trained model itself here; a LoRA trainer returns a merged copy (model/lora.py)."""
        return self.model

    def state_to_save(self) -> dict[str, Any]:
        """Hook: extra tensors (plain types) a subclass needs to resume, stored beside the
        monitors' state in trainer_state/monitors.pt and read back by `_load_weights`."""
        return {}

    def save(self) -> Path:
        """Write a resumable checkpoint `out_dir/step-XXXXXXXX`, then prune old ones."""
        meta = ck.CheckpointMeta(
            self.stage, self.step, self.tokens_seen, self.recipe_hash, self.parent, extra=self._meta_extra()
        )
        monitors = {"routing": self.routing.state_dict()} if self.routing is not None else {}
        state = ck.TrainerState(
            optimizer=self.optimizer.state_dict(),
            progress={"step": self.step, "tokens_seen": self.tokens_seen, "numerics": numerics()},
            rng=capture_rng(),
            loader=self.batches.state_dict() if hasattr(self.batches, "state_dict") else None,
            monitors=monitors | self.state_to_save(),
        )
        weights = self.weights_for_checkpoint()
        path = ck.save_checkpoint(
            self.out_dir / f"step-{self.step:08d}", weights, self.tokenizer_dir, meta, state
        )
        del weights  # a merged copy is freed before training goes on
        self.last_checkpoint, self._saved_step, self.parent = path, self.step, str(path)
        self._prune()
        return path

    def _prune(self) -> None:
        keep = self.cfg.keep_checkpoints
        if not keep:
            return
        found = ck.list_checkpoints(self.out_dir)
        intermediate = [d for d in found if ck.read_meta(d).tokens_seen < self.cfg.tokens]
        for old in intermediate[:-keep]:
            if old != self.last_checkpoint:
                ck.remove_checkpoint(old)

    def _load_weights(self, ckpt_dir: Path, state: ck.TrainerState) -> None:
        """Put the checkpoint's weights into the model (a LoRA trainer restores its adapters instead)."""
        ck.load_weights_into(self.model, ckpt_dir)

    def resume(self, ckpt_dir: str | Path) -> None:
        """Restore weights, optimizer, schedule position, RNG, data position and monitors."""
        ckpt_dir = Path(ckpt_dir)
        meta = ck.read_meta(ckpt_dir)
        state = ck.load_trainer_state(ckpt_dir)
        if state is None:
            raise ValueError(f"{ckpt_dir} has no trainer_state/: it is not a resumable checkpoint")
        if meta.stage != self.stage:
            raise ValueError(f"{ckpt_dir} belongs to stage {meta.stage!r}, not {self.stage!r}")
        saved, now = state.progress.get("numerics"), numerics()
        if saved is not None and saved != now:
            log.warning("resuming %s written with %s under %s: CPU results may differ in the last bits "
                        "from an uninterrupted run (different kernels or reduction splits)", ckpt_dir, saved, now)
        self._load_weights(ckpt_dir, state)
        self.optimizer.load_state_dict(state.optimizer)
        self.step = int(state.progress["step"])
        self.tokens_seen = int(state.progress["tokens_seen"])
        restore_rng(state.rng)
        if state.loader is not None and hasattr(self.batches, "load_state_dict"):
            self.batches.load_state_dict(state.loader)
        if self.routing is not None and "routing" in state.monitors:
            self.routing.load_state_dict(state.monitors["routing"])
        self.last_checkpoint, self._saved_step, self.parent = ckpt_dir, self.step, str(ckpt_dir)
