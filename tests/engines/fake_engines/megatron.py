"""A stand-in Megatron-Bridge for CPU tests of the launched path (the real one needs CUDA, Transformer
Engine and mamba-ssm): a venv directory and a "checkout" whose scripts take the real entry points'
arguments and do the smallest true thing with them.

- scripts/training/run_recipe.py: refuses a trailing argument that is not KEY=VALUE (as upstream's
  `_collect_overrides` does); every rank starts (torchrun sets RANK); rank 0 checks the blend's
  indexed datasets exist, that `checkpoint.pretrained_checkpoint` was imported, and for a
  `dataset.dataset_root` that the chat preprocessing is selected and that every row of its
  training.jsonl renders with the run's tokenizer's chat template from its messages and tools
  alone, as the release renders it (counting the supervised tokens); logs two metrics into the MLflow run
  named by MLFLOW_RUN_ID (the stage's), prints iteration lines, records its arguments (and rows)
  in `<checkpoint.save>/launches.jsonl` and writes `<checkpoint.save>/iter_<train_iters>/`.
  FAKE_MEGATRON_FAIL=1 makes it exit 3 after a line.
- scripts/conversion/run_conversion.py import: checks --hf-model is an HF directory and writes
  `<--megatron-path>/iter_0000000/`; export: builds the model of the template's config.json
  (seeded) and saves it as safetensors in --hf-path, with the template's tokenizer files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.engines.fake_engines import common
from tests.engines.fake_engines.common import PYTHON, fake_venv, write_checkout

RUN_RECIPE = '''
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
rest = [a for i, a in enumerate(args) if a not in ("--recipe", "--mode", "--dataset")
        and (i == 0 or args[i - 1] not in ("--recipe", "--mode", "--dataset"))]
for a in rest:
    if a.startswith("-") or "=" not in a:
        print(f"run_recipe.py: error: Expected override in KEY=VALUE form, got {a!r}", file=sys.stderr, flush=True)
        sys.exit(2)
opts = {k: json.loads(v) if v.startswith('"') else v  # our paths: double-quoted, no escapes (engines/hydra_overrides.py)
        for k, v in (a.split("=", 1) for a in rest)}
rank = int(os.environ.get("RANK", "0"))
print(f"rank {rank}: recipe {args[args.index('--recipe') + 1]} mode {args[args.index('--mode') + 1]}", flush=True)
if rank != 0:
    sys.exit(0)
if os.environ.get("FAKE_MEGATRON_FAIL"):
    print("RuntimeError: CUDA error: out of memory", file=sys.stderr, flush=True)
    sys.exit(3)
iters = int(opts["train.train_iters"])
save = Path(opts["checkpoint.save"])
blend = opts.get("dataset.blend")
if blend:
    import re
    for p in re.findall(r'/[^,\\[\\]" ]+', blend):
        assert Path(p + ".bin").is_file() and Path(p + ".idx").is_file(), p
pre = opts.get("checkpoint.pretrained_checkpoint")
assert pre is None or Path(pre).is_dir(), f"not imported: {pre}"
rows = supervised = None
if "dataset.dataset_root" in opts:
    assert opts["dataset.preprocessing"] == "null", opts.get("dataset.preprocessing")
    assert "ChatSFTPreprocessingConfig" in opts["+dataset.preprocessing"], opts.get("+dataset.preprocessing")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(opts["tokenizer.tokenizer_model"])
    lines = Path(opts["dataset.dataset_root"], "training.jsonl").read_text().splitlines()
    rows, supervised = len(lines), 0
    for line in lines:
        row = json.loads(line)
        out = tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)  # as 0.6.2: messages and tools only
        supervised += sum(out["assistant_masks"])
    print(f"dataset: {rows} conversations, {supervised} supervised tokens", flush=True)
import mlflow
with mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"]):
    mlflow.log_metrics({"megatron/lm_loss": 9.5, "megatron/iteration": iters}, step=iters)
for i in (1, iters):
    print(f" [iteration {i:>5}/{iters:>5}] lm loss: 9.5", flush=True)
save.mkdir(parents=True, exist_ok=True)
with (save / "launches.jsonl").open("a") as f:
    f.write(json.dumps({"argv": args, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "rows": rows,
                        "supervised": supervised}) + "\\n")
(save / f"iter_{iters:07d}").mkdir(exist_ok=True)
'''

RUN_CONVERSION = '''
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
def arg(name):
    return args[args.index(name) + 1]
if args[0] == "import":
    assert Path(arg("--hf-model"), "config.json").is_file(), arg("--hf-model")
    Path(arg("--megatron-path"), "iter_0000000").mkdir(parents=True, exist_ok=True)
    print("imported", arg("--hf-model"), flush=True)
    sys.exit(0)
assert args[0] == "export", args
assert Path(arg("--megatron-path")).is_dir(), arg("--megatron-path")
import torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
template, out = Path(arg("--hf-model")), Path(arg("--hf-path"))
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(template))
model.save_pretrained(out)
for f in template.iterdir():
    if f.is_file() and not (out / f.name).exists():
        shutil.copy2(f, out / f.name)
print("exported to", out, flush=True)
'''


def make_fake_megatron(root: Path) -> tuple[Path, Path]:
    """(venv, checkout): a venv whose python imports a `megatron.bridge` and has torchrun, and a
    Megatron-Bridge checkout with the two entry scripts."""
    venv = fake_venv(root, ["megatron.bridge"], {"python": PYTHON, "torchrun": f"{PYTHON} -m torch.distributed.run"})
    checkout = write_checkout(root / "Megatron-Bridge", {"scripts/training/run_recipe.py": RUN_RECIPE,
                                                         "scripts/conversion/run_conversion.py": RUN_CONVERSION})
    return venv, checkout


def run_stagewise(recipe: Path, stages: str, launched: list[str], fake: tuple[Path, Path], sets: list[str],
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """`stagewise run` with each of `launched` on `engine: megatron`, on the stand-in (common.run_stagewise)."""
    return common.run_stagewise(recipe, stages, launched, "megatron", fake, sets, env)


if __name__ == "__main__":
    print(*make_fake_megatron(Path(sys.argv[1])))
