"""Every Megatron-Bridge plan the recipe check emits, through the released library's own config path.

side_env/validate_plans.py (run by the side environment's interpreter, one subprocess for all
plans) builds each plan as a rank of run_recipe.py would: the recipe function, the `--dataset`
preset (`build_dataset_config`), the plan's `key=value` text through
`process_config_with_overrides`, then `runtime_config_update`, which ends in
`ConfigContainer.validate()`. Its docstring lists each step, the CPU-only settings it applies
(each result names them) and the script syncs it checks instead of applying.

The plans:
- what `stagewise recipe check` translates for recipes/tiny.yaml and recipes/nemotron-3-nano-4b.yaml
  with pretrain, long_context and sft on engine megatron (captured from engines/megatron/checks.py
  as it translates, so they are its plans, not a copy of its arguments), and both recipes with a
  LoRA sub-stage (tiny is a MoE: its SFT and LoRA sub-stages run the 30B-A3B SFT and PEFT recipes
  with the tiny shape as model overrides);
- the published Nano 4B runs (pretrain, SFT 2k, SFT 32k, LoRA) and the Nano 30B-A3B pretraining and
  SFT defaults as test_megatron_translate.py writes them, a 30B-A3B LoRA run on the PEFT recipe's
  defaults (_nano_30b_lora), and a 4B long-context block at 32k;
- an SFT sub-stage and a long-context block as engines/megatron/stage.py plans them on directories
  our code wrote (stage_plans): the SFT chat start data.sft_assembly.make_chat_start makes of the
  `tiny_checkpoint` fixture (saved by our transformers), and that checkpoint itself for long
  context. Besides validating, each has its tokenizer built as the training run builds it
  (validate_plans.py step 9: build_tokenizer(cfg.tokenizer)), which must be the directory's
  tokenizer as ours reads it (vocabulary, ids, chat template);
- probes that must be refused: the SFT, LoRA and tokenizer-argument override text the translation
  used to write, a global batch the data-parallel ranks cannot split, and the SFT stage plan with
  the chat start itself as its tokenizer (what the stage used to hand over: the release's tokenizer
  build refuses our config.json), so a pass means the check can fail; and one that must read differently: the
  30B-A3B SFT plan against a Hub cache whose config has another vocabulary, which the validated
  model must carry.

The Hub, offline: the 30B-A3B SFT and PEFT recipe functions (HUB_RECIPES) build their model with
`AutoBridge.from_hf_pretrained("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
.to_megatron_provider(load_weights=False)`, which reads that repository's config.json and nothing
else. The side process runs offline (HF_HUB_OFFLINE=1, nothing is downloaded) with HF_HOME and
HF_HUB_CACHE in a tmp dir holding that repository as a download leaves it (`refs/main` and
`snapshots/<rev>/config.json`, hub_cache below), so the release's own lookup reads it. That
config.json is the published architecture written by our code: the `nemotron-3-nano-30b-a3b` model
preset (checked against the published 31.6B / 3.6B parameter counts, model/presets/) built as
NemotronHConfig by model.build.build_hf_config and saved by our transformers, then converted by
engines/megatron/hf_config.py for the transformers Megatron-Bridge pins (layer kinds mamba /
attention), exactly as a stage hands our checkpoints to Megatron-Bridge. No weights are made: only
the config object is built and saved. The validated model reads back the preset's vocabulary,
layer count and pattern, and the probe above shows a change to the cached config arriving, so the
cache, not some other copy, is what the recipe reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.megatron

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).resolve().parent / "side_env" / "validate_plans.py"
TINY = ROOT / "recipes" / "tiny.yaml"
NANO_4B_RECIPE = ROOT / "recipes" / "nemotron-3-nano-4b.yaml"
LAUNCH = ("{env: {venv: /opt/mbridge, workdir: /opt/Megatron-Bridge}, gpus_per_node: 8, "
          "parallel: {tp: 2, cp: 2, sequence_parallel: true}}")
"""The launch tests/recipe/test_recipe_engines.py gives the tiny recipe's stages (TP2, CP2, SP, DP2)."""
ON_MEGATRON = [f"stages.{s}.{k}" for s in ("pretrain", "long_context", "sft")
               for k in ("engine=megatron", f"launch={LAUNCH}")]
