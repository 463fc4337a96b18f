"""A stand-in Megatron-Bridge for CPU tests of the launched path (the real one needs CUDA, Transformer
Engine and mamba-ssm): a venv directory and a "checkout" whose scripts take the real entry points'
arguments and do the smallest true thing with them.

- scripts/training/run_recipe.py: every rank starts (torchrun sets RANK); rank 0 checks the blend's
  indexed datasets exist, logs two metrics into the MLflow run named by MLFLOW_RUN_ID (the stage's),
  prints iteration lines, records its arguments in `<checkpoint.save>/launches.jsonl` and writes
  `<checkpoint.save>/iter_<train_iters>/`. FAKE_MEGATRON_FAIL=1 makes it exit 3 after a line.
- scripts/conversion/run_conversion.py export: builds the model of the template's config.json
  (seeded) and saves it as safetensors in --hf-path, with the template's tokenizer files.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

RUN_RECIPE = '''
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
opts = {k: json.loads(v) if v.startswith('"') else v  # Hydra strings are JSON-quoted
        for k, v in (a.split("=", 1) for a in args if "=" in a and not a.startswith("--"))}
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
import mlflow
with mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"]):
    mlflow.log_metrics({"megatron/lm_loss": 9.5, "megatron/iteration": iters}, step=iters)
for i in (1, iters):
    print(f" [iteration {i:>5}/{iters:>5}] lm loss: 9.5", flush=True)
save.mkdir(parents=True, exist_ok=True)
with (save / "launches.jsonl").open("a") as f:
    f.write(json.dumps({"argv": args, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}) + "\\n")
(save / f"iter_{iters:07d}").mkdir(exist_ok=True)
'''

RUN_CONVERSION = '''
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
def arg(name):
    return args[args.index(name) + 1]
if args[0] == "import":
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
    venv, checkout, site = root / "venv", root / "Megatron-Bridge", root / "site"
    (site / "megatron" / "bridge").mkdir(parents=True)
    (site / "megatron" / "__init__.py").write_text("")
    (site / "megatron" / "bridge" / "__init__.py").write_text("")
    (venv / "bin").mkdir(parents=True)
    real = Path(sys.executable)
    for name, target in (("python", f'"{real}"'), ("torchrun", f'"{real}" -m torch.distributed.run')):
        tool = venv / "bin" / name
        tool.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            export PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"
            exec {target} "$@"
            """))
        tool.chmod(0o755)
    for rel, text in (("scripts/training/run_recipe.py", RUN_RECIPE),
                      ("scripts/conversion/run_conversion.py", RUN_CONVERSION)):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(text)
    return venv, checkout


if __name__ == "__main__":
    print(*make_fake_megatron(Path(sys.argv[1])))
    os.sys.exit(0)
