"""CPU harness for the released Megatron-Bridge: test code only, run in the side environment.

Megatron-Bridge and megatron-core are written for CUDA machines with Transformer Engine and
mamba-ssm's CUDA kernels. These tests run them on a CPU CI machine, so this module stands in for
the few places that need a GPU, and nothing else: on a GPU machine none of it is needed, and
nothing in stagewise imports it (it runs only under the side environment's interpreter,
`.venv-megatron/bin/python`, built by `python3 dev.py megatron-env`). What it replaces, and why:

- Transformer Engine (CUDA-only) is imported unconditionally by `megatron.bridge.peft.lora_layers`,
  which `from megatron.bridge import AutoBridge` reaches. A placeholder module is visible in
  `sys.modules` while that one module body runs, and at no other time (its other imports are done
  first, Hugging Face `peft` before everything), so every other probe for Transformer Engine in
  megatron-core, Megatron-Bridge and peft still finds it absent and takes its non-TE path.
- `mamba_ssm/__init__` imports the CUDA extension `selective_scan_cuda`; megatron-core only uses
  mamba-ssm's Triton/PyTorch modules, so an empty placeholder extension lets the package import.
- The default NemotronH layer spec is Transformer-Engine-only: `cpu_hybrid_stack_spec` is
  megatron-core's local (ModelOpt) hybrid spec with torch norms and local core attention, and
  `HybridStack.final_norm`, which names `TENorm` directly, gets the torch norm too.
- `MambaMixer` asks for `torch.cuda.current_device()` and forks the CUDA RNG tracker while it
  builds its parameters; saving a checkpoint reads `torch.cuda.get_rng_state()` and the
  distributed-checkpoint writer calls `torch.cuda.synchronize()`: on CPU those become the CPU
  device, a plain context, the CPU RNG state and a no-op.
- `cpu_provider` switches the provider's fused kernels off (settings, not patches): no fusions,
  no grouped GEMM, no shared-expert overlap, the all-gather token dispatcher.

`typing.override` (Python 3.12; both Megatron packages declare Python >= 3.12 but run on 3.11) is
provided by a `.pth` file `python3 dev.py megatron-env` writes into the side environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

_installed = False


class _Placeholder(types.ModuleType):
    """A module whose every attribute is a fresh placeholder class (never an instance of anything real)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


def _placeholder_te() -> dict[str, types.ModuleType]:
    """`transformer_engine` and `transformer_engine.pytorch` (with `.ops`) as placeholders."""
    te = _Placeholder("transformer_engine")
    te.__path__ = []
    te_torch = _Placeholder("transformer_engine.pytorch")
    te_torch.ops = _Placeholder("transformer_engine.pytorch.ops")
    te_torch.fp8_autocast = lambda *a, **k: contextlib.nullcontext()
    te.pytorch = te_torch
    return {"transformer_engine": te, "transformer_engine.pytorch": te_torch,
            "transformer_engine.pytorch.ops": te_torch.ops}


_LORA_LAYERS = "megatron.bridge.peft.lora_layers"
# What lora_layers imports besides Transformer Engine: imported before the placeholder is visible.
_LORA_LAYERS_DEPS = ("megatron.core.transformer.moe.moe_utils", "megatron.bridge.peft.adapter_wrapper",
                     "megatron.bridge.peft.lora_merge")


