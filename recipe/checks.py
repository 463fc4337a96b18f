"""Cross-field checks of a recipe: the rules that span more than one library's config.

Each library validates its own block (model.config, data.config, ...); what spans blocks lives
here so each problem can name the exact YAML path that breaks it: phases and the tokenizer
naming known sources, schedules fitting the stage's tokens, eval suites existing (and their
standard tasks having their files), SFT sources/blends/sub-stages agreeing, merging having
checkpoints to merge, presets existing.
Every check returns (yaml path, why, path whose line to cite) tuples. The loader
(recipe/loader.py) runs cross_problems() once the recipe validates, and next to it the engine
checks (engines/checks.py); when the whole does not validate it runs partial_cross_problems() on
the parts that validate alone, so one bad field hides no other problem.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from stagewise.data.config import WORLD_PREFIX, PhaseConfig, TokenizerConfig
from stagewise.data.reasoning_switch import SWITCH_FIELD, NoSwitch
from stagewise.data.sft_config import SFTDataConfig
from stagewise.eval.environments import ENVIRONMENTS
from stagewise.eval.harness import suite_problems
from stagewise.eval.splits import is_test_metric
from stagewise.model.config import ModelConfig, TrainConfig
from stagewise.model.presets import preset_names
from stagewise.recipe.blocks.distill import teacher_rl_block
from stagewise.recipe.errors import did_you_mean
from stagewise.recipe.schema import STAGE_ORDER

if TYPE_CHECKING:  # types for annotations only
    from stagewise.recipe.schema import Recipe


def cross_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """(yaml path, why, path whose line to cite) for every cross-field problem of a recipe."""
    pre = r.stages.pretrain
    out = _source_problems([s.name for s in r.data.sources], pre.phases if pre else None, r.tokenizer)
    out += _schedule_problems("stages.pretrain", pre) if pre else []
    out += _suite_problems(r, "stages.pretrain", pre)
    out += _sft_problems(r) if r.stages.sft else []
    out += _rl_problems(r) if r.stages.rl else []
    out += _distill_problems(r) if r.stages.distill else []
    out += _suite_problems(r, "stages.distill", r.stages.distill)
    out += _merge_problems(r)
    out += _suite_problems(r, "stages.merge", r.stages.merge)
    out += _suite_problems(r, "stages.quantize", r.stages.quantize)
    out += _quantize_problems(r) if r.stages.quantize else []
    out += _eval_problems(r)
    out += _gate_split_problems(r)
    out += _gate_review_problems(r)
    out += _workdir_problems(r.workdir)
    return out + _preset_problems(r.model)


def _gates(r: Recipe) -> list[tuple[str, Any]]:
    """(yaml path, gate) of every gate in the recipe: a stage's own, and each SFT sub-stage's."""
    found = [(f"stages.{name}.gate", getattr(block, "gate", None)) for name, block in r.stages if block is not None]
    if r.stages.sft is not None:
        found += [(f"stages.sft.stages[{i}].gate", sub.gate) for i, sub in enumerate(r.stages.sft.stages)]
    return [(at, gate) for at, gate in found if gate is not None]


def _gate_split_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """A gate decides, so it reads the dev split of held-out sets: a test metric is for the closing
    table and the README only (eval/splits.py), and a gate on it would tune on the test set."""
    out = []
    for at, gate in _gates(r):
        for name in gate.metrics():
            if is_test_metric(name):
                dev = name.replace("/test/", "/dev/").replace("_test/", "_dev/")
                out.append((at, f"reads {name!r}, a test-split metric: gates decide on dev ({dev!r}); "
                                "test is reported, never tuned on", at))
    return out


def _gate_review_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """A person reviews a gate by pausing the stage's flow between stretches of our engine; a launched
    engine (Megatron-Bridge, NeMo RL) trains its whole budget in one job, with nothing to pause or extend."""
    out = []
    for at, gate in _gates(r):
        stage = r.stages.sft if at.startswith("stages.sft.") else getattr(r.stages, at.split(".")[1])
        engine = getattr(stage, "engine", "torch")
        if gate.review != "never" and engine != "torch":
            out.append((f"{at}.review", f"review: {gate.review} needs our engine (engine: torch); a stage on "
                                        f"{engine} trains its budget in one launch, with no stretch to pause or extend",
                        f"{at}.review"))
    return out


STEP_DIR = re.compile(r"[a-z][a-z0-9_]*(-[A-Za-z0-9_.]+)*-[0-9a-f]{16}")
"""A step directory's name under `<workdir>/stages/` (store/steps.py: `<kind>-<hash>`)."""


