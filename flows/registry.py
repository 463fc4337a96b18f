"""Every stage the pipeline can run, in pipeline order: one line per stage.

A stage is a module with its flow, its inputs model and a `STAGE_ENTRY` (flows/stage.py).
Adding one is that module, a line here, and its recipe block (a field of StagesConfig in
recipe/schema.py, so the recipe validates it before any work). The order must follow
the design's STAGE_ORDER; tests/flows/test_registry.py holds both rules.
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

assert [s.name for s in REGISTRY] == [n for n in STAGE_ORDER if n in {s.name for s in REGISTRY}], \
    "flows/registry.py must list stages in STAGE_ORDER"


def registered(name: str) -> Stage:
    """The registry entry of stage `name` (KeyError when this version has none)."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise KeyError(name)
