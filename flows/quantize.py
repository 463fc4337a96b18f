"""The quantize stage: per-operator NVFP4 / FP8 / BF16 under a budget, a deployable export, its accuracy cost.

    quantize_flow
      ├─ prepare-data / sft-world   the validation text (calibration, validation loss) and the
      │                             held-out conversations, reused from the run (Cached)
      └─ quantize                   BF16 scores -> plan (AutoQuantize scores + our knapsack, or the
                                    Ultra heuristic) -> quantize + calibrate -> HF export ->
                                    reload the export with our loader -> the same scores

It runs after the last training stage and starts from the checkpoint handed on (else
`model.from`). What it hands on is the export directory: a unified Hugging Face checkpoint with
its quantization config, which vLLM / TensorRT-LLM deploy on a GPU and quant/load.py reloads on
any device (the scores after are the reloaded export's, i.e. what ships). MLflow: one run
`quantize` with `quant/effective_bits` (over the searched operators), `quant/effective_bits_all`,
`quant/recounted_bits` (from the export's files), `quant/{bf16,quantized,delta}/<score>`,
`quant/{weight,flop}_share/<format>`, `quant/operators/<format>`, `quant/seconds/<phase>`; the
report `quant/report.json` and charts `reports/quant_formats.png`, `reports/quant_before_after.png`.
The export is registered with the alias `quantize`; the closing table's row is held-out exact
match BF16 -> quantized, with the effective bits. A content-addressed step: an unchanged recipe
reuses it.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel
from transformers import AutoTokenizer

from stagewise.data.chat import prompt_key
from stagewise.data.config import WORLD_FACTS, DataConfig, TokenizerConfig
from stagewise.data.digest import file_sha256 as file_hash
from stagewise.data.errors import BadInput
from stagewise.data.sft_config import SFTWorldConfig
from stagewise.data.sources import resolve_path
from stagewise.eval.heldout import read_conversations
from stagewise.eval.intervals import gain_fields
from stagewise.eval.plots import before_after_plot, quant_formats_plot
from stagewise.eval.scoring import Scoring
from stagewise.eval.splits import split_rows
from stagewise.eval.validation import val_streams
from stagewise.flows.stage import (
    Stage,
    StageContext,
    Upstream,
    checkpoint_hash,
    finish,
    reused_result,
    stage_run,
    start_checkpoint,
)
from stagewise.quant.calibration import stream_batches, text_batches
from stagewise.quant.report import summary_lines
from stagewise.recipe import Recipe
from stagewise.recipe.blocks.quantize import QuantizeStage
from stagewise.refs import StageResult, StageSummary
from stagewise.store.policy import run_logger
from stagewise.store.steps import step_dir, value_of
from stagewise.tasks.data import prepare_data_task
from stagewise.tasks.quantize import quantize_checkpoint
from stagewise.tasks.sft_data import sft_world_task

STAGE = "quantize"
TARGET = "quant/test/exact_match"
QUANT_VERSION = 1
"""Bump when what a plan or a score means changes: finished quantize steps then rerun."""


class QuantizeInputs(BaseModel):
    """What quantizing reads from the recipe: its block, where to start without an upstream stage,
    the data (its validation text), the SFT world (held-out conversations) and the eval suites."""

    stage: QuantizeStage
    model_from: str | None = None
    data: DataConfig
    tokenizer: TokenizerConfig
    sft_world: SFTWorldConfig | None = None
    world_entities: int = WORLD_FACTS
    suites: dict[str, list[str]] = {}


def select(recipe: Recipe) -> QuantizeInputs | None:
    if recipe.stages.quantize is None:
        return None
    sft = recipe.stages.sft
    world = recipe.data.world
    return QuantizeInputs(stage=recipe.stages.quantize, model_from=recipe.model.from_, data=recipe.data,
                          tokenizer=validation_tokenizer(recipe), sft_world=sft.data.world if sft else None,
                          world_entities=world.facts if world else WORLD_FACTS, suites=recipe.eval)


def validation_tokenizer(recipe: Recipe) -> TokenizerConfig:
    """The tokenizer the validation text is prepared with: the recipe's, except in a recipe that trains
    none (no stages.pretrain, tokenizer.path unset) and starts from `model.from`: then that checkpoint's
    own, the only vocabulary its descendants read (a BPE trained for the recipe would not be theirs,
    and validation_streams refuses it)."""
    tok = recipe.tokenizer
    if recipe.stages.pretrain is not None or tok.path is not None or recipe.model.from_ is None:
        return tok
    return tok.model_copy(update={"path": str(Path(recipe.model.from_).expanduser().resolve())})


def data_root(block: QuantizeInputs, upstream: Upstream, workdir: str, seed: int, base_dir: str,
              prepare=None) -> str:
    """The prepared data whose validation text calibrates and scores: this run's pretraining data, else
    prepared now (content-hashed: reused when it exists). `prepare` is the task (the CLI passes its `.fn`)."""
    pretrain = upstream.of("pretrain")
    if pretrain and pretrain.data_root:
        return pretrain.data_root
    return value_of((prepare or prepare_data_task)(block.data, block.tokenizer, workdir, seed, base_dir)).root


def heldout_path(block: QuantizeInputs, workdir: str, seed: int, base_dir: str, world=None) -> str | None:
    """The held-out conversations: `heldout`, else the SFT world's (generated once per seed, else reused)."""
    world_dir = None
    if block.sft_world is not None and (block.stage.heldout is None or block.stage.heldout.startswith("@world/")):
        world_dir = value_of((world or sft_world_task)(block.sft_world, block.sft_world.entities or block.world_entities,
                                                       seed, workdir))
    path = block.stage.heldout or ("@world/sft_eval.jsonl" if world_dir else None)
    return str(resolve_path(path, base_dir, world_dir)) if path else None


