"""The recipe doctor's training rules: published guidance on schedules, LRs, data and losses.

One function per rule, `rule(facts) -> findings` (recipe/doctor/__init__.py lists them, `stagewise check
--help` prints their first docstring lines). Each docstring says where the advice comes from; the
thresholds are the constants below, `(ours)` where the sources give no exact number. A rule that
needs a fact the recipe alone does not give (the model's size, the prepared data's) stays silent
when it is unknown (recipe/doctor/facts.py says when that is).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stagewise.recipe.doctor.findings import Finding, advise

if TYPE_CHECKING:
    from stagewise.recipe import Recipe
    from stagewise.recipe.blocks.contract import Stretch
    from stagewise.recipe.doctor.facts import Facts

FINETUNE_WARMUP_SHARE = 0.25
"""Most a fine-tune (an SFT sub-stage, long context) should spend warming up, as a share of its tokens
(ours: Megatron-Bridge's Nemotron 3 Nano 4B SFT recipe warms up 10 of 100 steps)."""
PRETRAIN_WARMUP_SHARE = 0.10
"""Most pretraining should spend warming up (Nemotron 3 Super: 200B of 25T tokens, 0.8%; ours: ~12x that)."""
DATASET_WARMUP_SHARE = 0.10
"""Most warmup tokens per token of prepared data: billions of warmup tokens want a dataset of tens of
billions or more (Super's 200B warmup read a corpus of trillions; the share is ours)."""
SUPER_SFT_LR, SUPER_PARAMS = 1e-5, 120.6e9
"""Nemotron 3 Super tech report, SFT: peak 1e-5 (constant after a linear warmup) for 120.6B parameters."""
LR_FAR_ABOVE = 3.0
"""A fine-tune LR more than this many times the published SFT LR scaled to the model's size is flagged (ours)."""
LORA_LR_FACTOR = 20.0
"""LoRA takes a higher LR: Megatron-Bridge's Nemotron 3 Nano 4B recipes, LoRA 1e-4 against full SFT 5e-6."""
EPOCHS_ADVISED, EPOCHS_MAX = 4.0, 8.0
"""Nemotron pretraining mixtures read no source more than 4-8 epochs over the run (docs/ALGORITHMS.md 3)."""
NARROW_DOMAIN = 0.9
"""An SFT blend with one domain at this share or more is a single narrow domain (ours)."""
LONG_PACK_FACTOR = 4
"""SFT packs at least this many times pretraining's sequence length are long packs (ours)."""

REF_WARMUP = ("Nemotron 3 Super tech report, pretraining (200B warmup of 25T tokens); Megatron-Bridge Nemotron 3 "
              "Nano 4B SFT (10 of 100 steps); limits ours")
REF_LR = "Nemotron 3 Super tech report, SFT (1e-5 at 120.6B parameters); sqrt-size scaling ours"
REF_EPOCHS = "Nemotron 3 pretraining mixtures: at most 4-8 epochs per source over the run (docs/ALGORITHMS.md 3)"
REF_MOE = "Nemotron 3 Super SFT: one blend across every domain; MoE load balance (docs/ALGORITHMS.md 9)"
REF_LONG = "Nemotron 3 Nano long-context phase: 512k sequences mixed with 4k (Super: 1M alternating with 4k)"
REF_NORM = "Nemotron 3 Super SFT: token-level loss in stage 1, per-conversation (sample-level) loss in stage 2"
REF_FILTER = "Nemotron 3 Nano RL: difficulty filter, prompts profiled and the always-solved dropped (docs/ALGORITHMS.md 6)"
REF_VLLM_CPU = ("vLLM's CPU build (docs/STACK.md, 'vLLM for real'): its fused-MoE layer supports non-gated "
                "experts (is_act_and_mul=False) only on CUDA, XPU and ROCm")

REF_MASKED_IS = ("masked importance sampling against the rollout/training mismatch (docs/ALGORITHMS.md 5); "
                 "model/rl_batches.py: π_old of a split rollout batch")


def _count(n: float) -> str:
    """Token and parameter counts as a person reads them: 73,728 / 1.47M / 200B / 20T."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{round(n):,}"


def _warmed(facts: Facts) -> Iterator[tuple[str, Stretch, float]]:
    """(stage, stretch, warmup share limit) of every stretch scheduled in tokens (what each stage's block
    declares, recipe/blocks/contract.py): pretraining's limit for pretraining, a fine-tune's for the rest."""
    for stage, s in facts.stretches:
        if s.step_tokens is not None:
            yield stage, s, PRETRAIN_WARMUP_SHARE if s.role == "pretrain" else FINETUNE_WARMUP_SHARE


def warmup(facts: Facts) -> Iterator[Finding]:
    """Warmup too long for its stage (a fine-tune: > 25% of its tokens; pretraining: > 10%) or for the
    data (> 10% of the prepared dataset's tokens, e.g. billions of warmup tokens on a few billion).

    Warmup trains below the peak LR: stretched over a large share of a short fine-tune, most of it
    never trains at the LR it was tuned for. The dataset share needs the recipe's prepared data
    (skipped without it); RL and distillation count steps, not tokens, and are not judged."""
    for stage, s, limit in _warmed(facts):
        block, w = s.block, s.block.schedule.warmup_tokens
        field, steps = f"{s.at}.schedule.warmup_tokens", w / s.step_tokens
        if w / block.tokens > limit:
            yield advise("warning", field, f"warmup of {_count(w)} tokens ({steps:.0f} steps) is {w / block.tokens:.0%} "
                         f"of the stage's {_count(block.tokens)} tokens (flagged above {limit:.0%})",
                         round(w / block.tokens, 4), REF_WARMUP, stage)
        data = facts.data if s.role != "finetune" else None  # a fine-tune reads its own data, not pretraining's
        if data and data.total and w / data.total > DATASET_WARMUP_SHARE:
            yield advise("warning", field, f"warmup of {_count(w)} tokens is {w / data.total:.0%} of the prepared "
                         f"dataset's {_count(data.total)} training tokens ({data.root})",
                         round(w / data.total, 4), REF_WARMUP, stage)


def scaled_sft_lr(params: int) -> float:
    """The published SFT LR scaled to a model of `params` parameters: 1e-5 x sqrt(120.6B / params).

    (ours) Adam's best LR falls roughly as 1/width, and parameters grow as width squared, so the LR
    goes as 1/sqrt(params): a 2M-parameter model fine-tunes near 2.4e-3, a 4B one near 5.5e-5."""
    return SUPER_SFT_LR * (SUPER_PARAMS / params) ** 0.5


def _finetunes(facts: Facts) -> Iterator[tuple[str, str, float, float | None]]:
    """(stage, LR field, peak LR, its scaled-reference factor; None: judged against pretraining only) of
    every stretch that continues a trained model: the fine-tunes first (LoRA ones at LORA_LR_FACTOR),
    then continued pretraining (long context)."""
    for role in ("finetune", "continued"):
        for stage, s in facts.stretches:
            if s.role == role:
                factor = None if role == "continued" else LORA_LR_FACTOR if s.lora else 1.0
                yield stage, f"{s.at}.optimizer.lr", s.block.optimizer.lr, factor


def finetune_lr(facts: Facts) -> Iterator[Finding]:
    """A fine-tune peak LR (SFT sub-stage, RL, distill; long context too) at or above the recipe's own
    pretraining peak (error), or more than 3x the published SFT LR scaled to the model's size (warning).

    Fine-tunes use far lower peaks than pretraining (Nemotron 3 Super: 4.5e-4 pretraining, 1e-5 SFT);
    how low scales with the model, so the LR is judged against the same recipe's pretraining peak and
    Super's SFT LR scaled to this model's parameter count (`stagewise inspect`); LoRA allows 20x."""
    peak = next((s.block.optimizer.lr for _, s in facts.stretches if s.role == "pretrain"), None)
    model = facts.model
    for stage, field, lr, factor in _finetunes(facts):
        if peak is not None and lr >= peak:
            yield advise("error", field, f"peak LR {lr:.1e} is {lr / peak:.2g}x the pretraining peak ({peak:.1e}): "
                         "a stage that continues a trained model wants a far lower LR", lr, REF_LR, stage)
        elif model is not None and factor is not None and lr > LR_FAR_ABOVE * factor * scaled_sft_lr(model.params):
            ref = factor * scaled_sft_lr(model.params)
            yield advise("warning", field, f"peak LR {lr:.1e} is {lr / ref:.1f}x the fine-tune LR the published one "
                         f"scales to for {_count(model.params)} parameters ({ref:.1e}; flagged above "
                         f"{LR_FAR_ABOVE:g}x)", lr, REF_LR, stage)


def _planned_tokens(r: Recipe, long_context: bool) -> dict[str, float]:
    """Tokens each pretraining source is asked for over the run: the phases' blends x their spans,
    plus (when it runs) long context's phase-2 share and retrieval share (data/long_context_config.py)."""
    out: dict[str, float] = {}

    def spread(blend: dict[str, float], tokens: float) -> None:
        total = sum(blend.values())
        for name, w in blend.items():
            out[name] = out.get(name, 0.0) + tokens * w / total

    pre, lc, start = r.stages.pretrain, r.stages.long_context if long_context else None, 0.0
    for phase in pre.phases:
        spread(phase.blend, (phase.until - start) * pre.tokens)
        start = phase.until
    if lc:
        d = lc.data
        spread(d.phase2_blend or pre.phases[-1].blend, lc.tokens * (1 - d.doc_qa_share - d.retrieval_share))
        spread({d.retrieval_source: 1.0}, lc.tokens * d.retrieval_share)
    return out


def epochs(facts: Facts) -> Iterator[Finding]:
    """A source read more than 4 epochs over the run (warning; more than 8: error), or more than its
    own max_epochs (the loader then retires it and the blend shifts); a max_epochs cap above 8.

    Repeating data past a few epochs stops helping and starts memorising. The epochs are each
    phase's blend share x its tokens (and long context's) / the source's prepared training tokens,
    so they need the recipe's prepared data; the cap check does not."""
    r, data = facts.recipe, facts.data
    planned = _planned_tokens(r, facts.runs("long_context")) if (data and r.stages.pretrain) else {}
    for i, src in enumerate(r.data.sources):
        if src.max_epochs > EPOCHS_MAX:
            yield advise("warning", f"data.sources[{i}].max_epochs", f"source {src.name!r} may be read "
                         f"{src.max_epochs:g} times (the published range is {EPOCHS_ADVISED:g}-{EPOCHS_MAX:g})",
                         src.max_epochs, REF_EPOCHS, "pretrain")
        have = data.train_tokens.get(src.name) if data else None
        e = planned.get(src.name, 0.0) / have if have else 0.0
        if e > min(EPOCHS_ADVISED, src.max_epochs):
            capped = f"; its max_epochs ({src.max_epochs:g}) retires it part way and the blend shifts" \
                if e > src.max_epochs else ""
            yield advise("error" if e > EPOCHS_MAX else "warning", f"data.sources[{i}]",
                         f"source {src.name!r} is read {e:.1f} epochs over the run ({_count(planned[src.name])} of "
                         f"its {_count(have)} training tokens){capped}", round(e, 2), REF_EPOCHS, "pretrain")


def moe_narrow_blend(facts: Facts) -> Iterator[Finding]:
    """An MoE model fine-tuned on one narrow domain (>= 90% of an SFT sub-stage's blend weight).

    Trained on one domain, the router sends nearly every token to the few experts that domain uses:
    the others starve and what they held is forgotten (expert collapse). Keep a slice of every
    domain in each blend (Nemotron 3's SFT blends span every domain)."""
    sft, model = facts.recipe.stages.sft, facts.model
    if sft is None or model is None or not model.moe:
        return
    for i, sub in enumerate(sft.stages):
        total = sum(sub.blend.weights.values())
        domain, w = max(sub.blend.weights.items(), key=lambda kv: kv[1])
        if w / total >= NARROW_DOMAIN:
            others = sorted(set(sub.blend.weights) - {domain}) or ["(none)"]
            yield advise("warning", f"stages.sft.stages[{i}].blend.weights.{domain}",
                         f"{domain!r} carries {w / total:.0%} of the blend on an MoE model: expert-collapse risk; "
                         f"keep a slice from every domain (others here: {', '.join(others)})",
                         round(w / total, 4), REF_MOE, "sft")


def long_context_mix(facts: Facts) -> Iterator[Finding]:
    """A long-context stage with no sequences at pretraining's seq_length or shorter in its length mix.

    Trained on long sequences only, a model loses short-context quality; Nemotron mixes the long
    sequences with short ones at the pretraining length."""
    r = facts.recipe
    lc, pre = r.stages.long_context, r.stages.pretrain
    if lc is None or pre is None:
        return
    shortest = min(x.length for x in lc.data.lengths)
    if shortest > pre.seq_length:
        yield advise("warning", "stages.long_context.data.lengths", f"the shortest length is {shortest:,}, longer "
                     f"than pretraining's seq_length ({pre.seq_length:,}): mix in a share at {pre.seq_length:,} "
                     "or shorter", shortest, REF_LONG, "long_context")


def sft_normalization(facts: Facts) -> Iterator[Finding]:
    """An SFT sub-stage after the first, or one with long packs (>= 4x pretraining's seq_length),
    without per-conversation loss normalisation (normalization: conversation).

    With token-level normalisation a long conversation outweighs many short ones in proportion to
    its length; stage 2 of Nemotron 3's SFT, with long packs, weighs every conversation the same."""
    r = facts.recipe
    if r.stages.sft is None:
        return
    long_pack = LONG_PACK_FACTOR * r.stages.pretrain.seq_length if r.stages.pretrain else None
    for i, sub in enumerate(r.stages.sft.stages):
        if sub.normalization == "conversation":
            continue
        why = "a later sub-stage" if i else (f"packs of {sub.seq_length:,} tokens" if long_pack and
                                             sub.seq_length >= long_pack else None)
        if why:
            yield advise("warning", f"stages.sft.stages[{i}].normalization", f"{why} with token normalisation: long "
                         "conversations outweigh short ones; use normalization: conversation", sub.seq_length,
                         REF_NORM, "sft")


def rl_filter(facts: Facts) -> Iterator[Finding]:
    """RL without a difficulty filter (stages.rl.filter null, or one that drops nothing).

    A prompt the policy always solves (or never does) gives a group with no reward variance: no
    GRPO signal, only rollout cost. The filter profiles every prompt first and drops the solved."""
    rl = facts.recipe.stages.rl
    if rl is None:
        return
    f = rl.filter
    if f is None or not (f.drop_solved or f.drop_unsolved):
        what = "no difficulty filter" if f is None else "a difficulty filter that drops nothing"
        yield advise("warning", "stages.rl.filter", f"RL with {what}: prompts the policy always solves train nothing; "
                     "set filter: {samples: 8} (drop_solved: true)", None, REF_FILTER, "rl")


def _inert_masked_is(block: Any) -> bool:
    """One-step off-policy rollouts split into minibatches without recompute_old_logprobs: every part's
    π_old is the sampler's own log-probs, so the IS weight exp(π_old − π_rollout) is exactly 1."""
    ro = block.rollout
    return ro.off_policy and ro.optimizer_steps() > 1 and not ro.recompute_old_logprobs


def masked_is_inert(facts: Facts) -> Iterator[Finding]:
    """RL rollouts one step off-policy and split into minibatches without recompute_old_logprobs
    (stages.rl, and a distillation teacher trained from it): masked importance sampling is inert.

    There every part's π_old is the sampler's own log-probs, so the IS weight w = π_old/π_rollout is
    exactly 1 and no token is ever masked: neither the sampler-vs-trainer numerics nor the staleness
    are corrected by it (only ρ's clip acts). Synchronous rollouts take π_old from the trainer at the
    sampling weights; recompute_old_logprobs takes it from a trainer-style forward under them."""
    from stagewise.recipe.blocks.distill import teacher_rl_block  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    r = facts.recipe
    fix = ("π_old is the sampler's own log-probs, so w = 1 and masked IS masks nothing; set rollout.off_policy: "
           "false (π_old from the trainer at the sampling weights) or rollout.recompute_old_logprobs: true")
    rl = r.stages.rl
    if rl is not None and rl.engine == "torch" and _inert_masked_is(rl):
        k = rl.rollout.minibatches
        yield advise("warning", "stages.rl.rollout", f"one-step off-policy rollouts in {k} minibatches without "
                     f"recompute_old_logprobs: {fix}", k, REF_MASKED_IS, "rl")
    d = r.stages.distill
    for i, t in enumerate(d.teachers if d is not None else []):
        if t.rl is None:
            continue
        try:
            block = teacher_rl_block(t, r.stages.rl)
        except ValueError:  # the schema refuses it at load; nothing to advise
            continue
        if block.engine == "torch" and _inert_masked_is(block):
            yield advise("warning", f"stages.distill.teachers[{i}].rl", f"teacher {t.name!r} trains RL one step "
                         f"off-policy in {block.rollout.minibatches} minibatches without recompute_old_logprobs: "
                         f"{fix} (in stages.rl or this teacher's rl overrides)", block.rollout.minibatches,
                         REF_MASKED_IS, "distill")


def _on_cpu(runtime: Any) -> bool:
    """Whether the recipe's runtime resolves to the CPU here (auto: no GPU that torch sees)."""
    if runtime.device != "auto":
        return runtime.device == "cpu"
    import torch  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    return not torch.cuda.is_available()


def vllm_moe_on_cpu(facts: Facts) -> Iterator[Finding]:
    """RL or distillation sampling through a vLLM server the stage starts itself (backend vllm, no
    vllm_url) on a model with expert layers, on the CPU: vLLM's CPU build refuses NemotronH's
    non-gated relu2 experts, so the server dies at start. Said before any work rather than after the
    stages before it and a server start; a server at a vllm_url (a GPU's) is the user's to choose."""
    r = facts.recipe
    starts_own = [name for name in ("rl", "distill") if facts.runs(name)
                  and getattr(r.stages, name).backend == "vllm" and not getattr(r.stages, name).vllm_url]
    if not starts_own or facts.model is None or not facts.model.moe or not _on_cpu(r.runtime):
        return
    for name in starts_own:
        yield advise("error", f"stages.{name}.backend", "backend vllm starts a vLLM server on this CPU, and the "
                     "model has expert (MoE) layers, which vLLM's CPU build cannot run: use backend hf or "
                     "hf-process here, give a vllm_url of a GPU server, or a preset without MoE layers", None,
                     REF_VLLM_CPU, name)