FITS_MEGATRON = ["stages.long_context.data.lengths=[{length: 2048, share: 1.0}]",
                 "stages.sft.stages[0].micro_batch=1", "stages.sft.stages[1].micro_batch=1",
                 "stages.sft.stages[1].normalization=token"]
"""What the recipe check asks of tiny's blocks (inherited by the 4B recipe) before Megatron-Bridge
can take them: one long-context length, micro batch 1 and per-token loss for SFT."""
LORA = "stages.sft.stages[0].lora={r: 4, alpha: 8, dropout: 0.05}"
"""Adapters unlike the PEFT recipes' own (4B: rank 8, alpha 16, dropout 0, qkv/proj; 30B-A3B: rank 32,
alpha 32, dropout 0, six modules), so the values read back show the plan's, not the recipe's."""
HUB_RECIPES = ("nemotron_3_nano_sft_8gpu_h100_bf16_config", "nemotron_3_nano_peft_8gpu_h100_bf16_config")
"""Recipe functions that read the Hub while being built (see the module docstring)."""
HUB_MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
"""The repository those recipe functions read (`_NEMOTRON_3_NANO_MODEL_ID` in nemotron_3_nano.py)."""
NANO_30B_A3B = "nemotron-3-nano-30b-a3b"
PROBE_VOCAB = 65536
"""The vocabulary of the probe's cached config (the preset's is 131072)."""
READ = ["model.seq_length", "dataset.seq_length", "train.train_iters", "data_parallel_size", "dataset"]
READ_SFT = ["dataset.offline_packing_specs", "dataset.offline_packing_specs.packed_sequence_size",
            "dataset.offline_packing_specs.pad_seq_to_mult", "dataset.preprocessing"]
READ_LORA = ["peft", "peft.dim", "peft.alpha", "peft.dropout", "peft.target_modules"]
READ_HUB = ["model.vocab_size", "model.num_layers", "model.hybrid_layer_pattern"]
"""Read back where the model comes from the cached config (HUB_RECIPES)."""
READ_PRETRAIN = ["dataset.split", "dataset.split_matrix"]
"""Read back from pretraining and long-context plans (our indexed data): the split, and the split
matrix megatron-core derives from it when the dataset config is finalized."""
READ_TOKENIZER = ["tokenizer.tokenizer_model", "tokenizer.hf_tokenizer_kwargs"]
"""Read back from plans that name their own tokenizer."""
TOKENIZER_PROBE = {"text": "12 + 30 = 42", "messages": [{"role": "user", "content": "What is 12 + 30?"},
                                                        {"role": "assistant", "content": "42."}]}
"""What the built tokenizer is asked to tokenize and render (validate_plans.py step 9)."""


def _nano_30b_lora() -> dict:
    """A 30B-A3B LoRA run in test_megatron_translate.py's terms: its NANO_30B SFT row on the PEFT
    recipe, with what nemotron_3_nano.py's PEFT recipe and recipes/common.py's _peft_common change
    (LR 1e-4, the default LoRA shape: rank 32, alpha 32, dropout 0)."""
    from tests.engines.megatron.test_megatron_translate import NANO_30B

    return {**NANO_30B["sft"], "recipe": "nemotron_3_nano_peft_8gpu_h100_bf16_config", "mode": "lora",
            "lr": 1e-4, "lora": dict(dim=32, alpha=32, dropout=0.0, targets=["linear_qkv", "linear_proj"])}


def hub_cache(root: Path, vocab_size: int | None = None) -> Path:
    """`root` made a Hugging Face hub cache holding HUB_MODEL as a download leaves it: refs/main
    naming a revision, snapshots/<rev>/config.json. The config is our nemotron-3-nano-30b-a3b preset
    (or it with `vocab_size`) as NemotronHConfig, saved by our transformers and rewritten for the
    pinned one by engines/megatron/hf_config.py. No model is built."""
    import hashlib

    from stagewise.engines.megatron.hf_config import megatron_hf_dir
    from stagewise.model.build import build_hf_config
    from stagewise.model.config import ModelConfig

    overrides = {} if vocab_size is None else {"vocab_size": vocab_size}
    saved = root.with_name(f"{root.name}-as-saved")  # beside the cache: our transformers' own config.json
    build_hf_config(ModelConfig(preset=NANO_30B_A3B, overrides=overrides), None).save_pretrained(saved)
    repo = root / ("models--" + HUB_MODEL.replace("/", "--"))
    rev = hashlib.sha1((saved / "config.json").read_bytes()).hexdigest()
    megatron_hf_dir(saved, repo / "snapshots" / rev)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    return root


