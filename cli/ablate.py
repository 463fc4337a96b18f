"""`stagewise ablate`: test a data or recipe change in isolation, on a small budget.

Every variant is checked (flows/ablate_plan.py, then the recipe doctor on the ablated stage)
before Prefect is imported, so a bad override exits 2 naming the variant and the field; then flows/ablate.py runs the stage once per
variant under one MLflow parent run and prints the comparison table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, RecipeArg, SetOpt, VerboseOpt
from stagewise.cli.output import debugging, emit, guarded


@guarded
def ablate_cmd(
    recipe: Path = RecipeArg,
    stage: str = typer.Option(..., "--stage", help="The stage to run per variant (pretrain, sft, rl, distill or quantize).",
                              show_default=False),
    variant: list[str] = typer.Option(
        ..., "--variant", "-v", metavar="NAME[:KEY=VALUE]",
        help="A variant: a name, optionally with one --set override; repeat a name to give it more overrides. "
             "A name with no override is the recipe as it is (the baseline). At least two names.",
        show_default=False),
    budget: float = typer.Option(0.25, "--budget", help="Fraction of the stage's tokens (or RL/distillation steps) each "
                                 "variant trains; 1 for the recipe's own. A variant's overrides win over it."),
    parallel: int = typer.Option(1, "--parallel", min=1, help="Variants trained at once after the first (Prefect task "
                                 "concurrency). On a CPU, 1: two trainings share the same cores."),
    start: Optional[Path] = typer.Option(None, "--from", help="Checkpoint every variant starts from (default: model.from)."),
    force: bool = typer.Option(False, "--force", help="Run even when the recipe doctor finds errors in a variant."),
    overrides: list[str] = SetOpt,
    verbose: bool = VerboseOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run one stage once per variant from the same start, each its own MLflow run, and compare them.

    The variants' runs are nested under one MLflow run `ablate-<stage>` (tag stagewise.variant),
    which keeps the comparison as reports/ablation.{json,txt,png}: a row per score of the stage's
    evaluation, a column per variant, the best marked. --set applies to every variant.

    \b
    Example: SFT with vs without the format domain, at a quarter of the tokens
      stagewise ablate recipes/tiny.yaml --stage sft --from runs/tiny/stages/pretrain-*/step-00000360 \\
        --variant with_format \\
        --variant no_format:stages.sft.stages[0].blend.weights.format=0 \\
        --variant no_format:stages.sft.stages[1].blend.weights.format=0
    """
    from stagewise.cli.run_log import quiet_libraries, start_run_log

    quiet_libraries(verbose)  # before torch, transformers and Prefect are imported
    from stagewise.cli.run import doctor
    from stagewise.flows.ablate_plan import plan_ablation

    plan = plan_ablation(recipe, stage, variant, overrides, budget, str(start) if start else None)
    for v in plan.variants:  # the recipe doctor on each variant's stage, before anything trains
        doctor(plan.loaded[v.name], [stage], force, f"variant {v.name}: ")
    from stagewise.flows.ablate import run_ablation

    first = plan.loaded[plan.variants[0].name].recipe
    result = run_ablation(plan, parallel, on_start=lambda: start_run_log(first.workdir, verbose, debugging(debug)))

    def text() -> None:
        from stagewise.eval.ablation import render_text

        typer.echo(f"\nAblation of {stage} ({len(plan.variants)} variants at {budget:g} of the budget):")
        for v in result["variants"]:
            how = "reused" if v["reused"] else f"{v['seconds']} s" if v["seconds"] is not None else ""
            typer.echo(f"  {v['name']:<16} MLflow run {v['run_id']}  {how}")
        typer.echo("\n" + render_text(result["comparison"]))
        typer.echo(f"\nMLflow {result['tracking_uri']}: run {result['run_id']} (experiment '{result['experiment']}'), "
                   "reports/ablation.{json,txt,png}")

    emit(result, as_json, text)
