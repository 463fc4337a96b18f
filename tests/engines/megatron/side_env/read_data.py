"""Our Megatron data read by the released libraries' own dataset code, on CPU: test code only.

Run by tests/engines/megatron/test_real_data.py with the side environment's interpreter:

    .venv-megatron/bin/python read_data.py REQUEST.json

REQUEST.json (every part optional):

    {"indexed": [prefix, ...],
     "gpt": {"blend": [[prefix, ...], [weight, ...]], "seq_length": S, "samples": N, "seed": s,
             "tokenizer": DIR, "split": "a,b,c" (optional)},
     "chat": {"dataset_roots": [DIR, ...], "seq_length": S, "tokenizer": DIR}}

- indexed: each `<prefix>.bin/.idx` opened with megatron-core's `IndexedDataset`: its dtype,
  sequence count, document index and every document's tokens.
- gpt: what `--dataset megatron-indexed` with our plan's overrides builds. The preset's own config
  (`recipes.utils.dataset_utils.build_dataset_config`: its split, flags and seed handling are the
  library's, not restated here) with the plan's `dataset.blend`, `dataset.random_seed` and
  `dataset.seq_length` (and `dataset.split` when the request names one), finalized, given the run's
  tokenizer as training/setup.py gives it, then built by
  `data.utils.pretrain_train_valid_test_datasets_provider` (megatron-core's
  `BlendedMegatronDatasetBuilder` over `GPTDataset`) for N training samples and none for
  validation or test (our plans turn validation off). Reported: the split and the split matrix
  finalize() derives from it, the blended dataset's length and
  (dataset, sample) index, and per contributing GPTDataset its requested samples, length, document
  split, tokens per epoch, document order, shuffle index and every sample (the raw
  `seq_length + 1` token window, and the `tokens` / `labels` its __getitem__ returns).
- chat: per root, what `--dataset local-jsonl` with translate.chat_jsonl_overrides builds: the
  preset's config with `dataset_root`, `ChatSFTPreprocessingConfig(loss_mode="assistant")` and no
  validation or test split, read by `builders.gpt_sft.GPTSFTDatasetBuilder` (GPTSFTChatDataset ->
  _chat_preprocess -> conversation_processing.tokenize_chat_example), row by row: its id, input
  ids and (unshifted) loss mask. Offline packing is left off: it concatenates these same rows.

Both use the tokenizer a run builds (`training.tokenizers.tokenizer.build_tokenizer` with
translate._tokenizer_overrides' HuggingFaceTokenizer settings). Importing Megatron-Bridge's data
builders reaches `megatron.bridge.peft.lora_layers`, which imports Transformer Engine, so
harness.install() runs first (its other stand-ins are for building models, which this does not do).

Prints one JSON line: {"indexed": {prefix: ...}, "gpt": {...}, "chat": {root: [{"id", "input_ids",
"loss_mask"}]}, "import_s": s, "seconds": s}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def read_indexed(prefix: str) -> dict:
    """A prefix as megatron-core's IndexedDataset reads it."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix, multimodal=False, mmap=True)
    return {"dtype": ds.index.dtype.__name__, "sequence_count": len(ds),
            "document_indices": ds.document_indices.tolist(),
            "documents": [ds[i].tolist() for i in range(len(ds))]}


def hf_tokenizer(path: str):
    """The run's tokenizer: our HF directory through Megatron-Bridge's build_tokenizer."""
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    return build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=path,
                                           hf_tokenizer_kwargs={"use_fast": True}))


def preset(name: str, seq_length: int):
    """A `--dataset` preset's config, for a recipe whose model has `seq_length` (all the preset reads)."""
    from megatron.bridge.recipes.utils.dataset_utils import build_dataset_config

    return build_dataset_config(SimpleNamespace(model=SimpleNamespace(seq_length=seq_length)), name)


def build_gpt(req: dict) -> dict:
    """The megatron-indexed preset over our blend, as a pretraining run builds its training data."""
    from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider

    cfg = preset("megatron-indexed", req["seq_length"])
    cfg.blend = req["blend"]
    cfg.random_seed = req["seed"]
    cfg.split = req.get("split", cfg.split)
    cfg.finalize()
    cfg.tokenizer = hf_tokenizer(req["tokenizer"])
    train, _, _ = pretrain_train_valid_test_datasets_provider([req["samples"], 0, 0], cfg)
    parts = list(getattr(train, "datasets", [train]))
    out = {"kind": type(train).__name__, "split": cfg.split, "length": len(train),
           "split_matrix": [None if b is None else list(b) for b in cfg.split_matrix],
           "datasets": [_gpt_part(ds) for ds in parts]}
    if hasattr(train, "dataset_index"):
        out["dataset_index"] = train.dataset_index.tolist()
        out["dataset_sample_index"] = train.dataset_sample_index.tolist()
    return out


def _gpt_part(ds) -> dict:
    """One GPTDataset: its document split and order, and every sample it yields."""
    samples = []
    for i in range(len(ds)):
        window, _, _ = ds._query_document_sample_shuffle_indices(i)
        item = ds[i]
        samples.append({"window": window.tolist(), "tokens": item["tokens"].tolist(),
                        "labels": item["labels"].tolist()})
    return {"prefix": ds.dataset.path_prefix, "num_samples": ds.num_samples, "length": len(ds),
            "indices": ds.indices.tolist(), "tokens_per_epoch": ds._get_num_tokens_per_epoch(),
            "document_index": ds.document_index.tolist(), "shuffle_index": ds.shuffle_index.tolist(),
            "samples": samples}


def read_chat(root: str, seq_length: int, tokenizer) -> list[dict]:
    """Our chat rows under `root` through the local-jsonl preset with the chat preprocessing, row by row."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.bridge.data.sft_processing import ChatSFTPreprocessingConfig

    cfg = preset("local-jsonl", seq_length)
    cfg.dataset_root = root
    cfg.preprocessing = ChatSFTPreprocessingConfig(loss_mode="assistant")
    cfg.do_validation = cfg.do_test = False
    cfg.finalize()
    train, _, _ = GPTSFTDatasetBuilder(config=cfg, tokenizer=tokenizer).build()
    rows = []
    for i in range(len(train)):
        ex = train[i]
        rows.append({"id": ex["metadata"].get("id"), "input_ids": ex["input_ids"].tolist(),
                     "loss_mask": [int(v) for v in ex["loss_mask"].tolist()]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("request", type=Path)
    req = json.loads(p.parse_args().request.read_text())
    t0 = time.monotonic()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

    harness.install()
    import megatron.bridge.data.builders.gpt_sft  # noqa: F401  (the import is most of the time)
    import megatron.bridge.data.utils  # noqa: F401

    report = {"import_s": round(time.monotonic() - t0, 1)}
    report["indexed"] = {prefix: read_indexed(prefix) for prefix in req.get("indexed", [])}
    if "gpt" in req:
        report["gpt"] = build_gpt(req["gpt"])
    if "chat" in req:
        chat = req["chat"]
        tokenizer = hf_tokenizer(chat["tokenizer"])
        report["chat"] = {root: read_chat(root, chat["seq_length"], tokenizer) for root in chat["dataset_roots"]}
    report["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
