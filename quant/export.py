"""Write a quantized model as a deployable Hugging Face checkpoint, and recount its bits from the files.

modelopt's `export_hf_checkpoint` writes the unified HF format vLLM and TensorRT-LLM load:
config.json with `quantization_config` (quant_method modelopt), hf_quant_config.json, and
safetensors whose tensors are renamed `backbone.*`, fused experts split per expert, NVFP4 weights
packed two to a byte (U8) with F8_E4M3 block scales and FP32 per-tensor scales, FP8 weights as
F8_E4M3 with an FP32 scale, everything else in BF16. Two fixes on top (docs/STACK.md): modelopt
0.47 appends a `\\u0000backbone.pt_name_sentinel` suffix to module names in both JSON files (cut
here), and the directory is written atomically like every checkpoint (model.checkpoint.atomic_dir).
Beside them `stagewise_quant.json` holds the plan (every operator's format, the searched set),
which our own loader (quant/load.py) reads.

`recount_bits` reads only safetensors headers: the report's effective bits are checked against
what the files actually hold, not against what the plan meant.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from stagewise.model.checkpoint import META_FILE, atomic_dir, weights_sha256
from stagewise.quant.formats import format_stored_as
from stagewise.quant.plan import Plan

PLAN_FILE = "stagewise_quant.json"
SENTINEL = re.compile(r"\.?\u0000[^\"]*?pt_name_sentinel")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")
DTYPE_BYTES = {"U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "BF16": 2, "F16": 2, "F32": 4}


def export_name(module: str) -> str:
    """Where an operator's tensors live in the export (`model.` becomes modelopt's `backbone.`)."""
    return "backbone." + module[len("model."):] if module.startswith("model.") else module


def strip_sentinels(path: Path) -> None:
    """Cut modelopt 0.47's module-name sentinel suffix out of a JSON file (keys and values)."""
    text = path.read_text(encoding="utf-8")
    fixed = SENTINEL.sub("", text.replace("\\u0000", "\u0000"))
    path.write_text(json.dumps(json.loads(fixed), indent=2) + "\n", encoding="utf-8")


def export_checkpoint(model: torch.nn.Module, plan: Plan, source: str | Path, out_dir: str | Path,
                      dtype: torch.dtype = torch.bfloat16, meta: dict | None = None) -> Path:
    """Export the quantized `model` to `out_dir` (atomically), with the tokenizer of `source` and the plan.

    The export consumes `model` (modelopt packs its weights in place): score it before, or export a copy.
    `meta` (model.checkpoint.CheckpointMeta's fields) becomes the export's stagewise.json, with the
    weights' sha256, so the export is a checkpoint of the pipeline like any other."""
    from modelopt.torch.export import export_hf_checkpoint  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)


    out_dir = Path(out_dir)
    model = model.to(dtype)  # modelopt's own dtype argument leaves an FP32 model's unquantized weights FP32
    with atomic_dir(out_dir) as tmp:
        export_hf_checkpoint(model, dtype=dtype, export_dir=tmp)
        for name in ("config.json", "hf_quant_config.json"):
            if (tmp / name).exists():
                strip_sentinels(tmp / name)
        for name in TOKENIZER_FILES:
            if (Path(source) / name).exists() and not (tmp / name).exists():
                shutil.copy2(Path(source) / name, tmp / name)
        (tmp / PLAN_FILE).write_text(json.dumps({"formats": plan.formats, "searched": plan.searched,
                                                 "method": plan.method, "source": str(source)}, indent=2) + "\n")
        if meta is not None:
            doc = meta | {"weight_sha256": weights_sha256(tmp)}
            (tmp / META_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return out_dir


def headers(export_dir: Path) -> dict[str, tuple[str, list[int]]]:
    """Every tensor's (dtype, shape) from the safetensors headers, without reading the data."""
    out: dict[str, tuple[str, list[int]]] = {}
    for f in sorted(export_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        out |= {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}
    return out


def recount_bits(export_dir: str | Path, modules: list[str]) -> dict[str, tuple[int, float]]:
    """Per operator: (weight elements, storage bits) as the export holds them.

    Counted: each `weight` tensor (a format's packed dtype holds `QuantFormat.packing` elements per
    stored one: NVFP4's U8 two a byte) and a per-block `weight_scale` (NVFP4's E4M3 scales);
    per-tensor scalars are metadata and not counted (as in modelopt's search). Fused experts are found under `<module>.<i>.<proj>`."""
    heads = headers(Path(export_dir))
    out: dict[str, tuple[int, float]] = {}
    for module in modules:
        prefix = export_name(module)
        weights = [k for k in heads if k.endswith(".weight") and (k == f"{prefix}.weight" or
                                                                 re.fullmatch(re.escape(prefix) + r"\.\d+\.\w+\.weight", k))]
        if not weights:
            raise ValueError(f"{export_dir}: no weights for operator {module} (looked for {prefix}.weight)")
        elements, bits = 0, 0.0
        for k in weights:
            dtype, shape = heads[k]
            n = int(torch.tensor(shape).prod())
            fmt = format_stored_as(dtype)
            elements += n * (fmt.packing if fmt is not None else 1)
            bits += n * DTYPE_BYTES[dtype] * 8
            scale = heads.get(k[: -len("weight")] + "weight_scale")
            if scale is not None and len(scale[1]) > 0:
                bits += int(torch.tensor(scale[1]).prod()) * DTYPE_BYTES[scale[0]] * 8
        out[module] = (elements, bits)
    return out


def recounted_effective_bits(export_dir: str | Path, modules: list[str]) -> float:
    """Average storage bits per weight element over `modules`, recounted from the export's files."""
    counts = recount_bits(export_dir, modules)
    return sum(b for _, b in counts.values()) / sum(n for n, _ in counts.values())
