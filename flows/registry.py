"""Every stage the pipeline can run, in pipeline order: one line per stage.

A stage is a module with its flow, its inputs model and a `STAGE_ENTRY` (flows/stage.py).
Adding one is that module, a line here, and its recipe block (recipe/blocks/<stage>.py and its
field of StagesConfig in recipe/schema.py, where the stage's name and pipeline order are written
once, as STAGE_ORDER). This list must be STAGE_ORDER, entry for entry: checked at import.
"""

from __future__ import annotations

from stagewise.flows import distill, long_context, merge, pretrain, quantize, rl, sft
from stagewise.recipe import STAGE_ORDER
from stagewise.flows.stage import Stage

REGISTRY: tuple[Stage, ...] = (
    pretrain.STAGE_ENTRY,
    merge.STAGE_ENTRY,
    long_context.STAGE_ENTRY,
    sft.STAGE_ENTRY,
    rl.STAGE_ENTRY,
    distill.STAGE_ENTRY,
    quantize.STAGE_ENTRY,
)

assert tuple(s.name for s in REGISTRY) == STAGE_ORDER, "flows/registry.py must list every stage of STAGE_ORDER, in its order"


def registered(name: str) -> Stage:
    """The registry entry of stage `name` (KeyError when this version has none)."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise KeyError(name)
