"""HF -> Megatron (torch_dist on disk) -> HF through the released Megatron-Bridge, on CPU: test code only.

Run by tests/engines/megatron/test_real_round_trip.py with the side environment's interpreter:

    .venv-megatron/bin/python round_trip.py [--read-config DIR]... HF_IN WORK_DIR HF_OUT [HF_IN WORK_DIR HF_OUT]...

Each HF_IN is what stagewise hands Megatron-Bridge (engines/megatron/hf_config.py's copy). On a GPU
node the conversion step does the same library calls: `AutoBridge.from_hf_pretrained` -> provider ->
model -> `save_megatron_model`, and on export a load of that checkpoint -> `save_hf_pretrained`.
Here they run on CPU through harness.py, which stands in for what needs a GPU (Transformer Engine,
mamba-ssm's CUDA extension, the CUDA device and RNG calls; see there why each). The model is built
from the local spec with torch norms because the default NemotronH spec needs Transformer Engine,
and the reload goes through `build_and_load_model` with that same provider because the official
`export_ckpt` rebuilds the model from `run_config.yaml`, which cannot name a local spec. Each model
is loaded in its checkpoint's own dtype. The distributed-checkpoint save starts a spawn Manager,
hence the `__main__` guard. All conversions run in one process: the import costs most of the time.

`--read-config DIR`: reports whether this environment's transformers (the one Megatron-Bridge pins)
reads DIR/config.json, and the layer kinds it reads.

Prints one JSON line: {"transformers": version, "read": {dir: {"layers": [...]} | {"error": str}},
"converted": [{"hf_in", "megatron_checkpoint", "hf_out", "params", "seconds"}], "import_s": s}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def read_config(path: str) -> dict:
    from transformers import AutoConfig

    try:
        return {"layers": list(AutoConfig.from_pretrained(path).layers_block_type)}
    except Exception as err:  # the refusal is the result
        return {"error": f"{type(err).__name__}: {err}"}


def convert(bridge_cls, hf_in: str, work_dir: str, hf_out: str) -> dict:
    import harness
    from megatron.bridge.training.model_load_save import build_and_load_model, temporary_distributed_context

    t0 = time.monotonic()
    bridge = bridge_cls.from_hf_pretrained(hf_in)
    dtype = bridge.hf_pretrained.config.torch_dtype
    meg_dir = Path(work_dir) / "megatron"
    with temporary_distributed_context("gloo"):
        provider = harness.cpu_provider(bridge.to_megatron_provider(load_weights=True), dtype)
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        params = sum(p.numel() for m in model for p in m.parameters())
        bridge.save_megatron_model(model, meg_dir, hf_tokenizer_path=hf_in)
        del model
        ckpt = _latest_iteration(meg_dir)
        reload = harness.cpu_provider(bridge.to_megatron_provider(load_weights=False), dtype)
        reload.perform_initialization = False
        loaded = build_and_load_model(str(ckpt), reload, use_cpu_init=True, skip_temp_dist_context=True)
        bridge.save_hf_pretrained(loaded, hf_out, show_progress=False)
    return {"hf_in": hf_in, "megatron_checkpoint": str(ckpt), "hf_out": hf_out, "params": params,
            "seconds": round(time.monotonic() - t0, 1)}


def _latest_iteration(root: Path) -> Path:
    """The `iter_*` directory the save wrote (what a training run's `pretrained_checkpoint` names)."""
    found = sorted(root.glob("iter_*"))
    if not found:
        raise FileNotFoundError(f"{root}: the Megatron save wrote no iter_* directory")
    return found[-1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--read-config", action="append", default=[])
    p.add_argument("triples", nargs="*", help="HF_IN WORK_DIR HF_OUT, repeated")
    args = p.parse_args()
    if len(args.triples) % 3:
        p.error("conversions come as HF_IN WORK_DIR HF_OUT triples")
    t0 = time.monotonic()

    import harness

    harness.install()
    import transformers
    from megatron.bridge import AutoBridge

    import_s = round(time.monotonic() - t0, 1)
    report = {"transformers": transformers.__version__, "read": {d: read_config(d) for d in args.read_config}}
    t = args.triples
    report["converted"] = [convert(AutoBridge, *t[i:i + 3]) for i in range(0, len(t), 3)]
    report["import_s"] = import_s
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
