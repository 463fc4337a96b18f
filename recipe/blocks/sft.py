"""The SFT stage's recipe block (`stages.sft`): curated conversations, then sub-stages trained in
turn (each its blend, pack size, loss normalisation, schedule, optional LoRA and gate)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from stagewise.data.sft_config import SFTBlend, SFTDataConfig
from stagewise.engines.config import EngineChoice
from stagewise.eval.gates import GateConfig
from stagewise.eval.metric_names import heldout_metric_names, heldout_prefix
from stagewise.model.config import LoRAConfig, TrainConfig
from stagewise.recipe.blocks.contract import Stretch, scaled

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


class SFTSubStage(TrainConfig):
    """One SFT sub-stage: its blend, packs (seq_length is the pack size), loss normalisation, LR schedule."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Sub-stage name: its MLflow run, metric prefix `sft/<name>/...` and stage directory."""
    normalization: Literal["token", "conversation"] = "token"
    """Loss normalisation (ALGORITHMS.md 4): token (every supervised token weighs the same) or
    conversation (every conversation weighs the same, however long)."""
    blend: SFTBlend
    """Domain weights, conversation count and reasoning-off fraction of this sub-stage's sample."""
    keep_previous: float = Field(0.0, ge=0, le=1)
    """Share of the previous sub-stage's sample trained on again here, added to this blend's sample
    (so a later sub-stage does not forget the earlier one's data)."""
    max_epochs: float | None = Field(None, gt=0)
    """Passes over the packed rows at most (None: as many as the token budget needs)."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) run at this sub-stage's gate marks, besides the held-out conversations."""
    gate: GateConfig | None = None
    """Stop the sub-stage early when this rule holds on its evaluations (see eval/gates.py)."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters only; every checkpoint is saved merged (a plain model)."""


class SFTStage(EngineChoice):
    """Supervised fine-tuning: curate conversations, then train one or more sub-stages in turn."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch", "megatron")

    data: SFTDataConfig
    """Sources, curation and the optional demo-world conversations."""
    stages: list[SFTSubStage] = Field(min_length=1)
    """Sub-stages in order, each starting from the previous one's checkpoint
    (e.g. short packs and token normalisation, then long packs and conversation normalisation)."""
    eval_suite: str | None = None
    """An eval suite scored on the starting (base) model and after every sub-stage: the
    before/after comparison logged as `sft/<task>/<metric>_delta`."""
    eval_limit: int | None = Field(None, gt=0)
    """Items per task of eval_suite (None: all)."""

    def stretches(self, at: str) -> Iterator[Stretch]:
        """One fine-tuning stretch per sub-stage, in order (each its own LR schedule, LoRA and gate)."""
        for i, sub in enumerate(self.stages):
            yield Stretch(f"{at}.stages[{i}]", sub, "finetune", step_tokens=sub.tokens_per_step,
                          lora=sub.lora is not None, gate=sub.gate)

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """Every sub-stage scaled: tokens, warmup and checkpoint interval shrink together; gates are left out."""
        return scaled(self.stretches(at), fraction)

    def gate_metrics(self, recipe: Recipe) -> set[str]:
        """At a gate's marks SFT scores the held-out conversations' dev split (a gate never reads test:
        eval/splits.py), per domain of its sources, when it has held-out conversations (flows/sft.py)."""
        if not (self.data.heldout or self.data.world):
            return set()
        domains = sorted({s.domain_name for s in self.data.sources})
        return {f"{heldout_prefix('dev')}/{n}" for n in heldout_metric_names(domains)}