def _workdir_problems(workdir: str) -> list[tuple[str, str, str]]:
    """A workdir inside another run's step directory would write its data, checkpoints and MLflow store
    into a step that run hands on (and reuses by its finish marker): refused."""
    for parent in [Path(workdir).resolve(), *Path(workdir).resolve().parents]:
        if parent.parent.name == "stages" and STEP_DIR.fullmatch(parent.name):
            return [("workdir", f"{workdir!r} lies inside the step directory {parent} of the run in "
                     f"{parent.parent.parent}: give a workdir of its own", "workdir")]
    return []


def _merge_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Merging and long context build on pretraining: its checkpoints, data and last blend."""
    out = []
    pre = r.stages.pretrain
    for name in ("merge", "long_context"):
        if getattr(r.stages, name) is not None and pre is None:
            out.append((f"stages.{name}", "needs a stages.pretrain block (it starts from pretraining)", f"stages.{name}"))
    if r.stages.merge is not None and pre is not None:
        if not pre.checkpoint_every_tokens:
            out.append(("stages.pretrain.checkpoint_every_tokens",
                        "must be set when stages.merge is (merging needs intermediate checkpoints)", "stages.merge"))
        elif pre.keep_checkpoints:
            kept = pre.keep_checkpoints * pre.checkpoint_every_tokens
            for i, w in enumerate(r.stages.merge.windows_tokens):
                if w > kept:
                    at = f"stages.merge.windows_tokens[{i}]"
                    out.append((at, f"window of {w} tokens is longer than the {kept} tokens of checkpoints "
                                    "stages.pretrain.keep_checkpoints keeps", at))
    return out


def _suite_problems(r: Recipe, at: str, stage: Any) -> list[tuple[str, str, str]]:
    """A stage's eval_suite and gate.suite must name suites of the recipe's `eval` block."""
    out = []
    for field, name in (("eval_suite", getattr(stage, "eval_suite", None)),
                        ("gate.suite", getattr(getattr(stage, "gate", None), "suite", None))):
        if name is not None and name not in r.eval:
            where = f"{at}.{field}"
            known = ", ".join(sorted(r.eval)) or "none; add an `eval:` block"
            out.append((where, f"unknown eval suite {name!r}{did_you_mean(name, r.eval)}; suites: {known}", where))
    return out


def _eval_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Every suite entry names a local task, or a standard lm-eval task whose folder holds the split
    files and columns it reads (eval/harness.py suite_problems: no model, no lm-eval import)."""
    return [(f"eval.{suite}[{i}]", why, f"eval.{suite}[{i}]")
            for suite, entries in r.eval.items() for i, why in suite_problems(entries)]


def _quantize_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """`@world/` held-out files need the SFT world; a calibration file must be a file of the recipe, not the world."""
    q, at, out = r.stages.quantize, "stages.quantize", []
    if q.heldout and q.heldout.startswith("@world/") and (r.stages.sft is None or r.stages.sft.data.world is None):
        out.append((f"{at}.heldout", "an @world/ file needs stages.sft.data.world (the demo world's conversations)",
                    f"{at}.heldout"))
    if q.calib and q.calib.startswith("@world/"):
        out.append((f"{at}.calib", "give a text file (JSONL with `text`, or .txt); the default is the recipe's "
                    "validation text", f"{at}.calib"))
    return out


SFT_WORLD_FILES = ("sft_arithmetic.jsonl", "sft_calculator.jsonl", "sft_sorting.jsonl", "sft_lookup.jsonl",
                   "sft_format.jsonl", "sft_long_context.jsonl", "sft_dirty.jsonl")
