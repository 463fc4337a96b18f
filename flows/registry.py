"""Every stage the pipeline can run, in pipeline order: one line per stage.

A stage is a module with its flow, its inputs model and a `STAGE_ENTRY` (flows/stage.py: what it
trains from, needs and hands on). Adding one is that module, a line here, and its recipe block
(recipe/blocks/<stage>.py and its field of StagesConfig in recipe/schema.py, where the stage's name
and pipeline order are written once, as STAGE_ORDER), which declares how the stage trains
(recipe/blocks/contract.py: its stretches, how an ablation scales its budget). This list must be
STAGE_ORDER, entry for entry: checked at import. `problems` says what an entry or its block lacks
that the pipeline, the ablation planner or the recipe doctor reads (tests/flows/test_registry.py).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence

from stagewise.flows import distill, long_context, merge, pretrain, quantize, rl, sft
from stagewise.flows.stage import Stage
from stagewise.recipe import STAGE_ORDER
from stagewise.recipe.blocks.contract import missing_hooks
from stagewise.recipe.schema import stage_blocks

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


def problems(entries: Sequence[Stage] = REGISTRY, blocks: Mapping[str, type] | None = None) -> list[str]:
    """What `entries` (in pipeline order) lack that the pipeline, the ablation planner or the recipe doctor
    reads; empty when nothing. Each entry's recipe block (`blocks[name]`, else its StagesConfig field's
    type) must define the hooks of recipe/blocks/contract.py; `needs` must name earlier stages; `start`
    and `hands_on` must be values the pipeline knows, and nothing may start from an export."""
    hints = typing.get_type_hints(Stage)
    starts, hands = typing.get_args(hints["start"]), typing.get_args(hints["hands_on"])
    known = {**stage_blocks(), **(blocks or {})}
    out: list[str] = []
    earlier: list[str] = []
    export: str | None = None
    for entry in entries:
        block = known.get(entry.name)
        if block is None:
            out.append(f"{entry.name}: no recipe block (add its field to StagesConfig in recipe/schema.py)")
        else:
            out += [f"{entry.name}: its recipe block {block.__name__} has no `{hook}` (recipe/blocks/contract.py)"
                    for hook in missing_hooks(block)]
        out += [f"{entry.name}: needs {need!r}, which is no earlier stage" for need in entry.needs if need not in earlier]
        if entry.start not in starts:
            out.append(f"{entry.name}: start {entry.start!r} is none of {', '.join(starts)}")
        if entry.hands_on not in hands:
            out.append(f"{entry.name}: hands_on {entry.hands_on!r} is none of {', '.join(hands)}")
        if entry.start == "handed_on" and export is not None:
            out.append(f"{entry.name}: starts from what {export} hands on, an export nothing trains from")
        if entry.hands_on == "export":
            export = entry.name
        earlier.append(entry.name)
    return out
