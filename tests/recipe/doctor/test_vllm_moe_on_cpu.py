"""The doctor's vllm-moe-on-cpu rule: a stage that starts its own vLLM server on this CPU for a model
with expert layers is refused before any work (vLLM's CPU build cannot run NemotronH's relu2 experts)."""

from __future__ import annotations

from pathlib import Path

from stagewise.recipe import load_recipe
from stagewise.recipe.doctor import diagnose, failing

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"
ON_CPU = "runtime.device=cpu"


def findings(tmp_path: Path, *sets: str) -> list:
    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}", *sets])
    return [f for f in diagnose(loaded) if f.rule == "vllm-moe-on-cpu"]


def test_rl_and_distillation_starting_their_own_server_for_an_moe_model_on_cpu_are_errors(tmp_path):
    rl, distill = findings(tmp_path, ON_CPU, "stages.rl.backend=vllm", "stages.distill.backend=vllm")
    assert (rl.field, rl.severity, rl.stage) == ("stages.rl.backend", "error", "rl")
    assert (distill.field, distill.stage) == ("stages.distill.backend", "distill")
    assert "expert (MoE) layers" in rl.message and "vllm_url" in rl.message and "hf-process" in rl.message
    assert rl in failing([rl])  # `stagewise run` refuses it unless --force
    assert rl.where == "--set stages.rl.backend=vllm"  # where the field was set


def test_a_server_of_the_users_a_dense_model_or_the_hf_backend_are_fine(tmp_path):
    assert findings(tmp_path, ON_CPU, "stages.rl.backend=vllm", "stages.rl.vllm_url=http://gpu-box:8000") == []
    dense = "model.overrides.hybrid_override_pattern=M*-M--"  # no expert layer
    assert findings(tmp_path, ON_CPU, "stages.rl.backend=vllm", dense) == []
    assert findings(tmp_path, ON_CPU) == []  # the demo samples with hf
    # a stage that does not run is not advised on
    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}", ON_CPU, "stages.rl.backend=vllm"])
    assert [f for f in diagnose(loaded, stages=["pretrain"]) if f.rule == "vllm-moe-on-cpu"] == []
