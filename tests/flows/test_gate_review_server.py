"""A gate's pause against a real `prefect server`: nobody answers (the gate's own decision stands and the
run goes on to Completed), and an answer sent through Prefect's API (as a script of a team would)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import paused_run, prefect_server

PROBE = Path(__file__).with_name("gate_review_probe.py")


def review_of(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith("REVIEW "))[len("REVIEW "):])


def states(api: str, run_id: str) -> list[str]:
    return [s["type"] for s in httpx.get(f"{api}/flow_run_states/", params={"flow_run_id": run_id}).json()]


def saved_description(api: str, run_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inputs = httpx.post(f"{api}/flow_runs/{run_id}/input/filter", json={"prefix": "paused", "limit": 10}).json()
        found = [i["value"] for i in inputs if i["key"].endswith("-description")]
        if found:
            return json.loads(found[0])
        time.sleep(0.5)
    raise AssertionError("the paused run has no form description")


@pytest.mark.slow
def test_no_answer_in_time_leaves_the_gates_decision_and_the_run_goes_on(tmp_path):
    with prefect_server(tmp_path) as (api, env):
        out = subprocess.run([sys.executable, str(PROBE), "4"], env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        review = review_of(out.stdout)
        assert (review["decision"], review["by"], review["proposed"]) == ("timeout", "timeout", "stop")
        (run,) = httpx.post(f"{api}/flow_runs/filter", json={}).json()
        assert run["state"]["type"] == "COMPLETED"  # Prefect alone would have failed the expired pause
        assert states(api, run["id"])[-4:] == ["RUNNING", "PAUSED", "RUNNING", "COMPLETED"]


@pytest.mark.slow
def test_an_answer_through_the_api_is_validated_cleaned_and_returned(tmp_path):
    with prefect_server(tmp_path) as (api, env):
        proc = subprocess.Popen([sys.executable, str(PROBE), "300"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            run = paused_run(api, proc)
            text = saved_description(api, run["id"])  # the form is saved just after the pause
            assert "The gate of `sft/stage1` asks a person" in text and "| `eval/sft_dev/exact_match` (all) |" in text
            script = ("import asyncio, sys\nfrom prefect.client.orchestration import get_client\n"
                      "async def main():\n    async with get_client() as c:\n"
                      "        r = await c.resume_flow_run(sys.argv[1], run_input={'decision': 'extend', "
                      "'extend_tokens': 0, 'reviewer': 'ci\\x00 bot\\n', 'comment': 'one more chunk'})\n"
                      "        assert r.status.value == 'ACCEPT', r\nasyncio.run(main())\n")
            sent = subprocess.run([sys.executable, "-c", script, run["id"]], env=env, capture_output=True, text=True,
                                  timeout=120)
            assert sent.returncode == 0, sent.stderr[-3000:]
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 0, out[-3000:]
        review = review_of(out)
        assert review["decision"] == "extend" and review["extend_tokens"] == 512  # 0: the gate's eval_every_tokens
        assert (review["by"], review["comment"]) == ("ci bot", "one more chunk")