class _WithPlaceholderTE(importlib.abc.Loader):
    """Runs lora_layers' module body with the placeholder Transformer Engine in `sys.modules`, and only
    that body: its other imports are done first, and the placeholder is gone when the body returns, so
    every other TE probe (megatron-core's, Megatron-Bridge's, peft's) still finds TE absent."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        for dep in _LORA_LAYERS_DEPS:
            importlib.import_module(dep)
        stubs = _placeholder_te()
        if any(name in sys.modules for name in stubs):
            raise RuntimeError("transformer_engine is importable: this harness is for a CPU side environment only")
        before = set(sys.modules)
        sys.modules.update(stubs)
        try:
            self.inner.exec_module(module)
        finally:
            for name in stubs:
                sys.modules.pop(name, None)
        extra = set(sys.modules) - before - {module.__name__}
        if extra:
            raise RuntimeError(f"{_LORA_LAYERS} imported {sorted(extra)} while the TE placeholder was visible; "
                               "add them to harness._LORA_LAYERS_DEPS")


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _LORA_LAYERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _WithPlaceholderTE(spec.loader)
        return spec


def _bridge_lora_layers_without_te() -> None:
    importlib.import_module("peft")  # Hugging Face peft probes for TE too: import it while TE is absent
    if _LORA_LAYERS not in sys.modules:
        sys.meta_path.insert(0, _LoraLayersFinder())


def _placeholder_selective_scan_cuda() -> None:
    if "selective_scan_cuda" not in sys.modules:
        sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")


def _cuda_calls_on_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("this harness stands in for CUDA on a CPU machine; a GPU is present, run without it")
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.synchronize = lambda device=None: None

    from megatron.core.tensor_parallel import random as tp_random

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        yield  # CPU initialization draws from the CPU generator; there is no CUDA stream to fork

    tp_random.CudaRNGStatesTracker.fork = fork


def _torch_final_norm() -> None:
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    hybrid_block.TENorm = WrappedTorchNorm


def install() -> None:
    """Apply every CPU stand-in above (idempotent); call before importing megatron.bridge."""
    global _installed
    if _installed:
        return
    _placeholder_selective_scan_cuda()
    _cuda_calls_on_cpu()
    _bridge_lora_layers_without_te()
    _torch_final_norm()
    _installed = True


def _swap(value, old, new, seen: set[int]):
    """`value` with every reference to `old` replaced by `new`, through ModuleSpecs and dataclasses."""
    if value is old:
        return new
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and id(value) not in seen:
        seen.add(id(value))
        for f in dataclasses.fields(value):
            setattr(value, f.name, _swap(getattr(value, f.name), old, new, seen))
        return value
    if isinstance(value, list):
        return [_swap(v, old, new, seen) for v in value]
    return value


def cpu_hybrid_stack_spec(config=None):
    """megatron-core's local hybrid stack spec (ModelOpt's, no Transformer Engine layers), with torch
    norms in place of its TE norms and local core attention: the NemotronH layers on CPU. Parameter
    names match the bridge's mappings for separate norms (`decoder.layers.*.norm.weight`, ...)."""
    from megatron.core.post_training.modelopt.hybrid import model_specs
    from megatron.core.post_training.modelopt.layers import Norm
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    spec = model_specs.get_hybrid_stack_modelopt_spec(local_core_attention=True, remap_te_layernorm=False)
    return _swap(spec, Norm, WrappedTorchNorm, set())


def cpu_provider(provider, dtype=None):
    """The bridge's provider set up to build on CPU: the CPU spec, fused kernels off, one rank."""
    import torch

    provider.hybrid_stack_spec = cpu_hybrid_stack_spec
    for name in ("masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion", "persist_layer_norm",
                 "apply_rope_fusion", "gradient_accumulation_fusion", "cross_entropy_loss_fusion",
                 "moe_permute_fusion", "moe_router_fusion", "moe_grouped_gemm", "moe_shared_expert_overlap",
                 "memory_efficient_layer_norm", "sequence_parallel"):
        if hasattr(provider, name):
            setattr(provider, name, False)
    provider.moe_token_dispatcher_type = "allgather"
    provider.tensor_model_parallel_size = provider.pipeline_model_parallel_size = 1
    provider.expert_model_parallel_size = provider.context_parallel_size = 1
    if dtype is not None:
        provider.params_dtype = dtype
        provider.bf16, provider.fp16 = dtype == torch.bfloat16, dtype == torch.float16
        provider.pipeline_dtype = dtype
    return provider
