"""The recipe check's engine part: what a stage's `engine:` and `launch:` ask for, judged before any work.

The recipe loader (recipe/loader.py) runs these after the recipe validates, next to the recipe's own
cross-field checks, so `stagewise check`, `stagewise run` and a deployment's form all refuse an
engine a stage cannot have, a launched engine with nowhere to run, a gate on a stage trained in one
go, and whatever the engine's translation (engines/megatron/, engines/nemo_rl/) would refuse at the
stage's start: each problem as (yaml path, why, path whose line to cite).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagewise.engines import LAUNCHED_GATE
from stagewise.engines.launch_text import MOUNT_BREAKERS
from stagewise.engines.megatron.checks import megatron_problems
from stagewise.engines.nemo_rl.checks import nemo_rl_problems


def engine_problems(r: Any) -> list[tuple[str, str, str]]:
    """Each trainable stage's engine is one its block can have, a launched engine says where it runs,
    and what the engine's translation would refuse at the stage's start is found now.

    `r` is a validated Recipe (recipe/schema.py); the engines a stage can have are its block's
    `ENGINES` (blocks without one have no engine). Typed loosely because the recipe imports this room,
    not the other way round."""
    out = []
    for name in type(r.stages).model_fields:
        block = getattr(r.stages, name)
        engines = getattr(type(block), "ENGINES", None)
        if block is None or engines is None:
            continue
        at = f"stages.{name}"
        if block.engine not in engines:
            out.append((f"{at}.engine", f"{block.engine!r} cannot train {name}; choose one of {', '.join(engines)}",
                        f"{at}.engine"))
        elif block.engine != "torch" and block.launch is None:
            out.append((f"{at}.launch", f"engine {block.engine!r} is launched: give `launch` "
                        "(env: {image: ...} or {venv: ...}, nodes, gpus_per_node, parallel)", f"{at}.engine"))
        elif block.engine != "torch" and block.launch.gpus_per_node == 0:
            out.append((f"{at}.launch.gpus_per_node", f"engine {block.engine!r} runs on GPUs: give gpus_per_node >= 1 "
                        "(0 is a CPU job, for engine torch)", f"{at}.launch.gpus_per_node"))
        elif block.engine != "torch" and getattr(block, "gate", None) is not None:
            out.append((f"{at}.gate", LAUNCHED_GATE.format(engine=block.engine), f"{at}.gate"))
        elif block.engine != "torch" and block.launch.env.image is not None and MOUNT_BREAKERS.search(str(Path(r.workdir).resolve())):
            out.append(("workdir", f"{str(Path(r.workdir).resolve())!r} is mounted into {at}'s container as SRC:DST "
                        "(docker -v, pyxis --container-mounts): a path without ':', ',' or whitespace", "workdir"))
        elif block.engine == "megatron":
            out += megatron_problems(r, name)
        elif block.engine == "nemo_rl":
            out += nemo_rl_problems(r, name)
    return out
