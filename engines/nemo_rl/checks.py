"""The recipe check of `engine: nemo_rl` (rl, distill): NeMo RL's translation, run before any work.

What the recipe alone tells is checked here, so a stage NeMo RL cannot train is refused (exit 2)
before any data is made: the features NeMo RL cannot express (engines/nemo_rl/translate.py's unsupported
and unsupported_distill), every verifier the rows name having a NeMo Gym agent in `nemo_gym.agents`
(a source's `environment`; for the demo world's files, the verifiers its domain writes), where the
entry runs, and the translation itself on placeholder paths (distillation: teacher routes by
agent, nodes left for the student). A file without a source `environment` names its verifiers
only when read, and the warmup's conversion to whole steps needs the longest prompt: the stage
checks both again at its start (engines/nemo_rl/stage.py), before anything trains.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stagewise.data.config import WORLD_PREFIX
from stagewise.data.world.rl_prompts import ENVIRONMENTS
from stagewise.engines import PLACEHOLDER
from stagewise.engines.nemo_rl.translate import (
    MlflowTarget,
    distill_config,
    grpo_config,
    unsupported,
    unsupported_distill,
)

Problem = tuple[str, str, str]


def nemo_rl_problems(r: Any, name: str) -> list[Problem]:
    """What NeMo RL's translation of `stages.<name>` (rl or distill) refuses, as recipe problems."""
    return {"rl": _rl, "distill": _distill}[name](r)


def refusals(at: str, unsupported: Iterable[tuple[str, str]]) -> list[Problem]:
    """The translation's (field, why) pairs as problems under `at` (e.g. `stages.rl`); a verifier
    without an agent is named where its agent would go, `<at>.nemo_gym.agents.<environment>`."""
    out = []
    for field, why in unsupported:
        env = field.removeprefix("environment.")
        path = f"{at}.nemo_gym.agents.{env}" if env != field else f"{at}.{field}"
        out.append((path, f"NeMo RL cannot train this as ours does: {why} (or use engine torch)", path))
    return out


def known_environments(data) -> dict[str, set[str]]:
    """domain -> the verifiers its rows name, for the sources whose verifiers the recipe tells
    (their `environment`, or the demo world's file of a domain); other files are left out."""
    out: dict[str, set[str]] = {}
    for src in data.sources:
        world = src.path.removeprefix(f"{WORLD_PREFIX}rl_").removesuffix(".jsonl") if src.path.startswith(
            WORLD_PREFIX) else None
        if src.environment is not None:
            envs = {src.environment}
        elif world in ENVIRONMENTS:
            kinds = data.world.format_kinds if data.world is not None and world == "format" else None
            envs = set(ENVIRONMENTS[world]) & set(kinds or ENVIRONMENTS[world])
        else:
            continue
        out.setdefault(src.domain or world or src.name, set()).update(envs)
    return out


def _placement(at: str, block) -> list[Problem]:
    if block.launch.env.venv is not None and block.launch.env.workdir is None:
        where = f"{at}.launch.env.workdir"
        return [(where, "set it to NeMo RL's checkout: its entry (examples/nemo_gym/run_grpo_nemo_gym.py) and its "
                 "converters (examples/converters/) run there", where)]
    return []


def _rl(r: Any) -> list[Problem]:
    rl, at = r.stages.rl, "stages.rl"
    gym = rl.nemo_gym
    envs = {e for v in known_environments(rl.data).values() for e in v}
    out = _placement(at, rl) + refusals(at, unsupported(rl, environments=envs, gym_agents=gym.agents if gym else None))
    grpo_config(rl, model=PLACEHOLDER, launch=rl.launch, run_dir=PLACEHOLDER, train_path=PLACEHOLDER,
                gym_config_paths=gym.config_paths if gym else [], max_prompt_tokens=1, mlflow=MlflowTarget("e", "r"))
    return out


def domain_agents(by_domain: dict[str, set[str]], at: str) -> tuple[dict[str, str], list[Problem]]:
    """domain -> its one NeMo Gym agent, from the agents its rows run under (NeMo RL routes a
    distillation teacher by agent name), and a problem for each domain with several."""
    out, problems = {}, []
    for domain, agent_set in sorted(by_domain.items()):
        names = sorted(agent_set)
        if len(names) > 1:
            where = f"{at}.nemo_gym.agents"
            problems.append((where, f"domain {domain!r} has rows under agents {', '.join(names)}: NeMo RL routes a "
                             "teacher by agent name, so a domain needs one agent (or use engine torch)", where))
        elif names:
            out[domain] = names[0]
    return out, problems


def _distill(r: Any) -> list[Problem]:
    d, at = r.stages.distill, "stages.distill"
    data = d.data or (r.stages.rl.data if r.stages.rl else None)
    if data is None:  # _distill_problems names the missing prompts
        return []
    gym = d.nemo_gym
    known = known_environments(data)
    envs = {e for v in known.values() for e in v}
    out = _placement(at, d) + refusals(at, unsupported_distill(d, environments=envs,
                                                                gym_agents=gym.agents if gym else None))
    routed = {dom for t in d.teachers for dom in t.domains}
    if out or not routed <= set(known):  # the routes need every teacher's domain's agent: the stage checks them
        return out
    named = gym.agents if gym else {}
    agents, clashes = domain_agents({dom: {named[e] for e in envs if e in named} for dom, envs in known.items()}, at)
    if clashes:
        return out + clashes
    try:
        distill_config(d, model=PLACEHOLDER, teacher_models={t.name: f"{PLACEHOLDER}/{t.name}" for t in d.teachers}, agents=agents,
                       launch=d.launch, run_dir=PLACEHOLDER, train_path=PLACEHOLDER,
                       gym_config_paths=gym.config_paths if gym else [], max_prompt_tokens=1,
                       mlflow=MlflowTarget("e", "r"))
    except ValueError as e:
        where = f"{at}.launch.nodes" if "no node" in str(e) else f"{at}.teachers"
        out.append((where, f"NeMo RL cannot run this: {e} (or use engine torch)", where))
    return out
