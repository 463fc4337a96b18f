"""What the recipe doctor knows beyond the recipe: the model's size, the data's size, the metrics logged.

Each fact is computed once per diagnosis, only when a rule asks for it, and only from what
exists without doing any work:
- the model is built on the meta device (model/inspect.py: exact parameter counts, ~50 ms even
  for 30B; torch and transformers are imported then, which takes a few seconds);
- the data's size is read from the prepared data of the recipe's inputs under its workdir, when
  `stagewise data prepare` or an earlier run built it (data/prepare.py find_prepared hashes the
  sources to find it; nothing is generated or tokenized here). A recipe never prepared has no
  data facts and the rules that need them stay silent (they say so in their docstrings);
- the metric names a gated stage's evaluations log come from its block (`gate_metrics`: validation,
  held-out conversations, eval/metric_names.py) and the local lm-eval task YAMLs (eval/harness.py
  local_metric_names);
- what each stage trains (its stretches: LR, warmup, gate) is what its recipe block declares
  (`stretches`, recipe/blocks/contract.py), so no rule lists stage names to find them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stagewise.data.errors import BadInput

if TYPE_CHECKING:
    from stagewise.recipe import LoadedRecipe, Recipe
    from stagewise.recipe.blocks.contract import Stretch

TRAINING_PREFIXES = ("train/", "moe/", "act/", "data/", "tokens_seen")
"""Names logged by training itself at every step (model/trainer.py: `train/<objective term>`, lr,
tokens/s, MFU; the MoE and activation monitors; the data steps): which exist depends on the
objective and the model, so a gate may name them and the doctor does not judge them."""


@dataclass(frozen=True)
class ModelFacts:
    """The network a recipe builds, as the rules need it."""

    params: int
    """Every parameter (all experts resident), counted as `stagewise inspect` counts them."""
    moe: bool
    """Whether any layer is a routed mixture of experts."""
    tied_embeddings: bool
    """Whether the output layer is the input embedding (quantizing one quantizes the other)."""


@dataclass(frozen=True)
class DataFacts:
    """The prepared pretraining data matching the recipe."""

    root: Path
    """The prepared data directory (`<workdir>/data/<digest>`)."""
    train_tokens: dict[str, int]
    """Training tokens per source (the validation split left out)."""

    @property
    def total(self) -> int:
        return sum(self.train_tokens.values())


class Facts:
    """The recipe and what can be known about it without work; each fact computed at first use."""

    def __init__(self, loaded: LoadedRecipe, stages: Sequence[str] | None = None):
        self.loaded = loaded
        self.recipe: Recipe = loaded.recipe
        self.stages = stages
        """The stages that will run (None: every stage of the recipe)."""

    def runs(self, stage: str) -> bool:
        """Whether `stage` is in the recipe and among the stages that will run."""
        return getattr(self.recipe.stages, stage) is not None and (self.stages is None or stage in self.stages)

    @cached_property
    def stretches(self) -> list[tuple[str, Stretch]]:
        """(stage, stretch) of every stretch the recipe trains, in pipeline order: each present block's
        `stretches` (recipe/blocks/contract.py; merge and quantize train none)."""
        from stagewise.recipe.schema import STAGE_ORDER  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

        blocks = [(name, getattr(self.recipe.stages, name)) for name in STAGE_ORDER]
        return [(name, s) for name, block in blocks if block is not None for s in block.stretches(f"stages.{name}")]

    @cached_property
    def model(self) -> ModelFacts | None:
        """None when the model cannot be built here (e.g. `model.from` a checkpoint not made yet)."""
        try:
            from stagewise.model.inspect import inspect_model  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

            report = inspect_model(self.recipe.model, self._vocab, seq_length=1, micro_batch=1)
        except (BadInput, OSError, ValueError, TypeError):  # a model that cannot be built: no model facts
            return None
        tied = bool(self._meta.config.tie_word_embeddings) if self._meta is not None else False
        return ModelFacts(report.total_params, any(r.kind == "moe" for r in report.layers), tied)

    @property
    def _vocab(self) -> int | None:
        """The vocabulary the network is built for: tokenizer.vocab_size sizes the BPE trained for a preset;
        a `model.from` checkpoint has its own (its config's; a bigger recipe value would read as a mismatch
        and hide every model fact)."""
        return None if self.recipe.model.from_ is not None else self.recipe.tokenizer.vocab_size

    @cached_property
    def _meta(self) -> Any:
        try:
            from stagewise.model.inspect import meta_model  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

            return meta_model(self.recipe.model, self._vocab)
        except (BadInput, OSError, ValueError, TypeError):  # a model that cannot be built: no model facts
            return None

    @cached_property
    def operators(self) -> list | None:
        """The quantizable operators (quant/operators.py) of the meta-device model; None: no model."""
        from stagewise.quant.operators import operators  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

        return operators(self._meta) if self._meta is not None else None

    @cached_property
    def data(self) -> DataFacts | None:
        """The prepared data of the recipe's inputs under its workdir, if `prepare_data` has built it
        (data/prepare.py find_prepared: the sources are hashed, nothing is generated or tokenized)."""
        from stagewise.data.prepare import find_prepared  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

        r = self.recipe
        try:
            found = find_prepared(r.data, r.tokenizer, Path(r.workdir), r.seed, self.loaded.base_dir)
        except (BadInput, OSError, ValueError):  # a source not there yet: no prepared data either
            return None
        if found is None:
            return None
        return DataFacts(found.root, {name: src.train_tokens for name, src in found.sources.items()})

    def gate_metrics(self, stage: str, suite: str | None) -> tuple[set[str], list[str]]:
        """(every eval name a gated stage logs at its marks, the suite's tasks whose names only lm-eval
        knows): what its block says its evaluations log there (`gate_metrics`: pretraining's validation
        loss, SFT's held-out conversations' dev split) and the gate's suite."""
        from stagewise.eval.harness import local_metric_names  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)
        from stagewise.eval.metric_names import SUITE_PREFIX  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

        r = self.recipe
        names = getattr(r.stages, stage).gate_metrics(r)
        local, outside = local_metric_names(r.eval.get(suite or "", []))
        return names | {f"{SUITE_PREFIX}/{n}" for n in local}, outside