def quantize_spec(block: QuantizeInputs, seed: int) -> dict:
    """What determines the outcome besides its inputs (start weights, calibration and held-out data)."""
    return {"stage": block.stage.model_dump(mode="json", exclude={"launch"}), "seed": seed, "version": QUANT_VERSION,
            "suite": block.suites.get(block.stage.eval_suite or "")}


@flow(name="quantize")
def quantize_flow(ctx: StageContext, block: QuantizeInputs, upstream: Upstream | None = None) -> StageResult:
    """Quantize the checkpoint handed on (else `model.from`) per `stages.quantize` and export it."""

    upstream = upstream or Upstream()
    stage, tracker = block.stage, ctx.tracker
    start_from = start_checkpoint(upstream, block.model_from)
    with stage_run(ctx, STAGE, {"stagewise.start_checkpoint": start_from}) as run_id:
        root = data_root(block, upstream, ctx.workdir, ctx.seed, ctx.base_dir)
        calib = str(resolve_path(stage.calib, ctx.base_dir, None)) if stage.calib else None
        heldout = heldout_path(block, ctx.workdir, ctx.seed, ctx.base_dir)
        inputs = [checkpoint_hash(start_from), Path(root).name, file_hash(calib) if calib else "-",
                  file_hash(heldout) if heldout else "-"]
        out_dir = step_dir(ctx.stages_root, STAGE, quantize_spec(block, ctx.seed), inputs)
        reused = reused_result(ctx, STAGE, run_id, out_dir)
        if reused is not None:
            return reused
        batches, scoring = inputs_for(stage, start_from, root, calib, heldout, block.suites, ctx.seed)
        report = quantize_checkpoint(start_from, stage, batches, scoring, str(out_dir / "export"),
                                     ctx.runtime.device, export_meta(start_from, ctx.recipe_hash))
        logged = log_report(tracker, run_id, report)
        _check_drop(stage.max_drop, report)
        items = report["items"]
        summary = StageSummary(metric=TARGET, before=report["bf16"].get("test/exact_match"),
                               after=report["quantized"].get("test/exact_match"), higher_is_better=True,
                               note=f"{report['effective_bits']:.2f} effective bits",
                               **gain_fields(items["bf16"].get("test/exact_match"),
                                             items["quantized"].get("test/exact_match"), True, stage.max_drop))
        result = StageResult(stage=STAGE, checkpoint=report["export"], run_id=run_id, parent=start_from,
                             metrics={k.removeprefix("quant/"): v for k, v in logged.items()},
                             stage_dir=str(out_dir), summary=summary)
        return finish(ctx, out_dir, result, logged)


