"""A stand-in NeMo RL for CPU tests of `engine: nemo_rl` (the real one needs CUDA, Ray, vLLM and
NeMo Gym): a venv whose python finds a `nemo_rl` package, and a "checkout" whose scripts take the
real entry points' arguments and do the smallest true thing with them.

- examples/nemo_gym/run_grpo_nemo_gym.py: `--config FILE` plus Hydra `key=value` overrides (a
  trailing argument that is not one is refused). Checks the keys the translation relies on: the
  base under `defaults:`, shuffling off, NeMo Gym on with config paths, the policy's HF directory,
  the batch geometry (train_global_batch_size dividing a rollout step's rows: that many updates a
  step), and the rows file: NeMo Gym rows, each with an `agent_ref`, as many as the steps (and
  refills) read. Logs one metric per step into the MLflow run the config names (the stage's),
  prints a line per step and writes NeMo RL's checkpoint layout,
  `<checkpoint_dir>/step_<n>/{config.yaml,training_info.json,policy/weights/iter_0000000/,policy/tokenizer/}`,
  and records its config in `<checkpoint_dir>/launches.jsonl`. FAKE_NEMO_RL_FAIL=1: exit 3 after a line.
- examples/converters/convert_megatron_to_hf.py: `--config --megatron-ckpt-path --hf-ckpt-path`
  (the real flags); loads the config's policy.model_name (the start checkpoint), moves every
  weight a little (seeded) and saves it as an HF directory with the config's tokenizer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.engines.fake_engines import common
from tests.engines.fake_engines.common import PYTHON, fake_venv, write_checkout

RUN_GRPO = '''
import argparse, json, os, sys
from pathlib import Path
import yaml
parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
args, overrides = parser.parse_known_args()
for o in overrides:
    if o.startswith("-") or "=" not in o:
        sys.exit(f"run_grpo_nemo_gym.py: not a Hydra override: {o!r}")
cfg = yaml.safe_load(Path(args.config).read_text())
assert cfg["defaults"].endswith("examples/nemo_gym/grpo_nanov3.yaml"), cfg["defaults"]
grpo, policy, data = cfg["grpo"], cfg["policy"], cfg["data"]
assert data["shuffle"] is False and cfg["env"]["should_use_nemo_gym"] is True
assert cfg["env"]["nemo_gym"]["config_paths"], "no NeMo Gym servers"
assert Path(policy["model_name"], "config.json").is_file(), policy["model_name"]
assert policy["megatron_cfg"]["enabled"] and not policy["dtensor_cfg"]["enabled"]
rows_per_step = grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"]
gbs = policy["train_global_batch_size"]
assert rows_per_step % gbs == 0 and gbs % policy["train_micro_batch_size"] == 0, (rows_per_step, gbs)
updates = rows_per_step // gbs
steps = grpo["max_num_steps"]
rows = [json.loads(line) for line in Path(data["train"]["data_path"]).read_text().splitlines()]
reads = steps * (grpo["dynamic_sampling_max_gen_batches"] if grpo["use_dynamic_sampling"] else 1)
assert len(rows) == reads * grpo["num_prompts_per_step"], (len(rows), reads)
assert all(r["agent_ref"]["name"] and r["responses_create_params"]["input"] for r in rows)
print(f"NeMo Gym: {len(rows)} rows, agents {sorted({r['agent_ref']['name'] for r in rows})}", flush=True)
if os.environ.get("FAKE_NEMO_RL_FAIL"):
    print("ray.exceptions.RayTaskError: CUDA error: out of memory", file=sys.stderr, flush=True)
    sys.exit(3)
ml = cfg["logger"]["mlflow"]
assert ml["run_id"] == os.environ["MLFLOW_RUN_ID"], (ml, os.environ["MLFLOW_RUN_ID"])
import mlflow
mlflow.set_tracking_uri(ml["tracking_uri"])
with mlflow.start_run(run_id=ml["run_id"]):
    for step in range(1, steps + 1):
        mlflow.log_metric("nemo_rl/train/reward", 0.25 * step, step=step)
        print(f"Step {step}/{steps}: {updates} optimizer updates of {gbs} samples", flush=True)
root = Path(cfg["checkpointing"]["checkpoint_dir"])
last = root / f"step_{steps}"
(last / "policy" / "weights" / "iter_0000000").mkdir(parents=True, exist_ok=True)
(last / "policy" / "tokenizer").mkdir(parents=True, exist_ok=True)
(last / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
(last / "training_info.json").write_text(json.dumps({"total_steps": steps}))
with (root / "launches.jsonl").open("a") as f:
    f.write(json.dumps({"config": cfg, "overrides": overrides, "rows": len(rows)}) + "\\n")
print(f"Saved checkpoint {last}", flush=True)
'''

CONVERT_MEGATRON = '''
import argparse, shutil
from pathlib import Path
import torch, yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.add_argument("--megatron-ckpt-path", required=True)
parser.add_argument("--hf-ckpt-path", required=True)
args = parser.parse_args()
weights = Path(args.megatron_ckpt_path)
assert weights.is_dir() and weights.name == "iter_0000000" and weights.parent.name == "weights", weights
policy = yaml.safe_load(Path(args.config).read_text())["policy"]
model = AutoModelForCausalLM.from_pretrained(policy["model_name"])
torch.manual_seed(0)
with torch.no_grad():
    for p in model.parameters():
        p.add_(1e-3 * torch.randn_like(p))
model.save_pretrained(args.hf_ckpt_path)
AutoTokenizer.from_pretrained(policy["tokenizer"]["name"]).save_pretrained(args.hf_ckpt_path)
print("Saved HF checkpoint to:", args.hf_ckpt_path, flush=True)
'''


def make_fake_nemo_rl(root: Path) -> tuple[Path, Path]:
    """(venv, checkout): a venv whose python imports `nemo_rl`, and a NeMo RL checkout with the
    NeMo Gym GRPO entry and the Megatron converter."""
    venv = fake_venv(root, ["nemo_rl"], {"python": PYTHON})
    checkout = write_checkout(root / "RL", {"examples/nemo_gym/run_grpo_nemo_gym.py": RUN_GRPO,
                                            "examples/converters/convert_megatron_to_hf.py": CONVERT_MEGATRON})
    return venv, checkout


def run_stagewise(recipe: Path, stages: str, launched: list[str], fake: tuple[Path, Path], sets: list[str],
                  env: dict | None = None):
    """`stagewise run` with each of `launched` on `engine: nemo_rl`, on the stand-in (common.run_stagewise)."""
    return common.run_stagewise(recipe, stages, launched, "nemo_rl", fake, sets, env)


if __name__ == "__main__":
    print(*make_fake_nemo_rl(Path(sys.argv[1])))