def _checked_plans(recipe: Path, sets: list[str], stages: tuple[str, ...]) -> list:
    """The MegatronPlans engines/megatron/checks.py translates for `stages`, captured as it makes
    them (every block's translation ends in plan_megatron), after checking it refuses nothing."""
    from stagewise.engines.megatron import checks, translate
    from stagewise.recipe import load_recipe

    r = load_recipe(recipe, sets).recipe
    made, plan_megatron = [], translate.plan_megatron

    def record(*a, **kw):
        made.append(plan_megatron(*a, **kw))
        return made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(translate, "plan_megatron", record)  # the translations' own calls
        mp.setattr(checks, "plan_megatron", record)  # the checks' direct call (imported by name)
        for stage in stages:
            assert checks.megatron_problems(r, stage) == [], stage
    return made


def _card_plans() -> list[tuple[str, object, object]]:
    """The published Nano 4B and 30B-A3B runs, built as test_megatron_translate.py builds them."""
    from stagewise.data.long_context_config import LengthShare, LongContextDataConfig
    from stagewise.engines.megatron.translate import plan_long_context
    from stagewise.model.config import ModelConfig
    from stagewise.recipe.blocks.long_context import LongContextStage
    from tests.engines.megatron.test_megatron_translate import BLEND, NANO_4B, NANO_30B, _launch, _plan

    out = []
    for item, p in NANO_4B.items():
        launch, plan = _plan("nemotron-3-nano-4b", p)
        out.append((f"card-4b-{item}", plan, launch))
    for item, p in (("pretrain", NANO_30B["pretrain"]), ("sft", NANO_30B["sft"]), ("lora", _nano_30b_lora())):
        launch, plan = _plan(NANO_30B_A3B, p)
        out.append((f"card-30b-a3b-{item}", plan, launch))
    stage = LongContextStage(tokens=50 * 32768 * 8, data=LongContextDataConfig(
        lengths=[LengthShare(length=32768, share=1.0)], global_batch_tokens=8 * 32768, micro_batch_tokens=32768))
    launch = _launch(NANO_4B["sft_32k"])
    plan = plan_long_context(stage, launch, ModelConfig(preset="nemotron-3-nano-4b"), save_dir="/c", blend=BLEND,
                             pretrained_checkpoint="/ck/iter_0000000")
    out.append(("4b-long-context-32k", plan, launch))
    return out


def _recipe_plans() -> list[tuple[str, object, object]]:
    """What the recipe check translates, named by recipe, index and mode, with the stages' launch."""
    from stagewise.recipe import load_recipe

    launch = load_recipe(TINY, [*ON_MEGATRON, *FITS_MEGATRON]).recipe.stages.pretrain.launch
    stages = ("pretrain", "long_context", "sft")
    runs = (("tiny", TINY, [*ON_MEGATRON, *FITS_MEGATRON], stages),
            ("4b-recipe", NANO_4B_RECIPE, [*ON_MEGATRON, *FITS_MEGATRON], stages),
            ("tiny-lora", TINY, [*ON_MEGATRON, *FITS_MEGATRON, LORA], ("sft",)),
            ("4b-recipe-lora", NANO_4B_RECIPE, [*ON_MEGATRON, *FITS_MEGATRON, LORA], ("sft",)))
    return [(f"{prefix}-{i}-{plan.mode}", plan, launch)
            for prefix, recipe, sets, which in runs
            for i, plan in enumerate(_checked_plans(recipe, sets, which))]


def _entry(name: str, plan, launch) -> dict:
    """One plan as validate_plans.py reads it, with what to read back from the validated config."""
    read = READ + (READ_SFT if plan.mode != "pretrain" else READ_PRETRAIN) \
        + (READ_LORA if plan.mode == "lora" else []) + (READ_HUB if plan.recipe in HUB_RECIPES else []) \
        + (READ_TOKENIZER if "tokenizer.tokenizer_model" in plan.overrides else [])
    return {"name": name, "argv": plan.argv()[2:], "world_size": launch.gpus, "read": read,
            "recipe": plan.recipe, "plan": plan, "launch": launch}


