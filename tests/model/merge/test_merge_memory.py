"""Peak memory of the streaming merge: 8 checkpoints merged with a peak below 3x one checkpoint.

Measured as the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) in a fresh
subprocess, so pytest's own heap does not blur it. safetensors 0.8 reads tensors without
keeping the file pages mapped, so RSS counts only what the merge holds. The same
subprocess loads all 8 checkpoints at once as a control: that must exceed the bound, or the
measurement could not tell a streaming merge from a naive one.
"""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from stagewise.model.checkpoint import CheckpointMeta, weights_sha256

_SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from stagewise.model.merge import merge_checkpoints, merge_coefficients

def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def peak_of(fn):
    base = rss("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    fn()
    return rss("VmHWM") - base

ins = sorted(Path(sys.argv[1]).glob("c[0-9]"))
merge_checkpoints(ins[:2], [0.5, 0.5], Path(sys.argv[1]) / "warmup", "uniform")  # first-call allocations
def naive():
    states = [load_file(p / "model.safetensors") for p in ins]
    return {k: sum(s[k] for s in states) / len(states) for k in states[0]}
stream = peak_of(lambda: merge_checkpoints(ins, merge_coefficients(len(ins)), Path(sys.argv[1]) / "out", "minus-sqrt"))
print(json.dumps({"stream": stream, "naive": peak_of(naive)}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc peak-RSS reset")
def test_eight_checkpoint_merge_peaks_below_three_checkpoints(tmp_path):
    g = torch.Generator().manual_seed(0)
    shapes = [(1024, 1024), (1024, 512), (512, 512), (2048, 256), (768, 1024), (4096,)]
    size = sum(torch.Size(s).numel() * 4 for s in shapes)  # ~10 MB of fp32 weights
    for i in range(8):
        (tmp_path / f"c{i}").mkdir()
        (tmp_path / f"c{i}" / "config.json").write_text('{"model_type": "toy"}')
        save_file({f"t{j}": torch.randn(s, generator=g) for j, s in enumerate(shapes)},
                  tmp_path / f"c{i}" / "model.safetensors", metadata={"format": "pt"})
        meta = CheckpointMeta("pretrain", i, 100 * i, "rh", None, weights_sha256(tmp_path / f"c{i}"))
        (tmp_path / f"c{i}" / "stagewise.json").write_text(json.dumps(asdict(meta)))  # as the trainer writes it
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert peaks["naive"] > 3 * size, f"control did not register: {peaks}, checkpoint {size}"
    assert peaks["stream"] < 3 * size, f"streaming merge peaked at {peaks['stream'] / size:.2f}x one checkpoint"