def inputs_for(stage: QuantizeStage, start: str, root: str, calib: str | None, heldout: str | None,
               suites: dict[str, list[str]], seed: int) -> tuple[list[dict], Scoring]:
    """The calibration batches and what both models are scored on (the stage and the CLI alike): the
    held-out conversations' test split under the recipe's `seed` (eval/splits.py)."""
    streams = validation_streams(root, start)
    n = max(stage.calib_batches, stage.score_batches)
    batches = (text_batches(calib, AutoTokenizer.from_pretrained(start), n, stage.batch_size, stage.seq_length)
               if calib else stream_batches(streams, n, stage.batch_size, stage.seq_length))
    scoring = Scoring(streams=streams, seq_length=stage.seq_length, val_tokens=stage.val_tokens,
                      heldout=split_rows(read_conversations(heldout), prompt_key, seed)["test"] if heldout else [],
                      heldout_limit=stage.heldout_limit,
                      suite=suites.get(stage.eval_suite, []) if stage.eval_suite else [], suite_limit=stage.eval_limit)
    return batches, scoring


def validation_streams(root: str, start: str) -> dict:
    """The prepared data's validation streams, after checking they are in the checkpoint's vocabulary."""
    theirs = AutoTokenizer.from_pretrained(str(Path(root) / "tokenizer")).get_vocab()
    ours = AutoTokenizer.from_pretrained(start).get_vocab()
    if any(ours.get(t) != i for t, i in theirs.items()):
        raise BadInput(f"stages.quantize.calib: the recipe's data is tokenized with another vocabulary than {start}'s; "
                       "give a calibration text file (calib: FILE, or --calib) instead")
    return val_streams(Path(root))


def export_meta(start: str, recipe_hash: str) -> dict:
    """The export's stagewise.json: a checkpoint of the pipeline whose parent is the one quantized."""
    return {"stage": STAGE, "step": 0, "tokens_seen": 0, "recipe_hash": recipe_hash, "parent": start,
            "extra": {"quantized": True}}


def log_report(tracker, run_id: str, report: dict) -> dict[str, float]:
    """The report's numbers as `quant/...` metrics, its JSON and its two charts; the lines a person reads."""
    logged = {"quant/effective_bits": report["effective_bits"], "quant/effective_bits_all": report["effective_bits_all"],
              "quant/recounted_bits": report["recounted_bits"]}
    for side in ("bf16", "quantized"):
        logged |= {f"quant/{side}/{k}": v for k, v in report[side].items()}
    logged |= {f"quant/delta/{k}": v for k, v in report["deltas"].items()}
    logged |= {f"quant/flop_share/{f}": v for f, v in report["flop_share"].items()}
    logged |= {f"quant/weight_share/{f}": v for f, v in report["weight_share"].items()}
    for fmt in report["formats"].values():
        logged[f"quant/operators/{fmt}"] = logged.get(f"quant/operators/{fmt}", 0) + 1
    logged |= {f"quant/seconds/{k}": v for k, v in report["seconds"].items()}
    tracker.log_metrics(run_id, [(0, 0, logged)])
    tracker.set_tags(run_id, {"stagewise.quant_method": report["method"], "stagewise.quant_device": report["device"]})
    tracker.log_json(run_id, report, "quant/report.json")
    tracker.log_figure(run_id, quant_formats_plot(report), "reports/quant_formats.png")
    tracker.log_figure(run_id, before_after_plot(report["bf16"], report["quantized"], "BF16 vs quantized (reloaded export)"),
                       "reports/quant_before_after.png")
    for line in summary_lines(report):
        run_logger().info("quantize: %s", line)
    return logged


class QuantizationDrop(RuntimeError):
    """The quantized model lost more held-out exact match than `max_drop` allows."""


def _check_drop(max_drop: float | None, report: dict) -> None:
    delta = report["deltas"].get("test/exact_match")
    if max_drop is not None and delta is not None and -delta > max_drop:
        raise QuantizationDrop(f"quantize: held-out exact match dropped by {-delta:.4f} (> max_drop {max_drop}); "
                               f"the export is in {report['export']}, its report in MLflow")


STAGE_ENTRY = Stage(name=STAGE, flow=quantize_flow, select=select, start="handed_on", hands_on="export",
                    reads=lambda block: ("pretrain",))  # its prepared data, when it ran: calibration text
