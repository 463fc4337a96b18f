"""Our NeMo RL rows through the released NeMo Gym's own row models (nemo-gym 0.7.0 in .venv-gym).

The rows are written by our code as the RL stage writes them for `engine: nemo_rl`: the demo
world's RL files (every domain, the calculator's tool rows included) read as the stage reads its
sources (eval/rl_wiring.py load_rows), each row's agent from `nemo_gym.agents` (engines/nemo_rl/stage.py
row_agents), then engines/nemo_rl/stage.py rl_plan's `nemo-rl/train.jsonl`. The side script
(side_env/check_rows.py) validates every line with NeMo Gym's row model, its simple agent's /run
request and the /verify request that agent builds from it. Probes that must be rejected go through
the same call, so a pass means the models do reject: the calculator row as the world writes it
(Chat-Completions tool definitions: what reached NeMo Gym before the rows were written with gym_row),
and a row whose request carries a Chat-Completions key (`max_tokens`) that the Responses request
forbids.

The second test maps our verifiers to the agents of NeMo Gym's typed resources servers
(engines/nemo_rl/translate.py GYM_SERVERS: math_with_judge, string_match, equivalence_rule,
structured_outputs) and checks each row also against the verify request of its agent's server
(`--verify-model-for`), with probes those requests must refuse: an int `expected_answer` (pydantic's
str does not coerce it), a math row without `question`, a list answer, a structured-outputs row
without `schema_str`: the rows as they reached NeMo Gym before gym_row wrote the server's fields.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stagewise.data.rl_rows import read_rows
from stagewise.data.world.rl_prompts import ENVIRONMENTS, generate_rl_world
from stagewise.engines.config import EngineEnv, LaunchConfig, NemoGym
from stagewise.engines.nemo_rl.stage import gym_environments, rl_plan, row_agents
from stagewise.engines.nemo_rl.translate import AGENT_TYPE, MlflowTarget, unsupported
from stagewise.eval.rl_wiring import load_rows
from stagewise.model.rl_batches import RolloutSettings
from stagewise.recipe.blocks.rl import RLData, RLSource, RLStage

pytestmark = pytest.mark.megatron

SCRIPT = Path(__file__).parent / "side_env" / "check_rows.py"
AGENTS = {env: f"{env}_agent" for envs in ENVIRONMENTS.values() for env in envs}


def _check(python: Path, path: Path, *args: str) -> dict:
    done = subprocess.run([str(python), str(SCRIPT), str(path), *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _world(tmp_path: Path):
    world = generate_rl_world(tmp_path / "world", seed=11, per_domain=12)
    domains = [d for d in world if d != "eval"]
    return world, domains, [r for d in domains for r in load_rows(world[d], d, None, None)]


def _stage_rows(tmp_path: Path, name: str, agents: dict[str, str], config_paths: list[str]):
    """The demo world's RL rows as rl_plan writes `nemo-rl/train.jsonl` with `agents`: (stage, task
    rows, the written rows, the world's files by domain)."""
    world, domains, rows = _world(tmp_path / name)
    stage = RLStage(data=RLData(sources=[RLSource(name=d, path=str(world[d])) for d in domains]), steps=3,
                    prompts_per_step=8, reasoning=True, engine="nemo_rl",
                    launch=LaunchConfig(env=EngineEnv(venv="/opt/nemo-rl/.venv", workdir="/opt/nemo-rl"),
                                        gpus_per_node=2),
                    nemo_gym=NemoGym(agents=agents, config_paths=config_paths),
                    rollout=RolloutSettings(group_size=2, max_new_tokens=8, off_policy=False, max_refills=1))
    by_domain: dict[str, list[tuple[str, float]]] = {}
    for k, r in enumerate(rows):
        by_domain.setdefault(r.domain, []).append((r.id, (k % 5) / 4))
    out = tmp_path / name / "rl-step"
    rl_plan(stage, start="/w/sft", rows={r.id: r.row for r in rows}, agents=row_agents(rows, stage.nemo_gym),
            by_domain=by_domain, ratios={d: 1.0 for d in domains}, max_prompt_tokens=64, out_dir=out, seed=11,
            mlflow=MlflowTarget("e", "r"))
    train = out / "nemo-rl" / "train.jsonl"
    written = [json.loads(line) for line in train.read_text().splitlines()]
    assert len(written) == (3 + 3) * 8  # the steps' batches, then one refill batch per step
    return stage, rows, written, world


