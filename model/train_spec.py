"""What a training stretch needs, and the one way to build its Trainer.

A stage's training is described by a TrainSpec (model, train config, the data it reads, the
objective that goes with that data, where checkpoints go) and nothing else of the recipe; the
Prefect task that trains a stretch (tasks/train.py) builds from it. The data
a stage reads is one of a few kinds (token shards with a phase blend, long-context shards, or
packed conversations); the objective goes with it. `make_trainer` is where every Trainer is made,
including RL's and distillation's over their own rollout batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from stagewise.data.config import PhaseConfig
from stagewise.data.loader import PretrainBatches
from stagewise.data.long_context import LongContextBatches
from stagewise.data.long_context_config import LongContextDataConfig
from stagewise.data.prepare import PreparedData
from stagewise.data.sft_packs import PackedBatches, load_packed
from stagewise.data.shards import TokenShard
from stagewise.model.build import build_model
from stagewise.model.config import LoRAConfig, ModelConfig, TrainConfig
from stagewise.model.lora import apply_lora, lora_trainer_class
from stagewise.model.objectives.lm import LMObjective
from stagewise.model.objectives.sft import SFTObjective
from stagewise.model.trainer import Trainer
from stagewise.refs import PreparedRef


class ShardData(BaseModel):
    """Pretraining data: prepared token shards read through a phase blend."""

    kind: Literal["shards"] = "shards"
    prepared: PreparedRef
    phases: list[PhaseConfig]
    max_epochs: dict[str, float]


class PackedData(BaseModel):
    """SFT data: conversations rendered and packed into rows (an .npz of data/sft_packs.py)."""

    kind: Literal["packed"] = "packed"
    rows: str
    tokenizer_dir: str
    max_epochs: float | None = None


class LongContextData(BaseModel):
    """Long-context data: token shards per source, a length mix and a token blend."""

    kind: Literal["long_context"] = "long_context"
    shards: dict[str, str]
    config: LongContextDataConfig
    blend: dict[str, float]
    tokenizer_dir: str


class TrainSpec(BaseModel):
    """Everything a training task needs, and nothing else of the recipe."""

    stage: str
    model: ModelConfig
    train: TrainConfig
    data: Annotated[Union[ShardData, PackedData, LongContextData], Field(discriminator="kind")]
    objective: Literal["lm", "sft_token", "sft_conversation"] = "lm"
    out_dir: str
    seed: int
    recipe_hash: str
    parent: str | None = None
    """The checkpoint this stage starts from (recorded as the first checkpoint's parent)."""
    device: str = "cpu"
    lora: LoRAConfig | None = None
    """Train LoRA adapters on the model (model/lora.py); every checkpoint is saved merged."""


def tokenizer_dir(spec: TrainSpec) -> Path:
    """Where the stage's tokenizer lives (copied into every checkpoint)."""
    if isinstance(spec.data, ShardData):
        return Path(PreparedData.load(Path(spec.data.prepared.root)).tokenizer_dir)
    return Path(spec.data.tokenizer_dir)


def _batches(spec: TrainSpec, on_warning):
    if isinstance(spec.data, ShardData):
        prepared = PreparedData.load(Path(spec.data.prepared.root))
        t = spec.train
        return PretrainBatches(prepared, spec.data.phases, spec.data.max_epochs, t.seq_length, t.global_batch,
                               t.tokens, spec.seed, on_warning=on_warning)
    if isinstance(spec.data, LongContextData):
        shards = {name: TokenShard.open(Path(path)) for name, path in spec.data.shards.items()}
        return LongContextBatches(shards, spec.data.config, spec.data.blend, spec.seed)
    return PackedBatches(load_packed(spec.data.rows), spec.train.global_batch, seed=spec.seed,
                         max_epochs=spec.data.max_epochs)


def _objective(spec: TrainSpec):
    if spec.objective == "lm":
        return LMObjective(spec.train.lb_loss_coeff)
    return SFTObjective(spec.objective.removeprefix("sft_"), spec.train.lb_loss_coeff)


def build_trainer(spec: TrainSpec, log=None, on_warning=None, progress: bool = True):
    """The stage's Trainer and its batch source, fresh (call `.resume(ckpt)` to continue)."""
    tok_dir = tokenizer_dir(spec)
    vocab = len(AutoTokenizer.from_pretrained(str(tok_dir)))
    model = build_model(spec.model, vocab_size=vocab, seed=spec.seed, device=spec.device)
    batches = _batches(spec, on_warning)
    trainer = make_trainer(model, spec.train, batches, _objective(spec), out_dir=spec.out_dir, stage=spec.stage,
                           tokenizer_dir=tok_dir, recipe_hash=spec.recipe_hash, log=log, device=spec.device,
                           progress=progress, parent=spec.parent, lora=spec.lora, seed=spec.seed)
    return trainer, batches


def make_trainer(model, train: TrainConfig, batches, objective, *, out_dir: str | Path, stage: str,
                 tokenizer_dir: str | Path | None, recipe_hash: str, log=None, device: str = "cpu",
                 progress: bool = True, parent: str | Path | None = None, lora: LoRAConfig | None = None,
                 seed: int = 0) -> Trainer:
    """The one way a stage gets its Trainer: over a model and batch source it already has (RL and
    distillation bring a loaded policy and their rollout batches; `build_trainer` builds both from
    a TrainSpec). With `lora`, the model is wrapped in adapters and every checkpoint saved merged."""
    trainer_class = Trainer
    if lora is not None:
        model = apply_lora(model, lora.r, lora.alpha, lora.target_modules, lora.dropout, seed=seed)
        trainer_class = lora_trainer_class()
    return trainer_class(model, train, batches, objective, out_dir=Path(out_dir), stage=stage,
                         tokenizer_dir=tokenizer_dir, recipe_hash=recipe_hash, log=log, device=device,
                         progress=progress, parent=parent)