def _probes(card: dict[str, dict], probe_cache: Path | None) -> list[dict]:
    """Plans the release must refuse: the translation's former SFT and LoRA text, and a world size
    the global batch does not divide among its data-parallel ranks; and the 30B-A3B SFT plan against
    `probe_cache` (hub_cache with PROBE_VOCAB), whose vocabulary the validated model must carry."""
    sft, lora, pre = card["card-4b-sft"], card["card-4b-lora"], card["card-4b-pretrain"]
    dict_specs = [a if not a.startswith("dataset.offline_packing_specs=") else
                  "dataset.offline_packing_specs={packed_sequence_size:2048,pad_seq_to_mult:1}" for a in sft["argv"]]
    no_append = [a.removeprefix("+") if a.startswith("+peft.") else a for a in lora["argv"]]
    return [{"name": "probe-dict-packing-specs", "argv": dict_specs, "world_size": 8},
            {"name": "probe-peft-without-append", "argv": no_append, "world_size": 8},
            {"name": "probe-batch-over-12-ranks", "argv": pre["argv"], "world_size": 12},
            {"name": "probe-hub-other-vocab", "argv": card["card-30b-a3b-sft"]["argv"], "world_size": 8,
             "read": READ_HUB, **({"hf_hub_cache": str(probe_cache)} if probe_cache else {})}]


def all_plans(probe_cache: Path | None = None) -> list[dict]:
    """Every plan above, then the probes."""
    plans = [_entry(*t) for t in _recipe_plans() + _card_plans()]
    return plans + _probes({e["name"]: e for e in plans}, probe_cache)