"""What `stages.sft.data.world` writes that a source may train on (sft_eval.jsonl is held out)."""


def _sft_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Sources, blends, keep_previous, schedules and suites of `stages.sft`."""
    sft, at = r.stages.sft, "stages.sft"
    out = _sft_source_problems(sft.data, f"{at}.data")
    domains = sorted({s.domain_name for s in sft.data.sources})
    out += _suite_problems(r, at, sft)
    seen: set[str] = set()
    for i, sub in enumerate(sft.stages):
        here = f"{at}.stages[{i}]"
        if sub.name in seen:
            out.append((f"{here}.name", f"duplicate sub-stage name {sub.name!r}", f"{here}.name"))
        seen.add(sub.name)
        for domain in sub.blend.weights:
            if domain not in domains:
                why = f"unknown domain {domain!r}{did_you_mean(domain, domains)}; the sources' domains: {', '.join(domains)}"
                out.append((f"{here}.blend.weights.{domain}", why, f"{here}.blend.weights.{domain}"))
        if i == 0 and sub.keep_previous > 0:
            why = f"the first sub-stage has no previous one to keep data from; got {sub.keep_previous}"
            out.append((f"{here}.keep_previous", why, f"{here}.keep_previous"))
        out += _schedule_problems(here, sub)
        out += _suite_problems(r, here, sub)
    return out + _switch_problems(r)


def _switch_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """A reasoning-off fraction needs a reasoning switch: refused here when the recipe says the model has
    none (`auto` is decided from the start checkpoint's template, once its tokenizer is loaded: flows/sft.py)."""
    if not isinstance(r.tokenizer.reasoning_switch, NoSwitch):
        return []
    out = []
    for i, sub in enumerate(r.stages.sft.stages):
        at = f"stages.sft.stages[{i}].blend.reasoning_off_fraction"
        if sub.blend.reasoning_off_fraction > 0:
            out.append((SWITCH_FIELD, f"{{kind: none}}: the model cannot be told reasoning is off, so {at} "
                                      f"{sub.blend.reasoning_off_fraction} cannot train; name its switch or set "
                                      "the fraction to 0", at))
    return out


def _sft_source_problems(data: SFTDataConfig, at: str) -> list[tuple[str, str, str]]:
    """Unique source names; `@world/` paths need the world block and name a file it writes."""
    out, seen = [], set()
    for i, src in enumerate(data.sources):
        here = f"{at}.sources[{i}]"
        if src.name in seen:
            out.append((f"{here}.name", f"duplicate source name {src.name!r}", f"{here}.name"))
        seen.add(src.name)
        out += _sft_world_path_problems(f"{here}.path", src.path, data, training=True)
    if data.heldout is not None:
        out += _sft_world_path_problems(f"{at}.heldout", data.heldout, data, training=False)
    return out


def _sft_world_path_problems(where: str, path: str, data: SFTDataConfig, training: bool) -> list[tuple[str, str, str]]:
    return _world_path_problems(where, path, data.world is not None, "stages.sft.data", "SFT", SFT_WORLD_FILES,
                                "sft_eval.jsonl", training)


def _world_path_problems(where: str, path: str, has_world: bool, block: str, what: str, files: tuple[str, ...],
                         heldout: str, training: bool) -> list[tuple[str, str, str]]:
    """An `@world/` path needs its block's world and must name a file it writes (the held-out one never trained on)."""
    if not path.startswith(WORLD_PREFIX):
        return []
    if not has_world:
        return [(where, f"{WORLD_PREFIX} paths need a `world` block in {block} (it generates them)", where)]
    name = path[len(WORLD_PREFIX):]
    if training and name == heldout:
        return [(where, f"{heldout} is the held-out set: it is scored, never trained on", where)]
    files = files + (() if training else (heldout,))
    if name not in files:
        return [(where, f"the {what} world writes no {name!r}{did_you_mean(name, files)}; files: {', '.join(files)}", where)]
    return []


RL_WORLD_FILES = ("rl_arithmetic.jsonl", "rl_format.jsonl", "rl_calculator.jsonl", "rl_sorting.jsonl")
"""What `stages.rl.data.world` writes that a source may train on (rl_eval.jsonl is held out)."""


def _rl_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Sources (unique names, world paths, known environments) and domain ratios of `stages.rl`."""
    rl, at = r.stages.rl, "stages.rl.data"
    out, seen = [], set()
    for i, src in enumerate(rl.data.sources):
        here = f"{at}.sources[{i}]"
        if src.name in seen:
            out.append((f"{here}.name", f"duplicate source name {src.name!r}", f"{here}.name"))
        seen.add(src.name)
        out += _world_path_problems(f"{here}.path", src.path, rl.data.world is not None, at, "RL", RL_WORLD_FILES,
                                    "rl_eval.jsonl", training=True)
        if src.environment is not None and src.environment not in ENVIRONMENTS:
            why = (f"unknown environment {src.environment!r}{did_you_mean(src.environment, list(ENVIRONMENTS))}; "
                   f"known: {', '.join(sorted(ENVIRONMENTS))}")
            out.append((f"{here}.environment", why, f"{here}.environment"))
    if rl.data.heldout is not None:
        out += _world_path_problems(f"{at}.heldout", rl.data.heldout, rl.data.world is not None, at, "RL",
                                    RL_WORLD_FILES, "rl_eval.jsonl", training=False)
    for domain, share in (rl.domains or {}).items():
        if share <= 0:
            out.append((f"stages.rl.domains.{domain}", f"a domain's share must be > 0, got {share}",
                        f"stages.rl.domains.{domain}"))
    return out


def _distill_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Prompt rows, the stages the student and the teachers come from, and each `rl` teacher's
    block (the recipe's stages.rl with its overrides) validated as an RL block."""
    d, at = r.stages.distill, "stages.distill"
    out = []
    if d.data is None and r.stages.rl is None:
        out.append((f"{at}.data", "required without a stages.rl block (the prompts default to stages.rl.data)", at))
    for i, src in enumerate(d.data.sources if d.data else []):
        here = f"{at}.data.sources[{i}]"
        out += _world_path_problems(f"{here}.path", src.path, d.data.world is not None, f"{at}.data", "RL",
                                    RL_WORLD_FILES, "rl_eval.jsonl", training=True)
    earlier = STAGE_ORDER[:STAGE_ORDER.index("distill")]

    def stage_ref(path: str, name: str) -> None:
        if name in STAGE_ORDER and (name not in earlier or getattr(r.stages, name, None) is None):
            why = (f"stage {name!r} must be a stage of this recipe that runs before distill "
                   f"(present: {', '.join(s for s in earlier if getattr(r.stages, s, None) is not None)})")
            out.append((path, why, path))

    if d.student is not None:
        stage_ref(f"{at}.student", d.student)
    for i, t in enumerate(d.teachers):
        here = f"{at}.teachers[{i}]"
        if t.stage is not None:
            if t.stage not in STAGE_ORDER:
                why = f"unknown stage {t.stage!r}{did_you_mean(t.stage, STAGE_ORDER)}"
                out.append((f"{here}.stage", why, f"{here}.stage"))
            else:
                stage_ref(f"{here}.stage", t.stage)
        if t.rl is not None:
            try:
                teacher_rl_block(t, r.stages.rl)
            except ValidationError as e:
                for err in e.errors():
                    loc = ".".join(str(p) for p in err["loc"])
                    out.append((f"{here}.rl.{loc}" if loc else f"{here}.rl", err["msg"], f"{here}.rl"))
            except ValueError as e:
                out.append((f"{here}.rl", str(e), f"{here}.rl"))
    return out


def _preset_problems(model: ModelConfig) -> list[tuple[str, str, str]]:
    """A preset name must exist, or `from` be given (checked here so a typo fails before any work starts)."""

    names = preset_names()
    if model.from_ is None and model.preset is None:
        why = f"required: a preset name ({', '.join(names)}) or `model.from` a checkpoint directory"
        return [("model.preset", why, "model.preset")]
    if model.from_ is not None or model.preset in names:
        return []
    why = f"unknown preset {model.preset!r}{did_you_mean(model.preset, names)}; presets: {', '.join(names)}"
    return [("model.preset", why, "model.preset")]


def _source_problems(names: list[str], phases: list[PhaseConfig] | None,
                     tokenizer: TokenizerConfig | None) -> list[tuple[str, str, str]]:
    """Phases and the tokenizer may only name sources the data block defines."""
    out = _phase_problems("stages.pretrain.phases", phases, names) if phases else []
    for i, name in enumerate((tokenizer.train_sources if tokenizer else None) or []):
        if name not in names:
            at = f"tokenizer.train_sources[{i}]"
            out.append((at, f"unknown source {name!r}{did_you_mean(name, names)}", at))
    return out


def partial_cross_problems(raw: dict) -> list[tuple[str, str, str]]:
    """Cross checks on the parts that validate alone, so one bad field hides no other problem."""
    def part(model: type[BaseModel], value: Any) -> Any:
        try:
            return model.model_validate(value)
        except (ValidationError, TypeError):
            return None

    sources = (raw.get("data") or {}).get("sources") if isinstance(raw.get("data"), dict) else None
    if not isinstance(sources, list):
        return []
    names = [s["name"] for s in sources if isinstance(s, dict) and isinstance(s.get("name"), str)]
    stages = raw.get("stages")
    pre = stages.get("pretrain") if isinstance(stages, dict) else None
    listed = pre.get("phases") if isinstance(pre, dict) else None
    phases = [part(PhaseConfig, p) for p in listed] if isinstance(listed, list) else []
    phases = phases if phases and None not in phases else None
    return _source_problems(names, phases, part(TokenizerConfig, raw.get("tokenizer") or {}))


def _phase_problems(at: str, phases: list[PhaseConfig], names: list[str]) -> list[tuple[str, str, str]]:
    """The rules of data.config.check_phases, each reported at the phase that breaks it."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for i, p in enumerate(phases):
        here = f"{at}[{i}]"
        if p.name in seen:
            out.append((f"{here}.name", f"duplicate phase name {p.name!r}", f"{here}.name"))
        seen.add(p.name)
        if i and p.until <= phases[i - 1].until:
            why = f"must be greater than the previous phase's until ({phases[i - 1].until}); got {p.until}"
            out.append((f"{here}.until", why, f"{here}.until"))
        if p.quality_weights and sum(p.blend.values()) <= 0:
            why = f"no source has a tier with a positive weight in {dict(p.quality_weights)} (set sources[].quality)"
            out.append((f"{here}.quality_weights", why, f"{here}.quality_weights"))
        for src in p.blend:
            if src not in names:
                why = f"unknown source {src!r}{did_you_mean(src, names)}; known: {', '.join(sorted(names))}"
                out.append((f"{here}.blend", why, f"{here}.blend.{src}"))
    if phases[-1].until != 1.0:
        last = f"{at}[{len(phases) - 1}].until"
        out.append((last, f"the last phase must end at 1.0; got {phases[-1].until}", last))
    return out


def _schedule_problems(at: str, stage: TrainConfig) -> list[tuple[str, str, str]]:
    """Warmup and decay must fit inside the stage's token budget."""
    sched, out = stage.schedule, []
    if sched.warmup_tokens >= stage.tokens:
        why = f"must be less than the stage's tokens ({stage.tokens}); got {sched.warmup_tokens}"
        out.append((f"{at}.schedule.warmup_tokens", why, f"{at}.schedule.warmup_tokens"))
    elif sched.kind == "wsd" and sched.decay_tokens is not None:
        if sched.warmup_tokens + sched.decay_tokens > stage.tokens:
            why = (f"warmup_tokens + decay_tokens ({sched.warmup_tokens + sched.decay_tokens}) "
                   f"exceed the stage's tokens ({stage.tokens})")
            out.append((f"{at}.schedule.decay_tokens", why, f"{at}.schedule.decay_tokens"))
    return out
