"""Our NeMo RL rows through the released NeMo Gym's own row models, on CPU: test code only.

Run by tests/engines/nemo_rl/test_real_gym_rows.py with the gym side environment's interpreter
(`python3 dev.py gym-env` builds .venv-gym with nemo-gym 0.7.0):

    .venv-gym/bin/python check_rows.py ROWS.jsonl [--verify-model MODULE:CLASS ...]

Each non-blank line of ROWS.jsonl is one row as NeMo RL hands it to NeMo Gym (NeMo RL's
NemoGymDataset reads the file and NeMo Gym's rollout collection posts each row to the agent its
`agent_ref` names). Every row goes through the models a row meets there, all imported from the
installed release, none restated here:

    row      nemo_gym.base_resources_server.BaseRunRequest: the row model every agent's and
             resources server's request extends (`responses_create_params` as
             NeMoGymResponseCreateParamsNonStreaming, extra="forbid" inside it); ng_prepare_data
             (train_data_utils.compute_sample_metrics) counts a row it rejects as offending
    run      responses_api_agents.simple_agent.app.SimpleAgentRunRequest: the body of the simple
             agent's /run, which is the row itself
    verify   SimpleAgentVerifyRequest of `run.model_dump() | {"response": ...}`: what that agent
             posts to its resources server's /verify (simple_agent/app.py run), here with a fixed
             one-message NeMoGymResponse standing in for the policy's answer

`--verify-model MODULE:CLASS` adds a resources server's own verify request, built the same way
(e.g. resources_servers.string_match.app:StringMatchVerifyRequest), reported under its class name;
`--verify-model-for AGENT=MODULE:CLASS` the same for the rows whose `agent_ref.name` is AGENT only
(each row against the verify request of the server its agent posts to).

Prints one JSON object: {"versions": {...}, "rows": N, "ok": {check: rows passed}, "checked": {check:
rows checked}, "results": [{"line": n, "id": ..., "agent": name, "ok": {check: bool}, "errors": {check:
[{"loc": "a.b", "msg": ...}]}}]}. Exit 0 whatever the rows hold (the caller reads the verdicts); 2 for a
line that is not a JSON object or an unknown argument.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import sys

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.openai_utils import NeMoGymResponse
from pydantic import ValidationError
from responses_api_agents.simple_agent.app import SimpleAgentRunRequest, SimpleAgentVerifyRequest

RESPONSE = {  # the policy's answer stands in as one completed assistant message
    "id": "resp-check", "created_at": 0, "model": "policy", "object": "response",
    "output": [{"id": "msg-check", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "42", "annotations": []}]}],
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
}


def _errors(e: ValidationError) -> list[dict[str, str]]:
    return [{"loc": ".".join(map(str, err["loc"])), "msg": err["msg"]} for err in e.errors()]


def _check(model, obj) -> tuple[bool, list[dict[str, str]]]:
    try:
        model.model_validate(obj)
    except ValidationError as e:
        return False, _errors(e)
    return True, []


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def check_row(obj: dict, extra_verify: list) -> tuple[dict[str, bool], dict[str, list]]:
    ok, errors = {}, {}
    ok["row"], errors["row"] = _check(BaseRunRequest, obj)
    ok["run"], errors["run"] = _check(SimpleAgentRunRequest, obj)
    if ok["run"]:  # the agent's verify body is built from its validated run request
        body = SimpleAgentRunRequest.model_validate(obj).model_dump(mode="json") | {
            "response": NeMoGymResponse.model_validate(RESPONSE).model_dump(mode="json")}
        ok["verify"], errors["verify"] = _check(SimpleAgentVerifyRequest, body)
        for model in extra_verify:
            ok[model.__name__], errors[model.__name__] = _check(model, body)
    else:
        for name in ["verify", *(m.__name__ for m in extra_verify)]:
            ok[name], errors[name] = False, [{"loc": "", "msg": "the run request was rejected"}]
    return ok, {k: v for k, v in errors.items() if v}


def _agent(obj: dict) -> str | None:
    ref = obj.get("agent_ref")
    return ref.get("name") if isinstance(ref, dict) else None


def main(argv: list[str]) -> int:
    path, extra, per_agent = argv[0], [], {}
    rest = argv[1:]
    while rest:
        flag, value, *rest = rest
        if flag == "--verify-model":
            extra.append(_load(value))
        elif flag == "--verify-model-for" and "=" in value:
            agent, _, spec = value.partition("=")
            per_agent.setdefault(agent, []).append(_load(spec))
        else:
            print(f"unknown argument {flag!r} {value!r}", file=sys.stderr)
            return 2
    results = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj, dict):
                print(f"{path}:{n}: not a JSON object", file=sys.stderr)
                return 2
            agent = _agent(obj)
            ok, errors = check_row(obj, extra + per_agent.get(agent, []))
            results.append({"line": n, "id": obj.get("id"), "agent": agent, "ok": ok, "errors": errors})
    checks = list(dict.fromkeys(c for r in results for c in r["ok"]))
    print(json.dumps({
        "versions": {d: md.version(d) for d in ("nemo-gym", "openai", "pydantic", "math-verify")},
        "rows": len(results),
        "ok": {c: sum(r["ok"].get(c, False) for r in results) for c in checks},
        "checked": {c: sum(c in r["ok"] for r in results) for c in checks},
        "results": results,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