def stage_plans(checkpoint: Path, root: Path) -> list[dict]:
    """An SFT sub-stage and a long-context block planned by engines/megatron/stage.py itself on real
    directories (the MegatronPlans captured as _checked_plans captures them), each with its tokenizer
    to build and `tokenizer_dir`, the directory the stage was given as tokenizer; then the probe: the
    SFT plan's text with that directory itself as `tokenizer.tokenizer_model`.

    SFT: the chat start our SFT stage makes of `checkpoint` (data.sft_assembly.make_chat_start, as
    tasks/sft_data.py's sft_start_task), as start checkpoint and chat tokenizer; long context:
    `checkpoint`, as pretraining hands it on. No MLflow run (mlflow=None): Megatron-Bridge's logger
    config imports mlflow when one is named, and the side environment is built without it (megatron-bridge
    0.6.2 requires mlflow, but dev.py installs it with --no-deps and MEGATRON_PINS leaves mlflow out)."""
    from stagewise.data.long_context_config import LengthShare, LongContextDataConfig
    from stagewise.data.sft_assembly import make_chat_start
    from stagewise.engines.hydra_overrides import hydra_value
    from stagewise.engines.megatron import stage, translate
    from stagewise.model.config import ModelConfig
    from stagewise.recipe import SFTSubStage, load_recipe
    from stagewise.recipe.blocks.long_context import LongContextStage

    launch = load_recipe(TINY, [*ON_MEGATRON, *FITS_MEGATRON]).recipe.stages.pretrain.launch
    chat = root / "chat-start"
    chat.mkdir(parents=True)
    make_chat_start(checkpoint, chat)
    sub = SFTSubStage(name="stage1", tokens=2 * 4 * 512, seq_length=512, global_batch=4, micro_batch=1,
                      blend={"weights": {"arithmetic": 1}}, precision="bf16")
    lc = LongContextStage(tokens=2 * 4 * 512, precision="bf16", data=LongContextDataConfig(
        lengths=[LengthShare(length=512, share=1.0)], global_batch_tokens=4 * 512, micro_batch_tokens=2 * 512))
    made, plan_megatron = [], translate.plan_megatron

    def record(*a, **kw):
        made.append(plan_megatron(*a, **kw))
        return made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(translate, "plan_megatron", record)
        steps = [stage.sft_plan(sub, ModelConfig(preset=None, **{"from": str(chat)}), launch, str(chat), str(chat),
                                root / "sft" / "megatron-data", root / "sft", 3, None, field="stages.sft.stages[0]"),
                 stage.long_context_plan(lc, ModelConfig(preset=None, **{"from": str(checkpoint)}), launch,
                                         str(checkpoint), root / "lc", 3, None, [(str(root / "indexed" / "web"), 1.0)])]
    out = []
    for name, given, plan, engine_plan in zip(("stage-sft", "stage-long-context"), (chat, checkpoint), made, steps):
        assert engine_plan.steps[1].entry == plan.argv()  # the captured plan is the one its train step runs
        out.append({**_entry(name, plan, launch), "tokenizer": TOKENIZER_PROBE, "tokenizer_dir": str(given)})
    # the published 4B SFT run with the chat tokenizer: the 4B recipes pin a Hub revision in the
    # tokenizer's arguments, which the plan's must replace (the 30B-A3B recipes above have none)
    from tests.engines.megatron.test_megatron_translate import NANO_4B, SFT_DATA, _block, _launch

    card = NANO_4B["sft"]
    plan = translate.plan_sft(_block(card), _launch(card), ModelConfig(preset="nemotron-3-nano-4b"),
                              save_dir=root / "4b" / "megatron", pretrained_checkpoint=root / "4b" / "import",
                              dataset="local-jsonl", dataset_overrides=SFT_DATA,
                              tokenizer=stage.run_tokenizer(chat, root / "4b"))
    out.append({**_entry("tokenizer-4b-sft", plan, _launch(card)), "tokenizer": TOKENIZER_PROBE,
                "tokenizer_dir": str(chat)})
    key = "tokenizer.tokenizer_model="
    raw = [a if not a.startswith(key) else key + hydra_value(str(chat)) for a in out[0]["argv"]]
    assert raw != out[0]["argv"]
    kwargs = ["tokenizer.hf_tokenizer_kwargs=null", "+tokenizer.hf_tokenizer_kwargs={use_fast:true}"]
    i = out[0]["argv"].index(kwargs[0])
    assert out[0]["argv"][i:i + 2] == kwargs
    assigned = [*out[0]["argv"][:i], "tokenizer.hf_tokenizer_kwargs={use_fast:true}", *out[0]["argv"][i + 2:]]
    return out + [{"name": "probe-raw-checkpoint-tokenizer", "argv": raw, "world_size": launch.gpus,
                   "tokenizer": TOKENIZER_PROBE, "tokenizer_dir": str(chat)},
                  {"name": "probe-tokenizer-kwargs-assigned", "argv": assigned, "world_size": launch.gpus}]


