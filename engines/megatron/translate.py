"""`engine: megatron`: one stage's recipe block as a Megatron-Bridge run, and the HF-bridge conversions around it.

Megatron-Bridge runs in its own environment (engines/launch/plans.py starts it), so nothing of
it is imported here. What this module builds is plain data:

- a `MegatronPlan`: the upstream recipe function to start from (`--recipe NAME`, picked per
  preset, mode and sequence length among the recipes upstream ships) plus `overrides` in
  Megatron-Bridge's own dotted ConfigContainer keys (`train.train_iters=100`, ...). The entry is
  `python scripts/training/run_recipe.py --recipe NAME --mode MODE [--dataset D] key=value ...`,
  which is what upstream's train.sh ends up running in each rank (train.sh only wraps it in
  NeMo-Run; our launcher starts the ranks itself). Overrides are Hydra values (run_recipe.py applies
  them with Hydra's override parser), rendered by engines/hydra_overrides.py.
- the conversion argvs: HF -> Megatron before the stage (`import_argv`), Megatron -> HF after it
  (`export_argv`, or the LoRA merge for adapter runs), so every stage still hands on an HF-format
  checkpoint whatever engine trained it.

Our configs count tokens; Megatron counts optimizer steps (iterations), converted as our own engine
counts them (`tokens_per_step` = seq_length x global_batch): the stage budget rounded down to whole
steps (TrainConfig.total_steps: both engines train the same number of steps), warmup, decay and the
checkpoint interval to the nearest step (at least one). A 20T-token recipe need not be a multiple
of its step.

What does not translate raises `MegatronUnsupported` naming the recipe key to change (see
docs/STACK.md, "Megatron-Bridge translation"). Upstream facts come from NVIDIA-NeMo/Megatron-Bridge
at UPSTREAM_COMMIT: recipes/nemotronh/h100/{nemotron_3_nano_4b,nemotron_3_nano,nemotronh,
nemotron_nano_v2}.py, recipes/common.py, scripts/training/run_recipe.py and recipe_runner.py,
training/config.py, scripts/conversion/{arguments,run_conversion}.py, examples/peft/merge_lora.py.
The override text itself is written for the release a team installs, the megatron-bridge pinned
in release.py (MEGATRON_BRIDGE_RELEASE): tests/engines/megatron/test_real_plans.py runs every plan
the recipe check emits through that release's recipe functions, override processing and
ConfigContainer.validate(), and the launch check refuses another release.
No Prefect, no MLflow.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Literal

from stagewise.engines.config import LaunchConfig, Parallelism
from stagewise.engines.hydra_overrides import override_args
from stagewise.model.config import LoRAConfig, ModelConfig, OptimizerConfig, TrainConfig
from stagewise.model.presets import preset_about, preset_kwargs, preset_names
from stagewise.model.schedules import decay_tokens

UPSTREAM_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
"""The Megatron-Bridge commit whose recipes, scripts and config field names this module follows
(the overrides are validated against the pinned release, release.py's MEGATRON_BRIDGE_RELEASE)."""

TRAIN_SCRIPT = "scripts/training/run_recipe.py"
CONVERT_SCRIPT = "scripts/conversion/run_conversion.py"
MERGE_LORA_SCRIPT = "examples/peft/merge_lora.py"
"""Paths inside the Megatron-Bridge checkout (the container's /opt/Megatron-Bridge)."""

Mode = Literal["pretrain", "sft", "lora"]
"""run_recipe.py's `--mode` values we use (it also has `dora`)."""

DATASET_PRESETS = ("mock", "megatron-indexed", "energon", "squad", "tulu3", "openmathinstruct2",
                   "openmathinstruct2-thinking", "gsm8k", "local-jsonl")
"""run_recipe.py's text `--dataset` choices (recipes/utils/dataset_utils.py DATASET_PRESETS)."""


class MegatronUnsupported(ValueError):
    """A recipe setting has no faithful Megatron-Bridge counterpart. `field` is the key to change."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


# ---------------------------------------------------------------------------------------------
# upstream recipes


@dataclass(frozen=True)
class UpstreamRecipe:
    """One recipe function of Megatron-Bridge and the facts about it the translation relies on."""

    name: str
    """The function name run_recipe.py's `--recipe` takes."""
    mode: Mode
    """Its training mode (run_recipe.py refuses a `--mode` that contradicts the name)."""
    seq_length: int
    """The sequence length the recipe is built for (picks the 2k or the 32k SFT recipe)."""
    pad_seq_to_mult: int = 1
    """Its offline-packing pad multiple (recipe-owned; CP / SP raise it, as run_recipe.py does)."""


RECIPES: dict[str, tuple[UpstreamRecipe, ...]] = {
    # recipes/nemotronh/h100/nemotron_3_nano_4b.py: TP1 PP1 CP1 (DP8) bf16; the 32k SFT recipe
    # sets CP2/a2a, per-token loss, no cross-entropy fusion and pad 4; the PEFT recipe pad 4.
    "nemotron-3-nano-4b": (
        UpstreamRecipe("nemotron_3_nano_4b_pretrain_8gpu_h100_bf16_config", "pretrain", 4096),
        UpstreamRecipe("nemotron_3_nano_4b_sft_8gpu_h100_bf16_config", "sft", 2048, 1),
        UpstreamRecipe("nemotron_3_nano_4b_sft_8gpu_h100_bf16_32k_config", "sft", 32768, 4),
        UpstreamRecipe("nemotron_3_nano_4b_peft_8gpu_h100_bf16_config", "lora", 2048, 4),
    ),
    # recipes/nemotronh/h100/nemotron_3_nano.py: TP1 PP1 EP8 ETP1; SFT/PEFT build the provider with
    # AutoBridge from the Hub id (the recipe reads the HF config when it is built).
    "nemotron-3-nano-30b-a3b": (
        UpstreamRecipe("nemotron_3_nano_pretrain_8gpu_h100_bf16_config", "pretrain", 8192),
        UpstreamRecipe("nemotron_3_nano_sft_8gpu_h100_bf16_config", "sft", 2048, 1),
        UpstreamRecipe("nemotron_3_nano_peft_8gpu_h100_bf16_config", "lora", 2048, 1),
    ),
    # recipes/nemotronh/h100/nemotronh.py and nemotron_nano_v2.py (deprecated families upstream;
    # they default to a NullTokenizer, so pass `tokenizer`).
    "nemotron-h-8b": (
        UpstreamRecipe("nemotronh_8b_pretrain_2gpu_h100_bf16_config", "pretrain", 8192),
        UpstreamRecipe("nemotronh_8b_sft_2gpu_h100_bf16_config", "sft", 2048, 1),
        UpstreamRecipe("nemotronh_8b_peft_1gpu_h100_bf16_config", "lora", 2048, 1),
    ),
    "nemotron-nano-9b-v2": (
        UpstreamRecipe("nemotron_nano_9b_v2_pretrain_2gpu_h100_bf16_config", "pretrain", 8192),
        UpstreamRecipe("nemotron_nano_9b_v2_sft_2gpu_h100_bf16_config", "sft", 2048, 1),
        UpstreamRecipe("nemotron_nano_9b_v2_peft_1gpu_h100_bf16_config", "lora", 2048, 1),
    ),
}
"""Upstream recipes per published preset (all H100 variants: the GPU count in a name is the layout
the recipe was tuned on; the plan overrides every parallel size, so it runs on any count)."""

GENERIC_BASE = {"dense": "nemotron-3-nano-4b", "moe": "nemotron-3-nano-30b-a3b"}
"""A shape without its own upstream recipe (tiny, small, a preset with overrides, an unknown `from`
checkpoint) starts from the recipe of this preset and replaces its HybridModelProvider fields."""

# Our NemotronHConfig kwargs -> HybridModelProvider fields (NemotronHBridge.CONFIG_MAPPING and the
# base MegatronModelBridge.CONFIG_MAPPING use the same pairs for HF <-> Megatron conversion).
_PROVIDER_FIELDS = (
    ("hybrid_override_pattern", "hybrid_layer_pattern"), ("hidden_size", "hidden_size"),
    ("intermediate_size", "ffn_hidden_size"), ("num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "num_query_groups"), ("head_dim", "kv_channels"),
    ("mamba_num_heads", "mamba_num_heads"), ("mamba_head_dim", "mamba_head_dim"),
    ("ssm_state_size", "mamba_state_dim"), ("n_groups", "mamba_num_groups"), ("chunk_size", "mamba_chunk_size"),
    ("vocab_size", "vocab_size"), ("tie_word_embeddings", "share_embeddings_and_output_weights"),
    ("layer_norm_epsilon", "layernorm_epsilon"), ("residual_in_fp32", "fp32_residual_connection"),
    ("use_bias", "add_bias_linear"),
)
_MOE_PROVIDER_FIELDS = (
    ("n_routed_experts", "num_moe_experts"), ("moe_intermediate_size", "moe_ffn_hidden_size"),
    ("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
    ("num_experts_per_tok", "moe_router_topk"), ("routed_scaling_factor", "moe_router_topk_scaling_factor"),
    ("n_group", "moe_router_num_groups"), ("topk_group", "moe_router_group_topk"),
)
_SHAPE_KEYS = tuple(k for k, _ in _PROVIDER_FIELDS + _MOE_PROVIDER_FIELDS) + ("mlp_hidden_act", "conv_kernel")


_LAYER_CHARS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "moe": "E", "mlp": "-"}
"""A saved NemotronHConfig's `layers_block_type` entries as hybrid_override_pattern characters (recent
transformers write the list and read the pattern only as a legacy kwarg; "mamba"/"attention" are
the legacy names)."""


def _published() -> list[str]:
    """Published presets (the JSON ones: they carry an `_about`)."""
    return [n for n in preset_names() if preset_about(n)]


def _is_moe(kwargs: Mapping[str, Any]) -> bool:
    return "E" in str(kwargs.get("hybrid_override_pattern", ""))


def model_shape(model: ModelConfig, field: str = "model") -> tuple[str | None, dict[str, Any]]:
    """(the published preset this network is, or None; its NemotronHConfig kwargs).

    A preset, a preset with overrides, or a `from` checkpoint's config.json are all compared with the
    published presets on the shape keys, so `nemotron-3-nano-4b` with a harmless override (or a
    checkpoint of that shape) still gets the upstream 4B recipes and its verified provider."""
    if model.mtp.num_heads:
        raise MegatronUnsupported(f"{field}.mtp.num_heads", "our multi-token-prediction heads are not translated "
                                  "to Megatron-Bridge (its MTP layers are a different module); set 0")
    if model.from_ is not None:
        path = Path(model.from_) / "config.json"
        try:
            kwargs = json.loads(path.read_text())
        except OSError as e:
            raise MegatronUnsupported(f"{field}.from", f"cannot read {path}: {e}") from None
        if "hybrid_override_pattern" not in kwargs and isinstance(kwargs.get("layers_block_type"), list):
            kwargs["hybrid_override_pattern"] = "".join(_LAYER_CHARS[t] for t in kwargs["layers_block_type"])
    else:
        kwargs = {**preset_kwargs(model.preset or "tiny"), **model.overrides}
    for name in _published():
        ref = preset_kwargs(name)
        if all(kwargs.get(k) == ref.get(k) for k in _SHAPE_KEYS if k in ref):
            return name, kwargs
    return None, kwargs


def _provider_overrides(kwargs: Mapping[str, Any], vocab_size: int | None, field: str) -> dict[str, Any]:
    """`model.*` overrides that turn the base recipe's HybridModelProvider into this shape."""
    if kwargs.get("mlp_hidden_act", "relu2") != "relu2":
        raise MegatronUnsupported(f"{field}.overrides.mlp_hidden_act",
                                  "the NemotronH recipes use squared ReLU (relu2) only")
    if kwargs.get("conv_kernel", 4) != 4:
        raise MegatronUnsupported(f"{field}.overrides.conv_kernel", "the Mamba layers of the recipes use conv width 4")
    moe = _is_moe(kwargs)
    if moe and kwargs.get("n_shared_experts", 1) != 1:
        raise MegatronUnsupported(f"{field}.overrides.n_shared_experts",
                                  "Megatron's MoE has one shared-expert block (its size is the total)")
    kw = dict(kwargs)
    if kw.get("vocab_size") is None:
        if vocab_size is None:
            raise MegatronUnsupported(f"{field}.preset", "the preset takes the tokenizer's vocabulary: pass "
                                      "vocab_size (the tokenizer's size) to the translation")
        kw["vocab_size"] = vocab_size
    out: dict[str, Any] = {"model.num_layers": len(kw["hybrid_override_pattern"])}
    for ours, theirs in _PROVIDER_FIELDS + (_MOE_PROVIDER_FIELDS if moe else ()):
        if ours in kw and kw[ours] is not None:
            out[f"model.{theirs}"] = kw[ours]
    return out


def pick_recipe(preset: str, mode: Mode, seq_length: int) -> UpstreamRecipe:
    """The upstream recipe of `preset` for `mode`: the shortest one that covers `seq_length`
    (4B SFT: the 2k recipe up to 2048, the 32k recipe above), else the longest."""
    options = sorted((r for r in RECIPES[preset] if r.mode == mode), key=lambda r: r.seq_length)
    if not options:
        raise ValueError(f"no upstream {mode} recipe for preset {preset!r}")
    return next((r for r in options if r.seq_length >= seq_length), options[-1])


@dataclass(frozen=True)
class MLflowTarget:
    """The MLflow run the Megatron-Bridge ranks log into: the stage's own run, resumed.

    Megatron-Bridge's logger (training/state.py) calls set_tracking_uri, set_experiment and
    start_run(run_name=...); with MLFLOW_RUN_ID in the environment, mlflow's start_run resumes that
    run instead of creating one (and checks that it belongs to the same experiment)."""

    tracking_uri: str
    experiment: str
    run_id: str
    run_name: str


def _steps(tokens: int, per_step: int, field: str, budget: bool = False) -> int:
    """Tokens as Megatron's whole steps, as our engine counts them: a budget rounded down (like
    TrainConfig.total_steps: a 20T-token recipe need not be a multiple of its step), an interval
    (warmup, decay, checkpoints) to the nearest step and at least one when it is set."""
    if budget:
        return tokens // per_step
    return max(1, round(tokens / per_step)) if tokens > 0 else 0


_LORA_TARGETS = {"o_proj": "linear_proj", "in_proj": "in_proj"}


def lora_targets(targets: Sequence[str], kwargs: Mapping[str, Any], field: str) -> list[str]:
    """Our LoRA target suffixes as Megatron-Bridge LoRA target_modules.

    Megatron fuses q/k/v into `linear_qkv` (all three or none). Our up/down_proj adapt the dense
    MLPs and the shared expert, never the routed experts (model/lora.py), so on a MoE shape they
    become wildcard names that leave `mlp.experts.*` out (a bare `linear_fc1` would also adapt every
    routed expert); each name is only emitted where the shape has such layers (upstream refuses a
    target that matches nothing)."""
    qkv = {"q_proj", "k_proj", "v_proj"} & set(targets)
    if qkv and qkv != {"q_proj", "k_proj", "v_proj"}:
        raise MegatronUnsupported(f"{field}.target_modules", f"Megatron fuses q/k/v into linear_qkv: target all of "
                                  f"q_proj, k_proj, v_proj or none (got {sorted(qkv)})")
    pattern = str(kwargs.get("hybrid_override_pattern", ""))
    moe = "E" in pattern
    out: list[str] = []
    for t in targets:
        if t in ("q_proj", "k_proj", "v_proj"):
            name = ["linear_qkv"]
        elif t in _LORA_TARGETS:
            name = [_LORA_TARGETS[t]]
        elif t in ("up_proj", "down_proj"):
            fc = "linear_fc1" if t == "up_proj" else "linear_fc2"
            if not moe:
                name = [fc]
            else:
                name = ([f"*.mlp.{fc}"] if "-" in pattern else []) + [f"*.mlp.shared_experts.{fc}"]
        else:
            raise MegatronUnsupported(f"{field}.target_modules", f"no Megatron-Bridge module for target {t!r} "
                                      "(known: q_proj, k_proj, v_proj, o_proj, in_proj, up_proj, down_proj)")
        out += [n for n in name if n not in out]
    return out


# ---------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class MegatronPlan:
    """One Megatron-Bridge training run: the recipe to start from and what to change in it."""

    recipe: str
    """Upstream recipe function name (`--recipe`)."""
    mode: Mode
    """`--mode`: pretrain, sft or lora."""
    preset: str | None
    """The published preset the network is (None: a shape of our own)."""
    base_preset: str
    """Whose recipe is used: `preset`, or GENERIC_BASE's for a shape without its own recipe."""
    overrides: dict[str, Any]
    """ConfigContainer overrides in Megatron-Bridge's dotted keys, as Python values."""
    train_iters: int
    """Optimizer steps of the run."""
    save_dir: str
    """checkpoint.save: Megatron checkpoints land in `<save_dir>/iter_NNNNNNN`."""
    pretrained_checkpoint: str | None = None
    """checkpoint.pretrained_checkpoint: the imported Megatron checkpoint the run starts from."""
    dataset: str | None = None
    """`--dataset` preset (None: the recipe's own dataset block, changed only by overrides)."""
    env: dict[str, str] = dc_field(default_factory=dict)
    """Environment for every rank (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID)."""
    script: str = TRAIN_SCRIPT
    """The training entry (relative to the Megatron-Bridge checkout unless absolute)."""

    @property
    def generic(self) -> bool:
        """True when the recipe is another preset's, with the provider fields replaced."""
        return self.preset != self.base_preset

    def override_args(self) -> list[str]:
        """`key=value` arguments in order (later ones win in run_recipe.py)."""
        return override_args(self.overrides)

    def argv(self) -> list[str]:
        """One rank's entry: `python scripts/training/run_recipe.py --recipe ... key=value ...`
        (engines/launch/plans.py wraps it in torchrun / srun / a Job)."""
        head = ["python", self.script, "--recipe", self.recipe, "--mode", self.mode]
        if self.dataset is not None:
            head += ["--dataset", self.dataset]
        return head + self.override_args()

    def final_checkpoint(self) -> str:
        """The checkpoint of the last step (Megatron saves at the end whatever the interval)."""
        return os.path.join(self.save_dir, f"iter_{self.train_iters:07d}")


def _script(rel: str, launch: LaunchConfig, bridge_root: str | None, field: str) -> str:
    if bridge_root is not None:
        return os.path.join(bridge_root, rel)
    if launch.env.workdir is None:
        raise MegatronUnsupported(f"{field}.launch.env.workdir", "set it to the Megatron-Bridge checkout (e.g. "
                                  "/opt/Megatron-Bridge in the NeMo container): its scripts/ start the run")
    return rel


def plan_megatron(train: TrainConfig, launch: LaunchConfig, model: ModelConfig, *,
                  stage_mode: Literal["pretrain", "sft"], save_dir: str | os.PathLike,
                  pretrained_checkpoint: str | os.PathLike | None = None, lora: LoRAConfig | None = None,
                  normalization: Literal["token", "conversation"] = "token", seed: int = 1234,
                  data_seed: int | None = None, mlflow: MLflowTarget | None = None,
                  tokenizer: str | None = None, vocab_size: int | None = None, dataset: str | None = None,
                  blend: Sequence[tuple[str, float]] | None = None,
                  dataset_overrides: Mapping[str, Any] | None = None, bridge_root: str | None = None,
                  field: str = "stage") -> MegatronPlan:
    """Translate one stage (its TrainConfig view) into a MegatronPlan.

    stage_mode: pretrain (pretrain, long_context) or sft; an sft block with `lora` runs mode lora.
    save_dir: where the run writes its Megatron checkpoints (also checkpoint.load, so a retried
        launch resumes from its own last save).
    pretrained_checkpoint: the imported input checkpoint (`imported_checkpoint(...)`); required for
        sft and lora, optional for pretrain (random init without it).
    normalization: the SFT loss normalisation; `token` is Megatron's per-token loss.
    seed / data_seed: rng.seed and the dataset's seed (data_seed defaults to seed).
    mlflow: the stage's MLflow run, which the ranks log into.
    tokenizer: a HF tokenizer directory for the run (None: the recipe's, the model's Hub tokenizer), one
        the transformers Megatron-Bridge pins reads (see `_tokenizer_overrides`).
    vocab_size: the vocabulary of a preset that leaves it to the tokenizer (generic shapes only).
    dataset / blend / dataset_overrides: the data. Pretraining needs `blend` (indexed-dataset path
        prefixes and weights; `--dataset megatron-indexed`), else the recipe would train on mock data;
        sft needs `dataset` (a run_recipe.py preset such as local-jsonl) and its `dataset.*` keys.
    bridge_root: the Megatron-Bridge checkout, when the launch's working directory is not it.
    field: the recipe key path of the block, for errors (e.g. `stages.sft.stages[0]`).

    The parts below run in this order on purpose: the overrides keep it (later ones win in
    run_recipe.py, and the argv is compared as text), and so does which refusal a recipe with
    several problems hears first.
    """
    mode = _run_mode(stage_mode, lora, field)
    _refuse_untranslatable_training(train, stage_mode, normalization, field)
    preset, kwargs = model_shape(model)
    base = _base_preset(preset, kwargs)
    recipe = pick_recipe(base, mode, train.seq_length)
    _check_layout(train, launch, kwargs, stage_mode, field)
    steps = _step_counts(train, field)

    o = _parallelism_overrides(launch.parallel)
    if base != preset:
        o |= _provider_overrides(kwargs, vocab_size, "model")
    o |= _batch_overrides(train, steps)
    o |= _optimizer_overrides(train.optimizer)
    o |= _scheduler_overrides(train, steps, field)
    save = os.path.abspath(os.fspath(save_dir))
    pre = None if pretrained_checkpoint is None else os.path.abspath(os.fspath(pretrained_checkpoint))
    o |= _checkpoint_overrides(train, steps, save, pre, stage_mode, field)
    o |= _seed_overrides(seed, data_seed, stage_mode)
    if stage_mode == "sft":
        o |= _sft_packing_overrides(train, recipe, launch)
    if lora is not None:
        o |= _lora_overrides(lora, kwargs, f"{field}.lora")
    o |= _tokenizer_overrides(tokenizer)
    o |= _logger_overrides(train, mlflow)
    o |= _VALIDATION_OFF
    dataset = _dataset_preset(stage_mode, dataset, blend, field)
    if blend is not None:
        o |= _blend_overrides(blend)
    o |= _checked_dataset_overrides(dataset_overrides or {}, o, field)

    return MegatronPlan(recipe=recipe.name, mode=mode, preset=preset, base_preset=base, overrides=o,
                        train_iters=steps.train_iters, save_dir=save, pretrained_checkpoint=pre, dataset=dataset,
                        env=_mlflow_env(mlflow), script=_script(TRAIN_SCRIPT, launch, bridge_root, field))


def _run_mode(stage_mode: str, lora: LoRAConfig | None, field: str) -> Mode:
    """run_recipe.py's `--mode`: our two stage kinds, an SFT block with adapters being upstream's
    separate `lora` mode (it picks the PEFT recipe)."""
    if stage_mode not in ("pretrain", "sft"):
        raise ValueError(f"stage_mode must be 'pretrain' or 'sft', not {stage_mode!r}")
    if lora is not None and stage_mode != "sft":
        raise MegatronUnsupported(f"{field}.lora", "LoRA is an SFT setting")
    return "lora" if lora is not None else stage_mode


def _refuse_untranslatable_training(train: TrainConfig, stage_mode: str, normalization: str, field: str) -> None:
    """Refuse the training settings no upstream recipe can run as ours would, before anything is
    derived from them: fp32 (the recipes are bf16 mixed precision) and a per-conversation SFT loss."""
    if train.precision == "fp32":
        raise MegatronUnsupported(f"{field}.precision", "the Megatron-Bridge recipes train in bf16 mixed precision; "
                                  "use bf16 or auto")
    if stage_mode == "sft" and normalization != "token":
        raise MegatronUnsupported(f"{field}.normalization", "Megatron-Bridge normalises the SFT loss per token "
                                  "(calculate_per_token_loss) or per micro-batch, never per conversation; use token")


def _base_preset(preset: str | None, kwargs: Mapping[str, Any]) -> str:
    """Whose upstream recipes the run starts from: the network's own preset when upstream ships
    recipes for it, else GENERIC_BASE's for its kind (dense or MoE), its provider then replaced."""
    return preset if preset in RECIPES else GENERIC_BASE["moe" if _is_moe(kwargs) else "dense"]


def _check_layout(train: TrainConfig, launch: LaunchConfig, kwargs: Mapping[str, Any], stage_mode: str,
                  field: str) -> None:
    """Refuse a parallel layout or batch split Megatron cannot run, naming the field to change,
    rather than let the ranks fail at start-up: experts to shard, GPUs that divide ep x etp x pp,
    SFT's one pack per micro-batch, and a global batch that the data-parallel ranks split evenly."""
    par = launch.parallel
    dp = launch.data_parallel
    lf = f"{field}.launch.parallel"
    if par.ep > 1 and not _is_moe(kwargs):
        raise MegatronUnsupported(f"{lf}.ep", "the model has no experts; expert parallelism needs a MoE preset")
    if launch.gpus % (par.ep * (par.etp or 1) * par.pp):
        raise MegatronUnsupported(f"{lf}.ep", f"{launch.gpus} GPUs are not a multiple of ep * etp * pp = "
                                  f"{par.ep * (par.etp or 1) * par.pp}")
    if stage_mode == "sft" and train.micro_batch != 1:
        raise MegatronUnsupported(f"{field}.micro_batch", "Megatron-Bridge trains packed sequences with micro "
                                  "batch 1 (a pack of seq_length tokens is the micro-batch); set 1")
    if train.global_batch % (train.micro_batch * dp):
        raise MegatronUnsupported(f"{field}.global_batch", f"global_batch ({train.global_batch}) must be a multiple "
                                  f"of micro_batch x data-parallel size ({train.micro_batch} x {dp})")


@dataclass(frozen=True)
class _StepCounts:
    """The stage's token amounts in Megatron's unit, optimizer steps (rounded as `_steps` says)."""

    per_step: int
    """Tokens per step (seq_length x global_batch)."""
    train_iters: int
    """The budget: train.train_iters, also the decay length and the default save interval."""
    warmup_iters: int
    """scheduler.lr_warmup_iters."""
    save_interval: int
    """checkpoint.save_interval."""


def _step_counts(train: TrainConfig, field: str) -> _StepCounts:
    """Our token counts (budget, warmup, checkpoint interval) as steps, once, for every part that
    needs them; without checkpoint_every_tokens the run saves only at its end."""
    per_step = train.tokens_per_step
    iters = _steps(train.tokens, per_step, f"{field}.tokens", budget=True)
    warmup = _steps(train.schedule.warmup_tokens, per_step, f"{field}.schedule.warmup_tokens")
    every = train.checkpoint_every_tokens
    save_interval = iters if every is None else _steps(every, per_step, f"{field}.checkpoint_every_tokens")
    return _StepCounts(per_step=per_step, train_iters=iters, warmup_iters=warmup, save_interval=save_interval)


def _parallelism_overrides(par: Parallelism) -> dict[str, Any]:
    """`model.*` parallel sizes: every one set, since the recipes' own were tuned for their GPU
    count; etp and cp_comm_type only when given (None keeps the recipe's)."""
    o: dict[str, Any] = {
        "model.tensor_model_parallel_size": par.tp,
        "model.pipeline_model_parallel_size": par.pp,
        "model.context_parallel_size": par.cp,
        "model.expert_model_parallel_size": par.ep,
    }
    if par.etp is not None:
        o["model.expert_tensor_parallel_size"] = par.etp
    o["model.sequence_parallel"] = par.sequence_parallel
    if par.cp_comm_type is not None:
        o["model.cp_comm_type"] = par.cp_comm_type
    return o


def _batch_overrides(train: TrainConfig, steps: _StepCounts) -> dict[str, Any]:
    """Sequence length, run length and batch sizes: what fixes the tokens the run trains on."""
    return {
        "dataset.seq_length": train.seq_length,  # run_recipe.py copies it into model.seq_length
        "train.train_iters": steps.train_iters,
        "train.global_batch_size": train.global_batch,
        "train.micro_batch_size": train.micro_batch,
    }


def _optimizer_overrides(opt: OptimizerConfig) -> dict[str, Any]:
    """Our AdamW settings as Megatron's optimizer fields, as floats (the recipes' own values
    would otherwise stay)."""
    return {
        "optimizer.lr": float(opt.lr),
        "optimizer.min_lr": float(opt.min_lr),
        "optimizer.adam_beta1": float(opt.betas[0]),
        "optimizer.adam_beta2": float(opt.betas[1]),
        "optimizer.adam_eps": float(opt.eps),
        "optimizer.weight_decay": float(opt.weight_decay),
        "optimizer.clip_grad": float(opt.grad_clip),  # 0 disables clipping in both
    }


def _scheduler_overrides(train: TrainConfig, steps: _StepCounts, field: str) -> dict[str, Any]:
    """The learning-rate schedule (warmup from 0, then `_schedule`'s decay) and the weight decay.

    The scheduler, not the optimizer, sets the weight decay every step (start -> end): the
    recipes' own 0.033 would otherwise win over optimizer.weight_decay, so it is held constant."""
    wd = float(train.optimizer.weight_decay)
    return {
        "scheduler.lr_warmup_iters": steps.warmup_iters,
        "scheduler.lr_warmup_init": 0.0,
        **_schedule(train, steps.train_iters, steps.per_step, field),
        "scheduler.start_weight_decay": wd,
        "scheduler.end_weight_decay": wd,
        "scheduler.weight_decay_incr_style": "constant",
    }


def _checkpoint_overrides(train: TrainConfig, steps: _StepCounts, save: str, pre: str | None, stage_mode: str,
                          field: str) -> dict[str, Any]:
    """Where the run saves (and resumes from: load = save, so a retried launch continues), how
    often, how many it keeps, and the imported checkpoint it starts from, which SFT cannot do
    without."""
    o: dict[str, Any] = {"checkpoint.save": save, "checkpoint.load": save,
                         "checkpoint.save_interval": steps.save_interval}
    if train.keep_checkpoints is not None:
        o["checkpoint.most_recent_k"] = train.keep_checkpoints
    if pre is None and stage_mode == "sft":
        raise MegatronUnsupported(f"{field}", "an SFT run starts from the stage's input checkpoint: pass "
                                  "pretrained_checkpoint (the imported Megatron checkpoint)")
    if pre is not None:
        o["checkpoint.pretrained_checkpoint"] = pre
    return o


def _seed_overrides(seed: int, data_seed: int | None, stage_mode: str) -> dict[str, Any]:
    """The model's and the data's seeds; the dataset configs name theirs differently (SFT's
    `seed`, GPTDataset's `random_seed`)."""
    data_key = "dataset.seed" if stage_mode == "sft" else "dataset.random_seed"
    return {"rng.seed": seed, data_key: seed if data_seed is None else data_seed}


PACKING_SPECS = "megatron.bridge.data.packing.PackedSequenceSpecs"
"""Megatron-Bridge's offline-packing settings class (`dataset.offline_packing_specs`)."""


def _sft_packing_overrides(train: TrainConfig, recipe: UpstreamRecipe, launch: LaunchConfig) -> dict[str, Any]:
    """Our SFT rows are packs of seq_length tokens; Megatron packs offline to packed_sequence_size.
    Our loss is per token, which upstream pairs with not averaging in the collective (it sums).

    The specs are a `_target_` node, not a plain mapping: the `--dataset` presets (local-jsonl,
    tulu3) leave `offline_packing_specs` None, and omegaconf_utils' apply step sets a mapping over
    None as a plain dict, which ConfigContainer.validate() refuses (`'dict' object has no attribute
    'pad_cu_seqlens'`). A node naming its class is instantiated there (omegaconf_utils
    `_apply_overrides`), so the config holds a PackedSequenceSpecs straight out of the override
    processing. run_recipe.py would also turn a dict into one before training (recipe_runner's
    sync_offline_packing_alignment, which the verification card's dict text relies on), but that is
    script code outside the installed library; on a typed node the same sync changes nothing, since
    the size is the sequence length and the pad multiple already what it derives (`pad_multiple`)."""
    return {
        "dataset.enable_offline_packing": True,
        "dataset.offline_packing_specs": {"_target_": PACKING_SPECS, "packed_sequence_size": train.seq_length,
                                          "pad_seq_to_mult": pad_multiple(recipe.pad_seq_to_mult, launch)},
        "model.calculate_per_token_loss": True,
        "ddp.average_in_collective": False,
    }


def _lora_overrides(lora: LoRAConfig, kwargs: Mapping[str, Any], field: str) -> dict[str, Any]:
    """Our adapters as Megatron-Bridge's LoRA fields; its alpha is an integer, so a fractional one
    is refused rather than rounded.

    The keys are Hydra appends (`+peft.dim=8`): the PEFT recipe's LoRA object is callable (it
    transforms the model), and omegaconf_utils leaves callables out of the OmegaConf tree it applies
    overrides to, so a plain `peft.dim=8` finds no such key ("Could not override 'peft.dim'. To
    append to your config use +peft.dim=8"). The appended `peft` mapping is then applied field by
    field onto the recipe's own LoRA object, which omegaconf_utils puts back afterwards (a `_target_`
    node would build a new LoRA, only to be replaced by the recipe's when the callables are restored)."""
    o: dict[str, Any] = {"+peft.dim": lora.r}
    if float(lora.alpha) != int(lora.alpha):
        raise MegatronUnsupported(f"{field}.alpha", f"Megatron-Bridge's LoRA alpha is an integer "
                                  f"(got {lora.alpha})")
    o["+peft.alpha"] = int(lora.alpha)
    o["+peft.dropout"] = float(lora.dropout)  # both on the adapter's input ("pre")
    o["+peft.target_modules"] = lora_targets(lora.target_modules, kwargs, field)
    return o


def _tokenizer_overrides(tokenizer: str | None) -> dict[str, Any]:
    """The stage's own HF tokenizer directory, when given, in place of the recipe's Hub tokenizer.

    The run builds it with the transformers Megatron-Bridge pins (training/setup.py's build_tokenizer:
    AutoTokenizer.from_pretrained), which also reads a config.json in the directory and refuses ours
    (engines/megatron/hf_config.py): a stage passes a directory that release reads, the prepared
    tokenizer or hf_config.megatron_tokenizer_dir's copy, never a checkpoint directory of ours.

    The AutoTokenizer arguments become exactly `{use_fast: true}`, which takes two overrides, as the
    chat preprocessing does (chat_jsonl_overrides): set to null, then appended. In 0.6.2 the recipes'
    `hf_tokenizer_kwargs` is a struct-mode mapping whose keys are fixed: the 30B-A3B recipes (and the
    tiny shape, which runs them) leave it empty, so a plain `tokenizer.hf_tokenizer_kwargs={use_fast:true}`
    is refused ("Could not override 'tokenizer.hf_tokenizer_kwargs'. To append to your config use +..."),
    and the 4B recipes hold {revision, use_fast}, into which it merges, keeping the pinned Hub revision.
    Null, then `+` gives {use_fast: true} on both (checked through the release: test_real_plans.py)."""
    if tokenizer is None:
        return {}
    return {"tokenizer.tokenizer_type": "HuggingFaceTokenizer",
            "tokenizer.tokenizer_model": os.path.abspath(tokenizer),
            "tokenizer.hf_tokenizer_kwargs": None,  # drops the recipe's own (a pinned Hub revision)
            "+tokenizer.hf_tokenizer_kwargs": {"use_fast": True}}


def _logger_overrides(train: TrainConfig, mlflow: MLflowTarget | None) -> dict[str, Any]:
    """How often the ranks log, and into which MLflow run (the stage's own; see MLflowTarget and
    `_mlflow_env`, which makes them resume it)."""
    o: dict[str, Any] = {"logger.log_interval": train.monitor.log_every_steps}
    if mlflow is not None:
        o["logger.mlflow_tracking_uri"] = mlflow.tracking_uri
        o["logger.mlflow_experiment"] = mlflow.experiment
        o["logger.mlflow_run_name"] = mlflow.run_name
        o["logger.mlflow_log_artifacts"] = False  # checkpoints reach MLflow as the exported HF model only
    return o


def _mlflow_env(mlflow: MLflowTarget | None) -> dict[str, str]:
    """The ranks' environment: MLFLOW_RUN_ID makes mlflow's start_run resume the stage's run
    instead of creating one."""
    if mlflow is None:
        return {}
    return {"MLFLOW_TRACKING_URI": mlflow.tracking_uri, "MLFLOW_RUN_ID": mlflow.run_id}


_VALIDATION_OFF = {"validation.eval_interval": 0, "validation.eval_iters": 0}
"""Our stages evaluate on the exported HF checkpoint; the recipes' validation split would need a
validation set our data does not carry."""


def _dataset_preset(stage_mode: str, dataset: str | None, blend: Sequence[tuple[str, float]] | None,
                    field: str) -> str | None:
    """run_recipe.py's `--dataset` for the stage, refusing data the recipe would silently replace:
    pretraining reads `blend` through megatron-indexed (without it, mock data); SFT reads a named
    preset (without one, the recipe's Hub dataset)."""
    if dataset is not None and dataset not in DATASET_PRESETS:
        raise MegatronUnsupported(f"{field}", f"unknown Megatron-Bridge dataset preset {dataset!r} "
                                  f"(known: {', '.join(DATASET_PRESETS)})")
    if stage_mode == "pretrain":
        if blend is None:
            raise MegatronUnsupported(f"{field}", "pass blend (indexed-dataset path prefixes and weights); without "
                                      "it the recipe trains on mock data")
        if dataset not in (None, "megatron-indexed"):
            raise MegatronUnsupported(f"{field}", f"a pretraining blend is read by the megatron-indexed preset, "
                                      f"not {dataset!r}")
        return "megatron-indexed"
    if blend is not None:
        raise MegatronUnsupported(f"{field}", "blend is for pretraining; SFT data comes from `dataset`")
    if dataset is None:
        raise MegatronUnsupported(f"{field}", "pass dataset (e.g. local-jsonl with dataset.dataset_root): the "
                                  "recipe's own dataset is a Hub dataset, not the stage's conversations")
    return dataset


TRAIN_ONLY_SPLIT = "1,0,0"
"""`dataset.split` of every plan over our indexed data: every document of every prefix trains.

The megatron-indexed preset's own split is "9999,8,2" (recipes/utils/dataset_utils.py), for
validation and test splits our runs never evaluate (`_VALIDATION_OFF`): it holds the last ~0.1% of
each prefix's documents back from training, and a prefix of fewer than about 2,500 documents leaves
the test split none, where megatron-core's GPTDataset, asked for its 0 samples, counts epochs of 0
tokens forever (`_get_num_epochs`): the run hangs while building its data. A `blend` is read with
`split` (BlendedMegatronDatasetConfig.__post_init__, run by GPTDatasetConfig.finalize(), turns it into
`split_matrix`); "1,0,0" gives [(0, 1), None, None], so no validation or test dataset is built at
all. A string, so Hydra gets it quoted (`dataset.split="1,0,0"`; unquoted, `1,0,0` is a sweep)."""


def _blend_overrides(blend: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """A pretraining blend as GPTDataset's `dataset.blend` ([absolute path prefixes, float weights]),
    all of it the training split (TRAIN_ONLY_SPLIT)."""
    paths = [os.path.abspath(p) for p, _ in blend]
    return {"dataset.blend": [paths, [float(w) for _, w in blend]], "dataset.split": TRAIN_ONLY_SPLIT}


def _checked_dataset_overrides(extra: Mapping[str, Any], planned: Mapping[str, Any], field: str) -> dict[str, Any]:
    """The caller's own dataset keys (a preset's dataset_root, the chat preprocessing), which may
    only add `dataset.*` (or Hydra's `+dataset.*` appends): never change what the translation set."""
    for key in extra:
        if not key.removeprefix("+").startswith("dataset.") or key in planned:
            raise MegatronUnsupported(f"{field}", f"dataset_overrides may only add dataset.* keys (or Hydra's "
                                      f"+dataset.* appends) the translation does not set (got {key!r})")
    return dict(extra)


def _schedule(train: TrainConfig, iters: int, per_step: int, field: str) -> dict[str, Any]:
    """Our schedule kinds as Megatron's lr_decay_style (optimizer_param_scheduler: warmup from
    lr_warmup_init, then constant / cosine to min_lr over lr_decay_iters / WSD with its last
    lr_wsd_decay_iters decaying in lr_wsd_decay_style). Same formulas as model/schedules.py."""
    sched = train.schedule
    if sched.kind == "constant":
        return {"scheduler.lr_decay_style": "constant", "scheduler.lr_decay_iters": iters}
    if sched.kind == "cosine":
        return {"scheduler.lr_decay_style": "cosine", "scheduler.lr_decay_iters": iters}
    if sched.kind == "wsd":
        if sched.decay not in ("minus_sqrt", "linear", "cosine"):
            raise MegatronUnsupported(f"{field}.schedule.decay", f"no Megatron WSD decay style for {sched.decay!r}")
        if sched.decay_tokens is not None:
            d = _steps(min(sched.decay_tokens, train.tokens), per_step, f"{field}.schedule.decay_tokens")
        else:  # a fraction of the stage: the nearest whole step
            d = round(decay_tokens(sched, train.tokens) / per_step)
        if d == 0 and sched.decay_fraction > 0:
            d = 1
        return {"scheduler.lr_decay_style": "WSD", "scheduler.lr_decay_iters": iters,
                "scheduler.lr_wsd_decay_style": sched.decay, "scheduler.lr_wsd_decay_iters": d}
    raise MegatronUnsupported(f"{field}.schedule.kind", f"no Megatron-Bridge lr_decay_style for {sched.kind!r} "
                              "(translated: constant, cosine, wsd)")


def megatron_precision(precision: str) -> str:
    """A block's precision on Megatron-Bridge: its recipes train bf16 on GPUs whatever machine runs
    the flow, so `auto` is bf16 (fp32 stays, for plan_megatron to refuse naming the field)."""
    return "bf16" if precision == "auto" else precision


def pad_multiple(recipe_pad: int, launch: LaunchConfig) -> int:
    """The offline-packing pad multiple: the recipe's, raised to what CP (2 x cp) and sequence
    parallelism (tp x cp) need, exactly as run_recipe.py's sync_offline_packing_alignment does."""
    p = launch.parallel
    cp = 2 * p.cp if p.cp > 1 else 1
    sp = p.tp * p.cp if p.sequence_parallel and p.tp > 1 else 1
    return math.lcm(recipe_pad, cp, sp)


CHAT_PREPROCESSING = "megatron.bridge.data.sft_processing.ChatSFTPreprocessingConfig"
"""Megatron-Bridge's declarative chat preprocessing (rows of `messages`, rendered by the HF tokenizer's template)."""


def chat_jsonl_overrides(dataset_root: str | os.PathLike) -> dict[str, Any]:
    """`dataset.*` overrides that make `--dataset local-jsonl` read chat rows from `<dataset_root>/training.jsonl`.

    The local-jsonl preset (recipes/utils/dataset_utils.py `_local_jsonl_dataset_config`) reads
    prompt/completion columns; a multi-turn conversation with tool calls and a per-conversation
    reasoning switch is not a prompt and a completion, so its preprocessing is swapped for
    ChatSFTPreprocessingConfig (loss on every assistant turn). Under Hydra 1.3's struct mode a
    dict cannot be assigned over the existing dataclass node (the new `_target_` key is refused),
    and run_recipe.py rejects a bare `~key` deletion (every override must hold `=`), so the node is
    first set to null and then appended with `+` (omegaconf_utils then instantiates the `_target_`).
    Checked by running this text through Megatron-Bridge's own omegaconf_utils (hydra-core 1.3.2,
    OmegaConf 2.3) on a node of local-jsonl's shape: the result is ChatSFTPreprocessingConfig
    (loss_mode assistant); a plain assignment is refused, and `+` alone merges into the
    prompt/completion config and silently keeps it.
    Validation and test splits are off: the stage evaluates the exported checkpoint itself, and
    with them on the builder would look for validation.jsonl."""
    return {"dataset.dataset_root": os.path.abspath(os.fspath(dataset_root)),
            "dataset.preprocessing": None,
            "+dataset.preprocessing": {"_target_": CHAT_PREPROCESSING, "loss_mode": "assistant"},
            "dataset.do_validation": False, "dataset.do_test": False}


def plan_sft(sub: Any, launch: LaunchConfig, model: ModelConfig, **kw: Any) -> MegatronPlan:
    """plan_megatron for one SFT sub-stage (flows' SFTSubStage: a TrainConfig with `normalization`
    and `lora`)."""
    return plan_megatron(sub, launch, model, stage_mode="sft", lora=getattr(sub, "lora", None),
                         normalization=getattr(sub, "normalization", "token"), **kw)


def long_context_train_config(stage: Any, field: str = "stages.long_context") -> TrainConfig:
    """The TrainConfig of a long_context block (flows' LongContextStage) for Megatron-Bridge.

    A Megatron run has one sequence length, so the block's length mix must be a single length;
    a step is `global_batch_tokens` of it, a micro-batch `micro_batch_tokens` of it (at least one)."""
    lengths = [x.length for x in stage.data.lengths]
    if len(lengths) != 1:
        raise MegatronUnsupported(f"{field}.data.lengths", f"Megatron-Bridge trains one sequence length per run; "
                                  f"give a single length (got {lengths})")
    n = lengths[0]
    gb = stage.data.global_batch_tokens // n
    mb = max(1, stage.data.micro_batch_tokens // n)
    if gb % mb:
        raise MegatronUnsupported(f"{field}.data.micro_batch_tokens", f"{mb} sequences per micro-batch do not "
                                  f"divide the {gb} of a step")
    return TrainConfig(tokens=stage.tokens, seq_length=n, global_batch=gb, micro_batch=mb, optimizer=stage.optimizer,
                       schedule=stage.schedule, precision=stage.precision, lb_loss_coeff=stage.lb_loss_coeff,
                       checkpoint_every_tokens=stage.checkpoint_every_tokens, monitor=stage.monitor)


def plan_long_context(stage: Any, launch: LaunchConfig, model: ModelConfig, **kw: Any) -> MegatronPlan:
    """plan_megatron for a long_context block: continued pretraining at its one length."""
    kw.setdefault("field", "stages.long_context")
    return plan_megatron(long_context_train_config(stage, kw["field"]), launch, model, stage_mode="pretrain", **kw)


# ---------------------------------------------------------------------------------------------
# checkpoints through the HF bridge


def imported_checkpoint(megatron_dir: str | os.PathLike) -> str:
    """Where `import_argv` leaves the checkpoint a run starts from (`--pretrained_checkpoint` in the
    verified cards points at this iter_0000000)."""
    return os.path.join(os.path.abspath(os.fspath(megatron_dir)), "iter_0000000")


def import_argv(hf_dir: str | os.PathLike, megatron_dir: str | os.PathLike, *, bridge_root: str | None = None,
                hf_revision: str | None = None) -> list[str]:
    """HF -> Megatron before the stage: the conversion worker, CPU backend (one process, any TP of the
    run loads the result: it is a distributed checkpoint). `--overwrite` makes a retried stage idempotent."""
    hf, meg = os.path.abspath(os.fspath(hf_dir)), os.path.abspath(os.fspath(megatron_dir))
    argv = ["python", _root(CONVERT_SCRIPT, bridge_root), "import", "--device", "cpu", "--hf-model", hf,
            "--megatron-path", meg, "--torch-dtype", "bfloat16", "--overwrite"]
    return argv + (["--hf-revision", hf_revision] if hf_revision else [])


def export_argv(plan: MegatronPlan, hf_template: str | os.PathLike, out_dir: str | os.PathLike, *,
                bridge_root: str | None = None) -> list[str]:
    """Megatron -> HF after the stage, from the run's last checkpoint into `out_dir`.

    hf_template: an HF directory whose config and tokenizer the export takes (the stage's input
    checkpoint; for pretraining from a preset, a directory with the preset's config and the tokenizer).
    A LoRA run saves adapters only, so it goes through examples/peft/merge_lora.py, which merges them
    into the base (the imported checkpoint) and writes plain HF weights, as our LoRA stages hand on."""
    tmpl, out = os.path.abspath(os.fspath(hf_template)), os.path.abspath(os.fspath(out_dir))
    if plan.mode == "lora":
        if plan.pretrained_checkpoint is None:
            raise ValueError("a LoRA plan has no base checkpoint to merge into")
        return ["python", _root(MERGE_LORA_SCRIPT, bridge_root), "--lora-checkpoint", plan.final_checkpoint(),
                "--hf-model-path", tmpl, "--output", out, "--pretrained", plan.pretrained_checkpoint, "--cpu"]
    return ["python", _root(CONVERT_SCRIPT, bridge_root), "export", "--device", "cpu", "--hf-model", tmpl,
            "--megatron-path", plan.final_checkpoint(), "--hf-path", out, "--torch-dtype", "bfloat16", "--overwrite"]


def _root(rel: str, bridge_root: str | None) -> str:
    return rel if bridge_root is None else os.path.join(bridge_root, rel)
