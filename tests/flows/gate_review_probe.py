"""A flow that asks a person at a gate and prints the review: run by the gate review tests as a
separate process against their `prefect server` (PREFECT_API_URL in its environment)."""

from __future__ import annotations

import json
import sys

from prefect import flow

from stagewise.flows.gate_review import ask_person

DECISION = {"action": "stop", "reason": "budget exhausted at 4096 tokens, rule not held", "step": 8, "tokens_seen": 4096,
            "held": False, "undecided": True,
            "evidence": {"conditions": [{"metric": "eval/sft_dev/exact_match", "group": "all", "current": 0.25,
                                         "op": ">=", "threshold": 0.9, "holds": False}], "guards": []}}


@flow(name="gate-review-probe")
def probe(timeout_s: float) -> dict:
    return ask_person("sft/stage1", DECISION, run_url="http://127.0.0.1:5000/#/experiments/1/runs/r", budget=4096,
                      timeout_s=timeout_s, extend_tokens=512, poll_s=1)


if __name__ == "__main__":
    print("REVIEW " + json.dumps(probe(float(sys.argv[1]))), flush=True)