@pytest.fixture(scope="module")
def validated(megatron_python: Path, tiny_checkpoint, tmp_path_factory) -> tuple[list[dict], dict[str, dict], float]:
    """(the plans, validate_plans.py's result per name, the seconds the one subprocess took).
    The subprocess starts first (its imports are most of its time) and gets the plans on stdin once
    the Hub caches are written; it reads no plan before that."""
    root = tmp_path_factory.mktemp("plans")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(root / "hf-home"),
           "HF_HUB_CACHE": str(root / "hf-home" / "hub"), "MEGATRON_CONFIG_LOCK_DIR": str(root / "locks")}
    t0 = time.monotonic()
    side = subprocess.Popen([str(megatron_python), str(SCRIPT), "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        hub_cache(Path(env["HF_HUB_CACHE"]))
        plans = all_plans(hub_cache(root / "probe-hub", vocab_size=PROBE_VOCAB))
        plans += stage_plans(tiny_checkpoint, root / "stage")
        text = json.dumps([{k: p[k] for k in ("name", "argv", "world_size", "read", "hf_hub_cache", "tokenizer")
                            if k in p} for p in plans], indent=1)
        (root / "plans.json").write_text(text)  # kept for a rerun by hand: validate_plans.py plans.json
        out, err = side.communicate(text, timeout=600)
    finally:
        if side.poll() is None:
            side.kill()
            side.communicate()
    seconds = time.monotonic() - t0
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"plan"')]
    assert side.returncode == 0 and len(lines) == len(plans), err[-4000:]
    return plans, {r["plan"]: r for r in lines}, seconds


def test_the_plan_set_is_every_block_kind_on_every_recipe():
    plans = [p for p in all_plans() if not p["name"].startswith("probe-")]
    names = {p["name"] for p in plans}
    assert {p["recipe"] for p in plans} == {
        "nemotron_3_nano_4b_pretrain_8gpu_h100_bf16_config", "nemotron_3_nano_4b_sft_8gpu_h100_bf16_config",
        "nemotron_3_nano_4b_sft_8gpu_h100_bf16_32k_config", "nemotron_3_nano_4b_peft_8gpu_h100_bf16_config",
        "nemotron_3_nano_pretrain_8gpu_h100_bf16_config", *HUB_RECIPES}
    assert {"tiny-0-pretrain", "tiny-1-pretrain", "tiny-2-sft", "tiny-3-sft",
            "tiny-lora-0-lora", "tiny-lora-1-sft"} <= names
    assert {"4b-recipe-0-pretrain", "4b-recipe-1-pretrain", "4b-recipe-2-sft", "4b-recipe-3-sft",
            "4b-recipe-lora-0-lora", "4b-recipe-lora-1-sft"} <= names
    assert {f"card-4b-{i}" for i in ("pretrain", "sft", "sft_32k", "lora")} <= names
    assert {f"card-30b-a3b-{i}" for i in ("pretrain", "sft", "lora")} <= names
    hub = {p["name"]: p["recipe"] for p in plans if p["recipe"] in HUB_RECIPES}
    assert hub == {"tiny-2-sft": HUB_RECIPES[0], "tiny-3-sft": HUB_RECIPES[0], "tiny-lora-0-lora": HUB_RECIPES[1],
                   "tiny-lora-1-sft": HUB_RECIPES[0], "card-30b-a3b-sft": HUB_RECIPES[0],
                   "card-30b-a3b-lora": HUB_RECIPES[1]}


def test_every_plan_passes_the_released_validate(validated):
    plans, got, seconds = validated
    failed = {p["name"]: f'{got[p["name"]]["error"]}: {got[p["name"]]["message"]}'
              for p in plans if not p["name"].startswith("probe-") and not got[p["name"]]["ok"]}
    assert failed == {}
    print(f"{len(plans)} plans through Megatron-Bridge in {seconds:.1f} s")


def test_the_release_reads_each_plan_as_the_plan_means_it(validated):
    plans, got, _ = validated
    for p in plans:
        if p["name"].startswith("probe-"):
            continue
        o, read = p["plan"].overrides, got[p["name"]]["read"]
        assert read["model.seq_length"] == read["dataset.seq_length"] == o["dataset.seq_length"], p["name"]
        assert read["train.train_iters"] == p["plan"].train_iters, p["name"]
        assert read["data_parallel_size"] == p["launch"].data_parallel, p["name"]
        if p["plan"].mode == "pretrain":
            assert read["dataset"] == "GPTDatasetConfig", p["name"]
            # our indexed data, all of it the training split (translate.TRAIN_ONLY_SPLIT): no validation
            # or test dataset is built, none of our documents held back
            assert read["dataset.split"] == o["dataset.split"] == "1,0,0", p["name"]
            assert read["dataset.split_matrix"] == [[0, 1.0], None, None], p["name"]
        else:
            assert read["dataset"] == "GPTSFTDatasetConfig", p["name"]
            assert read["dataset.offline_packing_specs"] == "PackedSequenceSpecs", p["name"]
            assert read["dataset.offline_packing_specs.packed_sequence_size"] == o["dataset.seq_length"], p["name"]
        if p["name"].startswith(("4b-recipe-", "tiny-", "stage-")) and p["plan"].mode != "pretrain":
            assert read["dataset.preprocessing"] == "ChatSFTPreprocessingConfig", p["name"]  # chat_jsonl_overrides


def test_the_hub_recipes_build_the_cached_architecture(validated):
    """The model of a Hub recipe is the cached config's (our preset), under the plan's own fields."""
    from stagewise.model.presets import preset_kwargs

    plans, got, _ = validated
    preset = preset_kwargs(NANO_30B_A3B)
    hub = [p for p in plans if p.get("recipe") in HUB_RECIPES]
    assert len(hub) == 7  # with stage-sft (the tiny shape, from the chat start's config)
    for p in hub:
        o, read = p["plan"].overrides, got[p["name"]]["read"]
        pattern = o.get("model.hybrid_layer_pattern", preset["hybrid_override_pattern"])
        assert read["model.vocab_size"] == o.get("model.vocab_size", preset["vocab_size"]), p["name"]
        assert (read["model.hybrid_layer_pattern"], read["model.num_layers"]) == (pattern, len(pattern)), p["name"]
    card = got["card-30b-a3b-sft"]["read"]
    assert (card["model.vocab_size"], card["model.num_layers"]) == (131072, 52)
    tiny = got["tiny-2-sft"]["read"]  # the plan's shape, over the recipe's
    assert (tiny["model.vocab_size"], tiny["model.hybrid_layer_pattern"]) == (4096, "M*EM-E")


def test_the_published_packing_and_the_recipe_lora_arrive_as_written(validated):
    _, got, _ = validated
    packing = {name: (got[name]["read"]["dataset.offline_packing_specs.packed_sequence_size"],
                      got[name]["read"]["dataset.offline_packing_specs.pad_seq_to_mult"])
               for name in ("card-4b-sft", "card-4b-sft_32k", "card-4b-lora")}
    assert packing == {"card-4b-sft": (2048, 1), "card-4b-sft_32k": (32768, 4), "card-4b-lora": (2048, 4)}
    lora = got["4b-recipe-lora-0-lora"]["read"]
    assert (lora["peft"], lora["peft.dim"], lora["peft.alpha"], lora["peft.dropout"]) == ("LoRA", 4, 8, 0.05)
    assert lora["peft.target_modules"] == ["linear_qkv", "linear_proj", "in_proj", "linear_fc1", "linear_fc2"]
    card = got["card-4b-lora"]["read"]
    assert (card["peft.dim"], card["peft.alpha"], card["peft.dropout"], card["peft.target_modules"]) == (
        8, 16, 0.0, ["linear_qkv", "linear_proj"])


def test_the_moe_sft_and_lora_arrive_as_written(validated):
    """Tiny's SFT and LoRA sub-stages and the 30B-A3B runs on the Hub recipes: packing, LoRA shape and
    the MoE targets (routed experts left out) as the plan writes them, not the recipe's defaults."""
    _, got, _ = validated
    packing = {name: (got[name]["read"]["dataset.offline_packing_specs.packed_sequence_size"],
                      got[name]["read"]["dataset.offline_packing_specs.pad_seq_to_mult"])
               for name in ("tiny-2-sft", "tiny-3-sft", "tiny-lora-0-lora", "card-30b-a3b-sft", "card-30b-a3b-lora")}
    assert packing == {"tiny-2-sft": (512, 4), "tiny-3-sft": (4096, 4), "tiny-lora-0-lora": (512, 4),
                       "card-30b-a3b-sft": (2048, 1), "card-30b-a3b-lora": (2048, 1)}
    lora = got["tiny-lora-0-lora"]["read"]
    assert (lora["peft"], lora["peft.dim"], lora["peft.alpha"], lora["peft.dropout"]) == ("LoRA", 4, 8, 0.05)
    assert lora["peft.target_modules"] == [
        "linear_qkv", "linear_proj", "in_proj", "*.mlp.linear_fc1", "*.mlp.shared_experts.linear_fc1",
        "*.mlp.linear_fc2", "*.mlp.shared_experts.linear_fc2"]
    card = got["card-30b-a3b-lora"]["read"]
    assert (card["peft"], card["peft.dim"], card["peft.alpha"], card["peft.dropout"], card["peft.target_modules"]) == (
        "LoRA", 32, 32, 0.0, ["linear_qkv", "linear_proj"])  # the recipe's six modules are not the plan's


def test_the_check_refuses_what_the_release_refuses(validated):
    _, got, _ = validated
    probe = {name: (r["ok"], r.get("error"), r.get("message", "")) for name, r in got.items()
             if name.startswith("probe-")}
    ok, error, message = probe["probe-dict-packing-specs"]
    assert (ok, error) == (False, "ScriptWouldChange") and "offline_packing_specs" in message and "dict" in message
    ok, error, message = probe["probe-peft-without-append"]
    assert (ok, error) == (False, "OverridesError") and "Could not override 'peft.dim'" in message
    ok, error, message = probe["probe-batch-over-12-ranks"]
    assert not ok and "1024" in message, message
    # the tokenizer arguments as the translation used to write them, on a 30B-A3B recipe (stage-sft)
    ok, error, message = probe["probe-tokenizer-kwargs-assigned"]
    assert (ok, error) == (False, "OverridesError") and "Could not override 'tokenizer.hf_tokenizer_kwargs'" in message


def test_the_hub_recipes_read_the_cache_we_wrote(validated):
    """The same 30B-A3B SFT plan against a cache whose config has PROBE_VOCAB: the model follows it."""
    _, got, _ = validated
    probe, card = got["probe-hub-other-vocab"], got["card-30b-a3b-sft"]
    assert probe["ok"], probe
    assert (probe["read"]["model.vocab_size"], card["read"]["model.vocab_size"]) == (PROBE_VOCAB, 131072)
    assert probe["read"]["model.hybrid_layer_pattern"] == card["read"]["model.hybrid_layer_pattern"]


def test_the_stage_plans_tokenizer_builds_as_ours_reads_it(validated):
    """SFT and long context hand the run a tokenizer directory the release's own build reads
    (hf_config.megatron_tokenizer_dir's copy beside the run), and it is the stage's tokenizer: the
    vocabulary, end of document, ids and chat rendering our transformers gives the same directory."""
    from transformers import AutoTokenizer

    plans, got, _ = validated
    stage = [p for p in plans if p["name"].startswith(("stage-", "tokenizer-"))]
    assert [p["name"] for p in stage] == ["stage-sft", "stage-long-context", "tokenizer-4b-sft"]
    for p in stage:
        assert got[p["name"]]["ok"], got[p["name"]]
        read, built = got[p["name"]]["read"], got[p["name"]]["tokenizer"]
        assert built["ok"], built
        # exactly the plan's arguments (the 4B recipe's pinned Hub revision gone, the 30B-A3B's empty
        # mapping given one), and the plan's directory
        assert read["tokenizer.hf_tokenizer_kwargs"] == {"use_fast": True}, p["name"]
        assert read["tokenizer.tokenizer_model"] == built["path"] == p["plan"].overrides["tokenizer.tokenizer_model"]
        assert Path(built["path"]).name == "megatron-tokenizer" and built["path"] != p["tokenizer_dir"]
        ours = AutoTokenizer.from_pretrained(p["tokenizer_dir"])
        assert (built["vocab_size"], built["eod"]) == (len(ours), ours.eos_token_id), p["name"]
        if p["plan"].mode == "pretrain":  # the pretrain recipes derive the model's from the tokenizer, padded
            assert built["model_vocab"] == [len(ours), True], p["name"]  # (their use_tokenizer_vocab_size)
        else:  # SFT keeps the model's: the 4B recipe's own, else the shape's (the checkpoint's config)
            vocab = p["plan"].overrides.get("model.vocab_size", 131072)
            assert built["model_vocab"] == [vocab, False] and vocab >= len(ours), p["name"]
        assert built["ids"] == ours.encode(TOKENIZER_PROBE["text"], add_special_tokens=False), p["name"]
        chat = ours.apply_chat_template(TOKENIZER_PROBE["messages"], tokenize=False) if ours.chat_template else None
        assert built["chat"] == chat, p["name"]
    assert "<|im_start|>" in got["stage-sft"]["tokenizer"]["chat"]  # the chat start's template
    assert got["stage-long-context"]["tokenizer"]["chat"] is None  # a pretrained checkpoint: none yet


def test_the_release_refuses_a_checkpoint_of_ours_as_the_tokenizer(validated):
    """The probe: the stage-sft text with the chat start itself as tokenizer.tokenizer_model. The config
    validates (nothing reads the tokenizer before training), then the tokenizer build refuses our
    config.json: the failure the stage's run would have hit at its start."""
    _, got, _ = validated
    probe = got["probe-raw-checkpoint-tokenizer"]
    assert probe["ok"], probe
    built = probe["tokenizer"]
    assert not built["ok"] and built["error"] == "ValueError", built
    assert "layers_block_type" in built["message"] and "invalid types" in built["message"], built["message"]