def test_our_rl_rows_pass_nemo_gyms_row_models(gym_python, tmp_path):
    _, _, written, world = _stage_rows(tmp_path, "plain", AGENTS, ["resources_servers/x/configs/x.yaml"])
    domains = [d for d in world if d != "eval"]
    assert {w["domain"] for w in written} == set(domains)  # the calculator's tool rows among them

    # the probes: the world's calculator row as written (Chat-Completions tools), a Chat-Completions key
    raw_tool_row = next(r for r in read_rows(world["calculator"]) if r.responses_create_params.tools)
    chat_key = {**written[0], "responses_create_params": {**written[0]["responses_create_params"], "max_tokens": 8}}
    checked = tmp_path / "checked.jsonl"
    shutil.copyfile(tmp_path / "plain" / "rl-step" / "nemo-rl" / "train.jsonl", checked)
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


# The verify request of each resources server our verifiers map to (nemo-gym 0.7.0, resources_servers/<name>/app.py).
MODELS = {
    "math_with_judge": "resources_servers.math_with_judge.app:LibraryJudgeMathVerifyRequest",
    "string_match": "resources_servers.string_match.app:StringMatchVerifyRequest",
    "equivalence_rule": "resources_servers.equivalence_rule.app:EquivalenceRuleVerifyRequest",
    "structured_outputs": "resources_servers.structured_outputs.app:StructuredOutputsVerifyRequest",
}
# Our verifiers -> NeMo Gym agents as its configs name them (resources_servers/<name>/configs/*.yaml), one
# mapping per run: every pair GYM_SERVERS supports; the calculator (and uppercase) to agents of no such server.
MAPPINGS = {
    "a": {"exact_answer": "math_with_judge_simple_agent", "json_answer": "structured_outputs_simple_agent",
          "sorting": "string_match_simple_agent", "uppercase": "uppercase_agent", "calculator": "calculator_agent"},
    "b": {"exact_answer": "string_match_simple_agent", "json_answer": "structured_outputs_v3_simple_agent",
          "sorting": "lc_equivalence_rule_simple_agent", "uppercase": "uppercase_agent",
          "calculator": "calculator_agent"},
    "c": {"exact_answer": "lc_equivalence_rule_simple_agent", "json_answer": "structured_outputs_simple_agent",
          "sorting": "string_match_simple_agent", "uppercase": "uppercase_agent", "calculator": "calculator_agent"},
}
SERVER_OF = {"math_with_judge_simple_agent": "math_with_judge", "string_match_simple_agent": "string_match",
             "lc_equivalence_rule_simple_agent": "equivalence_rule",
             "structured_outputs_simple_agent": "structured_outputs",
             "structured_outputs_v3_simple_agent": "structured_outputs"}
CONFIGS = ["resources_servers/math_with_judge/configs/math_with_judge.yaml",
           "resources_servers/string_match/configs/string_match.yaml",
           "resources_servers/equivalence_rule/configs/lc.yaml",
           "resources_servers/structured_outputs/configs/structured_outputs_json.yaml"]


