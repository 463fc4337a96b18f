"""The recipe check of a stage on Megatron-Bridge: its translation run on placeholder paths, so what
the translation refuses is an exit 2 naming the field before any work, not a failure at the stage's start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stagewise.engines import LAUNCHED_SUBSTAGE_GATE, PLACEHOLDER
from stagewise.engines.megatron.translate import (
    MegatronUnsupported,
    chat_jsonl_overrides,
    megatron_precision,
    plan_long_context,
    plan_megatron,
    plan_sft,
)
from stagewise.model.config import TrainConfig


def megatron_problems(r: Any, name: str) -> list[tuple[str, str, str]]:
    """What the Megatron-Bridge translation would refuse at the stage's start, found now: the same
    translation as engines/megatron/stage.py, on placeholder paths (one check per block type)."""
    checks = {"pretrain": _megatron_pretrain, "long_context": _megatron_long_context, "sft": _megatron_sft}
    return checks[name](r)


def _refusals(translate: Callable[[], object]) -> list[tuple[str, str, str]]:
    """The MegatronUnsupported a translation raises, as a problem at the field it names."""
    try:
        translate()
    except MegatronUnsupported as e:
        return [(e.field, e.message, e.field)]
    return []


def _megatron_pretrain(r: Any) -> list[tuple[str, str, str]]:
    pre = r.stages.pretrain
    view = TrainConfig.model_validate(pre.model_dump(include=set(TrainConfig.model_fields)))
    view = view.model_copy(update={"precision": megatron_precision(pre.precision)})
    return _refusals(lambda: plan_megatron(view, pre.launch, r.model, stage_mode="pretrain", save_dir=PLACEHOLDER,
                                           blend=[(PLACEHOLDER, 1.0)], vocab_size=r.tokenizer.vocab_size,
                                           field="stages.pretrain"))


def _megatron_long_context(r: Any) -> list[tuple[str, str, str]]:
    """Trained from pretraining's checkpoint: the recipe's model, its vocabulary the tokenizer's."""
    lc = r.stages.long_context
    return _refusals(lambda: plan_long_context(lc, lc.launch, r.model, save_dir=PLACEHOLDER,
                                               pretrained_checkpoint=PLACEHOLDER, blend=[(PLACEHOLDER, 1.0)],
                                               vocab_size=r.tokenizer.vocab_size))


def _megatron_sft(r: Any) -> list[tuple[str, str, str]]:
    """Every sub-stage translated (from the recipe's model, or `model.from`), and what only a sub-stage
    has: a gate evaluated before the sub-stage's end (one launch per sub-stage: a gate at its end, a
    quality bar on the export, is fine) and max_epochs (Megatron samples the budget's steps,
    wrapping its data as often as they need, with no cap on passes)."""
    sft, out = r.stages.sft, []
    for i, sub in enumerate(sft.stages):
        here = f"stages.sft.stages[{i}]"
        if sub.gate is not None and sub.gate.eval_every_tokens < sub.tokens:
            out.append((f"{here}.gate", LAUNCHED_SUBSTAGE_GATE.format(engine=sft.engine), f"{here}.gate"))
        if sub.max_epochs is not None:
            out.append((f"{here}.max_epochs", "Megatron-Bridge trains the budget's steps and wraps its data as often "
                        "as they need (no cap on passes): drop max_epochs and size `tokens`, or use engine torch",
                        f"{here}.max_epochs"))
        view = sub.model_copy(update={"precision": megatron_precision(sub.precision)})
        out += _refusals(lambda: plan_sft(view, sft.launch, r.model, save_dir=PLACEHOLDER,
                                          pretrained_checkpoint=PLACEHOLDER, dataset="local-jsonl",
                                          dataset_overrides=chat_jsonl_overrides(PLACEHOLDER),
                                          vocab_size=r.tokenizer.vocab_size, field=here))
    return out
