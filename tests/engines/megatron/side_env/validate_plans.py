"""Our Megatron-Bridge plans through the released library's own config path, on CPU: test code only.

Run by tests/engines/megatron/test_real_plans.py with the side environment's interpreter:

    .venv-megatron/bin/python validate_plans.py PLANS.json    (or `-`: the plans on stdin)

PLANS.json is a list of `{"name": ..., "argv": [...], "world_size": N, "read": [...]}`, where `argv`
is what our plan hands `scripts/training/run_recipe.py` (MegatronPlan.argv() after the script path:
`--recipe`, `--mode`, `--dataset`, then the `key=value` overrides exactly as rendered),
`world_size` the ranks the launch starts, and `read` (optional) dotted paths of the validated
config to report; a plan with `"tokenizer": {"text": ..., "messages": [...]}` also has its
tokenizer built (step 9). For each plan this prints one JSON line, `{"plan": name, "ok": true,
"cpu_only": [...], "read": {path: value}}` (and `"tokenizer": {"ok": ...}`) or `{"plan": name,
"ok": false, "error": TYPE, "message": ...}`. The library is imported before the plans are read,
so a caller may start this script and write the plans to its stdin once what they need (the Hub
cache below) is on disk.

The Hub: the Nano 30B-A3B SFT and PEFT recipe functions build their model with
`AutoBridge.from_hf_pretrained("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
.to_megatron_provider(load_weights=False)`, which reads that repository's config.json (nothing
else). The caller runs this script offline (HF_HUB_OFFLINE=1) with HF_HUB_CACHE naming a Hugging
Face cache that holds the repository's `refs/main` and `snapshots/<rev>/config.json`, so the
library's own lookup finds it there as it would a downloaded one (test_real_plans.py writes that
config from our model preset). A plan may name another cache as `"hf_hub_cache"` (a probe: a cache
whose config differs, to show the cache is what the recipe reads); huggingface_hub's cache path is
set to it for that plan only.

What a rank of run_recipe.py does before training, step by step, and where each step comes from.
`scripts/` ships in the container's Megatron-Bridge checkout, not in the megatron-bridge wheel, so
the script's own lines are restated here (read from scripts/training/run_recipe.py and
recipe_runner.py on the release branch r0.6.0); every other step is the installed library's:
1. the arguments: `--recipe/--mode/--dataset`, then trailing overrides that must be KEY=VALUE;
2. the recipe name must not contradict `--mode` (pretrain / sft / peft in the name);
3. the recipe function, found in `megatron.bridge.recipes` (or a family's `h100` module), called
   with `peft_scheme=<mode>` for lora / dora, as recipe_runner.load_recipe does;
4. `--dataset`: `recipes.utils.dataset_utils.build_dataset_config` replaces the recipe's dataset,
   and `dataset_train_mode` must agree with the mode;
5. the overrides: `training.utils.omegaconf_utils.process_config_with_overrides`;
6. the script's syncs after the overrides. The one our translation relies on is applied:
   model.seq_length takes dataset.seq_length (the plan sets only `dataset.seq_length`). The others
   (recipe_runner's sync_offline_packing_alignment, sync_finetuning_cp_invariants, and the pipeline
   layout rebuild) are checked, not applied: a plan must already hold what they would derive, so
   that the plan's text says what runs and the check does not lean on a restatement of script code
   (a plain dict for offline_packing_specs, a packed size or pad multiple the sync would change,
   CP without per-token loss, are reported as `ScriptWouldChange`);
7. CPU-only settings (CPU_ONLY below), never over a key the plan sets;
8. `training.config.runtime_config_update`, with WORLD_SIZE / RANK set to the launch's ranks, as
   pretrain()/finetune() call it first: mixed precision and communication overlap set up, the
   data-parallel size derived, then `ConfigContainer.validate()`;
9. (plans that ask) the run's tokenizer, as training/setup.py builds it once the config is
   validated: `training.tokenizers.tokenizer.build_tokenizer(cfg.tokenizer)` (megatron-core's
   HuggingFaceTokenizer, i.e. the pinned transformers' AutoTokenizer.from_pretrained on
   `tokenizer.tokenizer_model`), reported as its class, vocabulary size, end-of-document id, the ids
   of the given text (`tokenize`) and the conversation rendered by its chat template
   (`apply_chat_template(..., tokenize=False)`; null without one), and the model vocabulary setup.py settles on next
   (`_validate_and_set_vocab_size`: [size, pad]); or as the error it raises (its own result: the
   config itself validated).

The CPU stand-ins for Transformer Engine and CUDA come from harness.py beside this file.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

CPU_ONLY = (
    ("optimizer.use_precision_aware_optimizer", True, False),  # needs Transformer Engine's FusedAdam
    ("model.apply_rope_fusion", True, False),  # needs Transformer Engine's fused RoPE
    ("model.moe_permute_fusion", True, False),  # needs Transformer Engine's fused token permutation
    ("model.moe_token_dispatcher_type", "flex", "alltoall"),  # validate() asks the GPU's architecture
)
"""CPU-only settings (key, the recipe's value, the value used here), applied after the plan's overrides
and only where the recipe has that value: the notes' "no precision-aware optimizer, RoPE fusion or
flex dispatcher", and the fused MoE permutation; a CPU machine has none of their kernels. Our plans
set none of these keys (a plan that does is refused, so the check never hides a plan's own value);
each result names the ones applied."""


class ScriptWouldChange(Exception):
    """run_recipe.py would change the config after the overrides: the plan does not say what runs."""


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Step 1: run_recipe.py's selection arguments, then the trailing KEY=VALUE overrides in order."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--recipe", required=True)
    p.add_argument("--mode", required=True, choices=["pretrain", "sft", "lora", "dora"])
    p.add_argument("--dataset")
    args, rest = p.parse_known_args(argv)
    for value in rest:
        if value.startswith("-") or "=" not in value:
            raise ValueError(f"run_recipe.py refuses {value!r}: every trailing argument is KEY=VALUE")
    return args, rest


def _check_mode(recipe: str, mode: str) -> None:
    """Step 2: a conventional recipe name names its task; the mode must be that task."""
    task = {"pretrain": "pretrain", "sft": "sft", "lora": "peft", "dora": "peft"}[mode]
    named = [t for t in ("pretrain", "sft", "peft") if f"_{t}_" in f"_{recipe}_"]
    if named and named != [task]:
        raise ValueError(f"Mode '{mode}' is incompatible with recipe '{recipe}'.")


def _recipe_function(name: str):
    """Step 3: the exported recipe function (the package's own export, else a family's h100 module)."""
    import pkgutil

    import megatron.bridge.recipes as recipes

    fn = getattr(recipes, name, None)
    if callable(fn):
        return fn
    for info in pkgutil.iter_modules(recipes.__path__):
        if info.ispkg and info.name != "utils":
            try:
                module = importlib.import_module(f"{recipes.__name__}.{info.name}.h100")
            except ModuleNotFoundError:
                continue
            fn = getattr(module, name, None)
            if callable(fn):
                return fn
    raise AttributeError(f"Recipe '{name}' not found in megatron.bridge.recipes")


def _load_recipe(name: str, mode: str):
    """Step 3: call the recipe function; a PEFT mode is passed as `peft_scheme` (or `peft`)."""
    fn = _recipe_function(name)
    if mode not in ("lora", "dora"):
        return fn()
    params = inspect.signature(fn).parameters
    key = "peft_scheme" if "peft_scheme" in params else "peft"
    return fn(**{key: mode})


def _apply_dataset(cfg, dataset: str | None, mode: str):
    """Step 4: the `--dataset` preset in place of the recipe's dataset."""
    if dataset is None:
        return cfg
    from megatron.bridge.recipes.utils.dataset_utils import build_dataset_config, dataset_train_mode

    cfg.dataset = build_dataset_config(cfg, dataset)
    wanted = "pretrain" if mode == "pretrain" else "finetune"
    if dataset_train_mode(cfg.dataset) != wanted:
        raise ValueError(f"Mode '{mode}' is incompatible with dataset '{dataset}'.")
    return cfg


def _overridden(overrides: list[str]) -> set[str]:
    """The dotted keys the overrides set (Hydra's +/++/~ prefixes dropped)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def _copy_seq_length(cfg) -> None:
    """Step 6, applied: the dataset owns the sequence length; the script copies it into the model."""
    length = getattr(cfg.dataset, "seq_length", None)
    if length is not None and getattr(cfg.model, "seq_length", None) is not None:
        cfg.model.seq_length = length


def _script_changes(cfg, mode: str, overrides: list[str]) -> list[str]:
    """Step 6, checked: what run_recipe.py's remaining syncs would change in this config."""
    model, dataset, out = cfg.model, cfg.dataset, []
    keys = _overridden(overrides)
    if getattr(model, "_pipeline_model_parallel_layout_builder", None) is not None and \
            keys & {"model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"}:
        out.append("the recipe's pipeline layout would be rebuilt for the new pipeline sizes")
    cps = {model.context_parallel_size} | ({cfg.dist.eval_context_parallel_size} - {None})
    if mode != "pretrain" and hasattr(dataset, "enable_offline_packing") and max(cps) > 1:
        if not model.calculate_per_token_loss or cfg.ddp.average_in_collective:
            out.append("context parallelism would switch on per-token loss and off average_in_collective")
    if getattr(dataset, "enable_offline_packing", False):
        specs = dataset.offline_packing_specs
        if specs is None or isinstance(specs, dict):
            out.append(f"offline_packing_specs would be made a PackedSequenceSpecs (it is {type(specs).__name__})")
        else:
            tp, sp = model.tensor_model_parallel_size, bool(model.sequence_parallel)
            pad = math.lcm(specs.pad_seq_to_mult or 1, *(2 * c if c > 1 else 1 for c in cps),
                           *(c * tp if sp and tp > 1 else 1 for c in cps))
            if specs.packed_sequence_size != dataset.seq_length:
                out.append(f"packed_sequence_size {specs.packed_sequence_size} would become {dataset.seq_length}")
            if specs.pad_seq_to_mult != pad:
                out.append(f"pad_seq_to_mult {specs.pad_seq_to_mult} would become {pad}")
    return out


def _apply_cpu_only(cfg, overrides: list[str]) -> list[str]:
    """Step 7: CPU_ONLY where the recipe has it, refusing any key the plan itself sets."""
    clash = sorted(_overridden(overrides) & {key for key, _, _ in CPU_ONLY})
    if clash:
        raise ValueError(f"the plan sets CPU-only keys {clash}: this check cannot validate it on CPU")
    applied = []
    for key, recipe_value, cpu_value in CPU_ONLY:
        section, name = key.split(".")
        target = getattr(cfg, section)
        if getattr(target, name, None) == recipe_value:
            setattr(target, name, cpu_value)
            applied.append(f"{key}={cpu_value}")
    return applied


@contextmanager
def _imported_checkpoint(cfg):
    """The plan's `checkpoint.pretrained_checkpoint` taken as written by the import step that runs
    before training (engines/megatron/translate.py import_argv): validate() asserts it exists, and
    this check runs without the weights. Any other path is still looked up."""
    from megatron.bridge.training.utils import checkpoint_utils

    planned, real = cfg.checkpoint.pretrained_checkpoint, checkpoint_utils.file_exists
    checkpoint_utils.file_exists = lambda path: (planned is not None and str(path) == str(planned)) or real(path)
    try:
        yield
    finally:
        checkpoint_utils.file_exists = real


@contextmanager
def _hub_cache(path: str | None):
    """The Hugging Face cache huggingface_hub (and transformers through it) looks files up in, for one
    plan: `path`, else the process's HF_HUB_CACHE as it is."""
    if path is None:
        yield
        return
    from huggingface_hub import constants

    saved_env, saved = os.environ.get("HF_HUB_CACHE"), constants.HF_HUB_CACHE
    os.environ["HF_HUB_CACHE"] = constants.HF_HUB_CACHE = path
    try:
        yield
    finally:
        constants.HF_HUB_CACHE = saved
        if saved_env is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = saved_env


@contextmanager
def _ranks(world_size: int):
    """WORLD_SIZE / RANK as torchrun sets them for rank 0 of the launch, for the call only."""
    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def validate(argv: list[str], world_size: int, read: list[str] = ()):
    """Steps 1-8 for one plan; raises what the library (or the script's check) raises, else
    returns the CPU-only settings applied, the `read` paths of the validated config, and the config."""
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    args, overrides = _parse(argv)
    _check_mode(args.recipe, args.mode)
    cfg = _apply_dataset(_load_recipe(args.recipe, args.mode), args.dataset, args.mode)
    cfg = process_config_with_overrides(cfg, cli_overrides=overrides)
    _copy_seq_length(cfg)
    changes = _script_changes(cfg, args.mode, overrides)
    if changes:
        raise ScriptWouldChange("; ".join(changes))
    applied = _apply_cpu_only(cfg, overrides)
    with _ranks(world_size), _imported_checkpoint(cfg):
        runtime_config_update(cfg)
    return applied, {path: _read(cfg, path) for path in read}, cfg


def run_tokenizer(cfg, probe: dict) -> dict:
    """Step 9: the validated config's tokenizer built as a training run builds it, and what it makes of
    `probe` (its text and its conversation); an error is the result, not raised."""
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    try:
        tok = build_tokenizer(cfg.tokenizer)
        model_vocab = _validate_and_set_vocab_size(cfg.model.vocab_size, tok.vocab_size,
                                                   getattr(cfg.tokenizer, "use_tokenizer_vocab_size", False))
        return {"ok": True, "path": str(cfg.tokenizer.tokenizer_model), "class": type(tok).__name__,
                "vocab_size": tok.vocab_size, "eod": tok.eod, "ids": list(tok.tokenize(probe["text"])),
                "chat": tok.apply_chat_template(probe["messages"], tokenize=False) if tok.chat_template else None,
                "model_vocab": list(model_vocab)}
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return {"ok": False, "path": str(cfg.tokenizer.tokenizer_model), "error": type(e).__name__,
                "message": str(e)[:2000]}


def _read(cfg, path: str):
    """A dotted attribute of the validated config: JSON values as they are (lists, tuples and
    string-keyed dicts of them, nested, as lists and objects: `dataset.split_matrix` -> [[0, 1.0],
    None, None]), anything else by its type name (`dataset.offline_packing_specs` -> "PackedSequenceSpecs")."""
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return _plain(value) if _is_plain(value) else type(value).__name__


def _is_plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and all(_is_plain(v) for v in value)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("plans", help="PLANS.json, or - to read the plans from stdin")
    source = p.parse_args().plans
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

    harness.install()
    importlib.import_module("megatron.bridge.recipes")  # the imports are most of the time: before the plans
    importlib.import_module("megatron.bridge.training.config")
    plans = json.loads(sys.stdin.read() if source == "-" else Path(source).read_text())
    for plan in plans:
        try:
            with _hub_cache(plan.get("hf_hub_cache")):
                applied, values, cfg = validate(plan["argv"], plan["world_size"], plan.get("read", []))
            result = {"plan": plan["name"], "ok": True, "cpu_only": applied, "read": values}
            if "tokenizer" in plan:
                result["tokenizer"] = run_tokenizer(cfg, plan["tokenizer"])
        except Exception as e:  # noqa: BLE001 - every refusal is a result, reported by name
            result = {"plan": plan["name"], "ok": False, "error": type(e).__name__,
                      "message": str(e)[:2000], "where": traceback.format_exc(limit=-3)[-1500:]}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
