"""End to end: an RL stage whose rollouts are sampled by a real vLLM server (vLLM's CPU build), the
trainer's weights reloaded into it every rollout step, one-step off-policy (vLLM samples the next
batch while the trainer trains).

`stagewise run recipes/finetune.yaml --stages rl` from the session's tiny-dense checkpoint (our
template) on eight verifiable rows (rewarded for their format too: see `row`), `backend: vllm` at the session's server (tests/conftest.py
`vllm_server`), so the test can ask that server afterwards: its greedy answers on 32 prompts equal
the handed-on checkpoint's own (transformers' generate; a tie within 1e-4 excepted, see
tests/vllm_checks.py), i.e. the last weights it received are the checkpoint's. MLflow holds the
sampler/trainer mismatch every step: ~2e-7 per token at step 1 (fp32 on both sides, same weights),
~0.02-0.06 after (each batch sampled one optimizer step before it trains: off-policy's lag).
A second, shorter run leaves `vllm_url` unset: the stage starts its own server inside the flow run
(its log beside the stage's files) and leaves no vLLM process behind when it ends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm_checks import greedy_agrees, prompts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def row(i: int) -> dict:
    """A sum answered in a word: exact_answer's format reward (one non-empty line) then varies within a
    group even for the untrained start, so GRPO has a signal and the weights move."""
    a, b = i % 5, (2 * i + 1) % 5
    return {"id": f"r{i}", "responses_create_params": {"input": [{"role": "user", "content": f"{a} + {b} in words?"}]},
            "expected_answer": WORDS[a + b], "environment": "exact_answer", "domain": "sums"}


def rl_run(cli, start: Path, tmp_path: Path, steps: int, *extra: str) -> dict:
    """`stagewise run finetune --stages rl` from `start` on the rows above, sampling through vLLM; its summary."""
    rows, heldout = tmp_path / "rl.jsonl", tmp_path / "heldout.jsonl"
    rows.write_text("".join(json.dumps(row(i)) + "\n" for i in range(8)))
    heldout.write_text("".join(json.dumps(row(i)) + "\n" for i in range(20, 24)))
    values = [f"workdir={tmp_path / 'work'}", f"model.from={start}",
              f"stages.rl.data.sources[0].path={rows}", f"stages.rl.data.heldout={heldout}",
              "stages.rl.rewards.format=1.0", "stages.rl.backend=vllm", *extra,
              "data.world.stdlib_files=2", "data.world.facts=200", "data.world.arithmetic=200",
              f"stages.rl.steps={steps}", "stages.rl.prompts_per_step=4", "stages.rl.rollout.group_size=4",
              "stages.rl.rollout.max_new_tokens=8", "stages.rl.filter.samples=2", "stages.rl.data.heldout_samples=2"]
    return cli.summary(cli("run", str(ROOT / "recipes" / "finetune.yaml"), "--stages", "rl", *cli.sets(*values),
                           "--json", timeout=900))


def vllm_processes() -> list[str]:
    import subprocess

    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if "vllm.entrypoints.openai.api_server" in line]


def test_a_stage_without_vllm_url_starts_its_own_server_and_leaves_none(cli, vllm_python, dense_chat_checkpoint,
                                                                        vllm_server, tmp_path):
    before = vllm_processes()  # the session's server
    summary = rl_run(cli, dense_chat_checkpoint, tmp_path, 2)
    (rl,) = summary["stages"]
    stage_dir = Path(rl["stage_dir"])
    assert "Starting vLLM server" in (stage_dir / "vllm.log").read_text()
    assert not (stage_dir / "vllm-weights").exists()
    assert vllm_processes() == before, vllm_processes()


def test_rl_samples_through_vllm_and_leaves_it_holding_the_checkpoints_weights(cli, vllm_server, dense_chat_checkpoint,
                                                                              tmp_path):
    from mlflow import MlflowClient
    from transformers import AutoTokenizer

    from stagewise.eval.heldout import end_ids
    from stagewise.model.build import load_model
    from stagewise.model.rollout.hf import HFGenerator
    from stagewise.model.rollout.vllm import VLLMGenerator

    summary = rl_run(cli, dense_chat_checkpoint, tmp_path, STEPS, f"stages.rl.vllm_url={vllm_server.url}")
    (rl,) = summary["stages"]
    assert rl["stage"] == "rl" and rl["parent"] == str(dense_chat_checkpoint)

    ckpt = Path(rl["checkpoint"])
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    trained = load_model(ckpt, device="cpu").eval()
    start = load_model(dense_chat_checkpoint, device="cpu")
    assert any(not a.equal(b) for a, b in zip(trained.parameters(), start.parameters()))  # RL moved the weights
    batch, ends = prompts(tokenizer), end_ids(tokenizer)
    served = VLLMGenerator(trained, ends, 0, url=vllm_server.url, keep_copy=False)  # asks; never syncs here
    got = served.generate(batch, 1, 12, 0.0, 0)
    served.close()
    want = HFGenerator(trained, ends, 0).generate(batch, 1, 12, 0.0, 0)
    agree = [greedy_agrees(trained, p, g[0].response_ids, w[0].response_ids) for p, g, w in zip(batch, got, want)]
    assert all(agree), [i for i, a in enumerate(agree) if not a]

    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    mismatch = client.get_metric_history(rl["run_id"], "rl/logprob_mismatch")
    assert sorted(m.step for m in mismatch) == list(range(1, STEPS + 1)), [m.step for m in mismatch]
    values = [m.value for m in sorted(mismatch, key=lambda m: m.step)]
    # step 1 samples with the weights it trains (same weights, fp32 both): only the kernels differ; later
    # batches were sampled one optimizer step earlier (off_policy, no recomputed π_old): that step shows
    assert values[0] < 1e-4 and all(v > 10 * values[0] for v in values[1:]), values
    masked = client.get_metric_history(rl["run_id"], "rl/is_masked_fraction")
    assert len(masked) == STEPS and min(masked, key=lambda m: m.step).value == 0  # beside it; nothing masked at step 1
    left = {p.name for p in Path(rl["stage_dir"]).iterdir()}
    assert "vllm.log" not in left and "vllm-weights" not in left, left  # no server of its own; no weights copy kept