def test_rows_mapped_to_typed_servers_pass_their_verify_requests(gym_python, tmp_path):
    written = []
    for name, agents in MAPPINGS.items():
        stage, rows, ours, _ = _stage_rows(tmp_path, name, agents, CONFIGS)
        gym = {f for f, _ in unsupported(stage, environments=gym_environments(rows), gym_agents=agents)}
        assert not {f for f in gym if f.startswith("environment.")}, gym  # every pair is one the servers verify
        written += ours
    by_agent = {}
    for w in written:
        by_agent.setdefault(w["agent_ref"]["name"], []).append(w)
    assert set(SERVER_OF) <= set(by_agent)

    # what the rows hold for each server (GYM_SERVERS): the answer as text, math's question, the JSON schema
    for w in by_agent["math_with_judge_simple_agent"]:
        assert w["environment"] == "exact_answer" and isinstance(w["expected_answer"], str)
        assert w["expected_answer"].lstrip("-").isdigit()  # "42", "-20": the text math-verify parses
        assert w["question"] == w["responses_create_params"]["input"][-1]["content"]
    sorted_rows = [w for w in by_agent["string_match_simple_agent"] if w["environment"] == "sorting"]
    assert sorted_rows and all(w["extraction_mode"] == "full_response" for w in by_agent["string_match_simple_agent"])
    assert all(", " in w["expected_answer"] for w in sorted_rows)
    for w in by_agent["structured_outputs_simple_agent"]:
        assert json.loads(w["schema_str"])["properties"]["answer"] == {"const": w["expected_answer"]}
    assert all(isinstance(w["expected_answer"], int) for w in by_agent["calculator_agent"])  # no server: kept

    # the must-fail probes: the world's rows as they reached NeMo Gym before gym_row wrote the servers' fields
    _, _, rows = _world(tmp_path / "probes")
    raw = {r.environment: r.row.as_json() for r in rows}
    ref = lambda agent: {"agent_ref": {"type": AGENT_TYPE, "name": agent}}  # noqa: E731
    math = by_agent["math_with_judge_simple_agent"][0]
    probes = [
        {**math, "expected_answer": int(math["expected_answer"])},  # an int answer, question given
        {**raw["exact_answer"], **ref("math_with_judge_simple_agent")},  # int answer, no question
        {**raw["sorting"], **ref("string_match_simple_agent")},  # a list answer
        {**raw["exact_answer"], **ref("lc_equivalence_rule_simple_agent")},  # an int answer
        {**raw["json_answer"], **ref("structured_outputs_simple_agent")},  # no schema_str
    ]
    checked = tmp_path / "checked.jsonl"
    checked.write_text("".join(json.dumps(w) + "\n" for w in written + probes), encoding="utf-8")
    args = [a for agent, server in SERVER_OF.items() for a in ("--verify-model-for", f"{agent}={MODELS[server]}")]
    got = _check(gym_python, checked, *args)
    assert got["versions"]["nemo-gym"] == "0.7.0" and got["versions"]["math-verify"] == "0.8.0"
    ours, probed = got["results"][:len(written)], got["results"][len(written):]
    bad = [(r["id"], r["agent"], r["errors"]) for r in ours if not all(r["ok"].values())]
    assert not bad, bad[:3]
    for r in ours:  # each row met its agent's server's verify request (and only that one)
        server = SERVER_OF.get(r["agent"])
        assert set(r["ok"]) - {"row", "run", "verify"} == ({MODELS[server].rsplit(":")[1]} if server else set())
    lines = written + probes
    per_class = {}
    for w in lines:
        if w["agent_ref"]["name"] in SERVER_OF:
            cls = MODELS[SERVER_OF[w["agent_ref"]["name"]]].rsplit(":")[1]
            per_class[cls] = per_class.get(cls, 0) + 1
    assert got["checked"] == {"row": len(lines), "run": len(lines), "verify": len(lines), **per_class}

    def refused(probe, model):
        cls = MODELS[model].rsplit(":")[1]
        assert probe["ok"]["row"] and probe["ok"]["verify"], probe  # NeMo Gym's row model takes the row ...
        assert not probe["ok"][cls], probe  # ... its server's verify request does not
        return {(e["loc"], e["msg"]) for e in probe["errors"][cls]}

    int_answer, no_question, list_answer, eq_int, no_schema = probed
    assert refused(int_answer, "math_with_judge") == {("expected_answer", "Input should be a valid string")}
    assert refused(no_question, "math_with_judge") == {("question", "Field required"),
                                                       ("expected_answer", "Input should be a valid string")}
    assert refused(list_answer, "string_match") == {("expected_answer", "Input should be a valid string")}
    assert refused(eq_int, "equivalence_rule") == {("expected_answer", "Input should be a valid string")}
    assert refused(no_schema, "structured_outputs") == {("schema_str", "Field required")}
