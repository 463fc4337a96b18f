"""Our NeMo RL rows through the released NeMo Gym's own row models (nemo-gym 0.7.0 in .venv-gym).

The rows are written by our code as the RL stage writes them for `engine: nemo_rl`: the demo
world's RL files (every domain, the calculator's tool rows included) read as the stage reads its
sources (tasks/rl.py load_tasks), each row's agent from `nemo_gym.agents` (engines/nemo_rl/stage.py
row_agents), then engines/nemo_rl/stage.py rl_plan's `nemo-rl/train.jsonl`. The side script
(side_env/check_rows.py) validates every line with NeMo Gym's row model, its simple agent's /run
request and the /verify request that agent builds from it. Probes that must be rejected go through
the same call, so a pass means the models do reject: the calculator row as the world writes it
(Chat-Completions tool definitions: what reached NeMo Gym before the rows were written with gym_row),
and a row whose request carries a Chat-Completions key (`max_tokens`) that the Responses request
forbids.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stagewise.data.rl_rows import read_rows
from stagewise.data.world.rl_rows import ENVIRONMENTS, generate_rl_world
from stagewise.engines.nemo_rl.stage import row_agents, rl_plan
from stagewise.engines.nemo_rl.translate import MlflowTarget
from stagewise.model.rl_batches import RolloutSettings
from stagewise.recipe.blocks.engine import EngineEnv, LaunchConfig, NemoGym
from stagewise.recipe.blocks.rl import RLData, RLSource, RLStage
from stagewise.tasks.rl import load_tasks

pytestmark = pytest.mark.megatron

SCRIPT = Path(__file__).parent / "side_env" / "check_rows.py"
AGENTS = {env: f"{env}_agent" for envs in ENVIRONMENTS.values() for env in envs}


def _check(python: Path, path: Path) -> dict:
    done = subprocess.run([str(python), str(SCRIPT), str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_our_rl_rows_pass_nemo_gyms_row_models(gym_python, tmp_path):
    world = generate_rl_world(tmp_path / "world", seed=11, per_domain=12)
    domains = [d for d in world if d != "eval"]
    rows = [r for d in domains for r in load_tasks(world[d], d, None, None)]
    stage = RLStage(data=RLData(sources=[RLSource(name=d, path=str(world[d])) for d in domains]), steps=3,
                    prompts_per_step=8, reasoning=True, engine="nemo_rl",
                    launch=LaunchConfig(env=EngineEnv(venv="/opt/nemo-rl/.venv", workdir="/opt/nemo-rl"),
                                        gpus_per_node=2),
                    nemo_gym=NemoGym(agents=AGENTS, config_paths=["resources_servers/x/configs/x.yaml"]),
                    rollout=RolloutSettings(group_size=2, max_new_tokens=8, off_policy=False, max_refills=1))
    by_domain: dict[str, list[tuple[str, float]]] = {}
    for k, r in enumerate(rows):
        by_domain.setdefault(r.domain, []).append((r.id, (k % 5) / 4))
    out = tmp_path / "rl-step"
    rl_plan(stage, start="/w/sft", rows={r.id: r.row for r in rows}, agents=row_agents(rows, stage.nemo_gym),
            by_domain=by_domain, ratios={d: 1.0 for d in domains}, max_prompt_tokens=64, out_dir=out, seed=11,
            mlflow=MlflowTarget("e", "r"))
    train = out / "nemo-rl" / "train.jsonl"
    written = [json.loads(line) for line in train.read_text().splitlines()]
    assert len(written) == (3 + 3) * 8  # the steps' batches, then one refill batch per step
    assert {w["domain"] for w in written} == set(domains)  # the calculator's tool rows among them

    # the probes: the world's calculator row as written (Chat-Completions tools), a Chat-Completions key
    raw_tool_row = next(r for r in read_rows(world["calculator"]) if r.responses_create_params.tools)
    chat_key = {**written[0], "responses_create_params": {**written[0]["responses_create_params"], "max_tokens": 8}}
    checked = tmp_path / "checked.jsonl"
    shutil.copyfile(train, checked)
    with checked.open("a", encoding="utf-8") as f:
        f.write(json.dumps(raw_tool_row.as_json()) + "\n" + json.dumps(chat_key) + "\n")

    got = _check(gym_python, checked)
    assert got["versions"]["nemo-gym"] == "0.7.0"
    ours, (tool_probe, key_probe) = got["results"][:-2], got["results"][-2:]
    assert len(ours) == len(written)
    bad = [(r["id"], r["errors"]) for r in ours if not all(r["ok"].values())]
    assert not bad, bad[:3]
    assert set(ours[0]["ok"]) == {"row", "run", "verify"}
    tools = [w["responses_create_params"]["tools"][0] for w in written if w["domain"] == "calculator"]
    assert tools and all(t["type"] == "function" and t["name"] == "calculator" for t in tools)

    assert not any(tool_probe["ok"].values())
    assert {e["loc"] for e in tool_probe["errors"]["row"]} >= {
        "responses_create_params.tools.0.FunctionToolParam.name",
        "responses_create_params.tools.0.FunctionToolParam.function"}  # name missing, `function` not allowed
    assert not any(key_probe["ok"].values())
    assert [e["loc"] for e in key_probe["errors"]["row"]] == ["responses_create_params.max_tokens"]
