"""What a stage's recipe block declares about itself beyond its keys: how it trains.

The tools that read a recipe stage by stage, without knowing the stages, ask each block rather
than a list of stage names: the recipe doctor (recipe/doctor/: which learning rates, warmups and
gates its rules judge) and the ablation planner (flows/ablate_plan.py: how a variant's training
budget shrinks). So adding a stage adds no branch there. Every block of StagesConfig defines

- `stretches(at) -> Iterator[Stretch]`: what it trains, one Stretch per run of one optimizer and
  LR schedule (pretraining: one; SFT: one per sub-stage; merge, quantize: none), `at` being the
  block's YAML path (`stages.<name>`);
- `budget_overrides(at, fraction, recipe) -> list[str]`: the `--set` overrides that give it
  `fraction` of its training budget (usually its stretches scaled, `scaled`; none when it trains
  nothing: merge and quantize say so);

and a block whose keys can hold a gate (a GateConfig anywhere in them) also
- `gate_metrics(recipe) -> set[str]`: the eval names its evaluations log at a gate's marks,
  besides the gate's suite (what a gate may name);

and a block that can name an earlier stage's result in its keys (distillation's `student: sft`,
`stage:` teachers) defines `results_named(at) -> list[str]`, so an ablation, which runs the
stage alone, refuses it up front.

These are methods, never fields: they add no recipe key and change no step hash. The flows'
side of a stage (what it starts from, needs and hands on) is its `Stage` entry (flows/stage.py);
`missing_hooks` is what tests/flows/test_registry.py holds every registered stage's block to.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from stagewise.eval.gates import GateConfig

HOOKS: tuple[str, ...] = ("stretches", "budget_overrides")
"""What every stage block defines."""
GATED_HOOKS: tuple[str, ...] = ("gate_metrics",)
"""What a block that can hold a gate defines as well."""

Role = Literal["pretrain", "continued", "finetune"]


@dataclass(frozen=True)
class Stretch:
    """One stretch a stage trains under one optimizer and one LR schedule (a block or a sub-block)."""

    at: str
    """Its YAML path, e.g. `stages.sft.stages[0]`: findings and overrides name `<at>.optimizer.lr` etc."""
    block: Any
    """The (sub-)block: `.optimizer` and `.schedule`; budgeted in tokens, `.tokens` and
    `.checkpoint_every_tokens`; budgeted in steps, `.steps` and `.checkpoint_every_steps`."""
    role: Role
    """pretrain: the recipe's pretraining (its peak LR is what later stages are judged against);
    continued: continued pretraining on the pretraining data (long context: judged against
    pretraining's peak only); finetune: a stage that continues a trained model on its own data."""
    step_tokens: int | None = None
    """Tokens per optimizer step when budgeted in tokens (warmup is then judged); None: budgeted in
    optimizer steps (RL, distillation)."""
    lora: bool = False
    """Trains LoRA adapters only (a fine-tune LR may be higher)."""
    gate: Any = None
    """Its gate (eval/gates.py GateConfig), None: ungated."""

    def scaled(self, fraction: float) -> list[str]:
        """The `--set` overrides that give this stretch `fraction` of its budget. In tokens: tokens, warmup
        and checkpoint interval shrink together, in whole steps, and the gate is left out (its targets
        and marks are the whole budget's: a shortened run would miss them). In steps: steps and
        checkpoint interval."""
        b, at = self.block, self.at
        if self.step_tokens is None:
            out = [f"{at}.steps={max(1, round(b.steps * fraction))}"]
            if b.checkpoint_every_steps:
                out.append(f"{at}.checkpoint_every_steps={max(1, round(b.checkpoint_every_steps * fraction))}")
            return out
        tokens = _steps(b.tokens, self.step_tokens, fraction)
        out = [f"{at}.tokens={tokens}"] + ([f"{at}.gate=null"] if self.gate is not None else [])
        if b.schedule.warmup_tokens:
            out.append(f"{at}.schedule.warmup_tokens={min(int(b.schedule.warmup_tokens * fraction), tokens // 2)}")
        if b.checkpoint_every_tokens:
            out.append(f"{at}.checkpoint_every_tokens={_steps(b.checkpoint_every_tokens, self.step_tokens, fraction)}")
        return out


def _steps(tokens: int, per_step: int, fraction: float) -> int:
    """`fraction` of `tokens`, in whole steps of `per_step` tokens, at least one step."""
    return max(1, round(tokens * fraction / per_step)) * per_step


def scaled(stretches: Iterable[Stretch], fraction: float) -> list[str]:
    """Every stretch given `fraction` of its budget (the usual `budget_overrides`)."""
    return [o for s in stretches for o in s.scaled(fraction)]


def holds_gate(model: type[BaseModel]) -> bool:
    """Whether a GateConfig can appear anywhere in `model`'s keys (directly, in a list, in a sub-block)."""
    seen: set[type] = set()

    def walk(t: Any) -> bool:
        if isinstance(t, type) and issubclass(t, BaseModel):
            if issubclass(t, GateConfig):
                return True
            if t in seen:
                return False
            seen.add(t)
            return any(walk(f.annotation) for f in t.model_fields.values())
        return any(walk(a) for a in typing.get_args(t))

    return walk(model)


def missing_hooks(block: type) -> list[str]:
    """The hooks a stage block class lacks (empty: the doctor and the ablation planner can read it)."""
    wanted = HOOKS + (GATED_HOOKS if isinstance(block, type) and issubclass(block, BaseModel) and holds_gate(block)
                      else ())
    return [h for h in wanted if not callable(getattr(block, h, None))]
