"""Recipe block -> Megatron-Bridge run: the published Nano 4B and Nano 30B-A3B settings, field by field.

The expected values below are copied from upstream, not computed: NVIDIA-NeMo/Megatron-Bridge at
commit 067f987df03b8355b03192d88d70f1709fedf51a,
- examples/model_verification_cards/nemotron-3-nano-4b/card.yaml (the H100 pretrain, sft,
  sft_long_context and peft commands) and src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano_4b.py
  (what the commands leave to the recipe: GBS/MBS, weight decay, packing pad, LoRA shape);
- src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py with recipes/common.py and
  recipes/utils/optimizer_utils.py for the 30B-A3B defaults (its card has no verified H100 run).
Each case writes the published run as one of our recipe blocks (tokens = the steps' worth, our
schedule) and checks the translation against the published table.

Where the override *text* must differ from the card's for the pinned release (megatron-bridge
0.6.2, engines/megatron/release.py) to accept it, the expected text is the release's: the packing
specs as a `_target_` node of PackedSequenceSpecs (the `--dataset` presets leave the field None and a
plain mapping stays a dict, which ConfigContainer.validate() refuses), and the LoRA fields as Hydra
appends `+peft.*` (the PEFT recipe's LoRA object is kept out of the OmegaConf tree, and its error says
"To append to your config use +peft.dim=8"). test_real_plans.py runs both through the release.
"""

from __future__ import annotations

import json

import pytest

from stagewise.engines.config import EngineEnv, LaunchConfig, Parallelism
from stagewise.engines.megatron.translate import (
    MegatronUnsupported,
    MLflowTarget,
    chat_jsonl_overrides,
    export_argv,
    import_argv,
    imported_checkpoint,
    long_context_train_config,
    plan_long_context,
    plan_megatron,
    plan_sft,
)
from stagewise.model.config import LoRAConfig, ModelConfig, OptimizerConfig, ScheduleConfig, TrainConfig
from stagewise.model.presets import preset_kwargs

ENV = EngineEnv(image="nvcr.io/nvidia/nemo:26.08", workdir="/opt/Megatron-Bridge")
RUN = "/runs/r"
BLEND = [("/runs/r/data/megatron/web", 1.0)]
SFT_DATA = {"dataset.dataset_root": "/runs/r/data/sft-megatron"}

# --------------------------------------------------------------------------- the published tables

# Nano 4B, 1 node x 8 H100, bf16, 100 steps (card.yaml items; GBS/MBS and the rest from the recipe file).
NANO_4B = {
    "pretrain": dict(
        recipe="nemotron_3_nano_4b_pretrain_8gpu_h100_bf16_config", mode="pretrain",
        tp=1, pp=1, cp=1, dp=8, sp=False, seq=4096, gbs=1024, mbs=1, micro_batches=128, iters=100,
        lr=3e-4, min_lr=3e-5, warmup=40, decay="cosine", decay_iters=100, save_interval=50,
        packing=None, rng_seed=1234, data_seed=1234, betas=(0.9, 0.95), eps=1e-8, wd=0.033, clip=1.0),
    "sft": dict(
        recipe="nemotron_3_nano_4b_sft_8gpu_h100_bf16_config", mode="sft",
        tp=1, pp=1, cp=1, dp=8, sp=False, seq=2048, gbs=32, mbs=1, micro_batches=4, iters=100,
        lr=5e-6, min_lr=0.0, warmup=10, decay="cosine", decay_iters=100, save_interval=100,
        packing=(2048, 1), rng_seed=5678, data_seed=1234, betas=(0.9, 0.95), eps=1e-8, wd=0.033, clip=1.0),
    "sft_32k": dict(
        recipe="nemotron_3_nano_4b_sft_8gpu_h100_bf16_32k_config", mode="sft",
        tp=2, pp=1, cp=2, dp=2, sp=True, cp_comm="a2a", seq=32768, gbs=8, mbs=1, micro_batches=4, iters=100,
        lr=5e-6, min_lr=0.0, warmup=10, decay="cosine", decay_iters=100, save_interval=100,
        packing=(32768, 4), rng_seed=5678, data_seed=1234, betas=(0.9, 0.95), eps=1e-8, wd=0.033, clip=1.0,
        per_token_loss=True, average_in_collective=False),
    "lora": dict(
        recipe="nemotron_3_nano_4b_peft_8gpu_h100_bf16_config", mode="lora",
        tp=1, pp=1, cp=1, dp=8, sp=False, seq=2048, gbs=32, mbs=1, micro_batches=4, iters=100,
        lr=1e-4, min_lr=0.0, warmup=10, decay="cosine", decay_iters=100, save_interval=100,
        packing=(2048, 4), rng_seed=5678, data_seed=1234, betas=(0.9, 0.95), eps=1e-8, wd=0.033, clip=1.0,
        lora=dict(dim=8, alpha=16, dropout=0.0, targets=["linear_qkv", "linear_proj"])),
}

# Nano 30B-A3B recipe defaults (nemotron_3_nano.py at the commit above; 8 GPUs, TP1 EP8 ETP1).
NANO_30B = {
    "pretrain": dict(
        recipe="nemotron_3_nano_pretrain_8gpu_h100_bf16_config", mode="pretrain",
        tp=1, pp=1, cp=1, ep=8, etp=1, dp=8, sp=False, seq=8192, gbs=1024, mbs=1, micro_batches=128,
        iters=39735, lr=1.6e-3, min_lr=1.6e-5, warmup=333, decay="cosine", decay_iters=39735,
        save_interval=200, packing=None, rng_seed=1234, data_seed=1234, betas=(0.9, 0.95), eps=1e-8,
        wd=0.033, clip=1.0),
    "sft": dict(
        recipe="nemotron_3_nano_sft_8gpu_h100_bf16_config", mode="sft",
        tp=1, pp=1, cp=1, ep=8, etp=1, dp=8, sp=False, seq=2048, gbs=128, mbs=1, micro_batches=16,
        iters=1000, lr=5e-6, min_lr=0.0, warmup=50, decay="cosine", decay_iters=1000, save_interval=200,
        packing=(2048, 1), rng_seed=1234, data_seed=5678, betas=(0.9, 0.95), eps=1e-8, wd=0.1, clip=1.0,
        per_token_loss=True),
}


# --------------------------------------------------------------------------- the same runs as our blocks


def _block(p: dict, **extra) -> TrainConfig:
    """The published run as our TrainConfig: everything in tokens, the schedule ours."""
    per_step = p["seq"] * p["gbs"]
    return TrainConfig(
        tokens=p["iters"] * per_step, seq_length=p["seq"], global_batch=p["gbs"], micro_batch=p["mbs"],
        optimizer=OptimizerConfig(lr=p["lr"], min_lr=p["min_lr"], betas=p["betas"], eps=p["eps"],
                                  weight_decay=p["wd"], grad_clip=p["clip"]),
        schedule=ScheduleConfig(kind="cosine", warmup_tokens=p["warmup"] * per_step),
        precision="bf16", checkpoint_every_tokens=p["save_interval"] * per_step, **extra)


def _launch(p: dict) -> LaunchConfig:
    return LaunchConfig(env=ENV, nodes=1, gpus_per_node=8, parallel=Parallelism(
        tp=p["tp"], pp=p["pp"], cp=p["cp"], ep=p.get("ep", 1), etp=p.get("etp"), sequence_parallel=p["sp"],
        cp_comm_type=p.get("cp_comm")))


def _plan(preset: str, p: dict):
    launch = _launch(p)
    model = ModelConfig(preset=preset)
    common = dict(save_dir=f"{RUN}/megatron/ckpt", seed=p["rng_seed"], data_seed=p["data_seed"])
    if p["mode"] == "pretrain":
        return launch, plan_megatron(_block(p), launch, model, stage_mode="pretrain", blend=BLEND, **common)
    lora = None
    if "lora" in p:
        lora = LoRAConfig(r=p["lora"]["dim"], alpha=p["lora"]["alpha"], dropout=p["lora"]["dropout"],
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    sub = _block(p)
    return launch, plan_megatron(sub, launch, model, stage_mode="sft", lora=lora, normalization="token",
                                 pretrained_checkpoint=f"{RUN}/megatron/import/iter_0000000",
                                 dataset="local-jsonl", dataset_overrides=SFT_DATA, **common)


def _check(launch: LaunchConfig, plan, p: dict) -> None:
    o = plan.overrides
    assert plan.recipe == p["recipe"]
    assert plan.mode == p["mode"]
    assert o["model.tensor_model_parallel_size"] == p["tp"]
    assert o["model.pipeline_model_parallel_size"] == p["pp"]
    assert o["model.context_parallel_size"] == p["cp"]
    assert o["model.expert_model_parallel_size"] == p.get("ep", 1)
    assert o.get("model.expert_tensor_parallel_size") == p.get("etp")
    assert o["model.sequence_parallel"] is p["sp"]
    assert o.get("model.cp_comm_type") == p.get("cp_comm")
    assert launch.data_parallel == p["dp"]
    assert o["dataset.seq_length"] == p["seq"]
    assert o["train.global_batch_size"] == p["gbs"]
    assert o["train.micro_batch_size"] == p["mbs"]
    assert o["train.global_batch_size"] // (o["train.micro_batch_size"] * launch.data_parallel) == p["micro_batches"]
    assert o["train.train_iters"] == plan.train_iters == p["iters"]
    assert o["optimizer.lr"] == p["lr"] and o["optimizer.min_lr"] == p["min_lr"]
    assert (o["optimizer.adam_beta1"], o["optimizer.adam_beta2"]) == p["betas"]
    assert o["optimizer.adam_eps"] == p["eps"] and o["optimizer.clip_grad"] == p["clip"]
    assert o["scheduler.start_weight_decay"] == o["scheduler.end_weight_decay"] == p["wd"]
    assert o["scheduler.lr_warmup_iters"] == p["warmup"]
    assert o["scheduler.lr_decay_style"] == p["decay"]
    assert o["scheduler.lr_decay_iters"] == p["decay_iters"]
    assert o["checkpoint.save_interval"] == p["save_interval"]
    assert o["rng.seed"] == p["rng_seed"]
    if p["packing"] is None:
        assert "dataset.enable_offline_packing" not in o
        assert o["dataset.random_seed"] == p["data_seed"]
    else:
        size, pad = p["packing"]
        assert o["dataset.enable_offline_packing"] is True
        assert o["dataset.offline_packing_specs"] == {"_target_": "megatron.bridge.data.packing.PackedSequenceSpecs",
                                                      "packed_sequence_size": size, "pad_seq_to_mult": pad}
        assert o["dataset.seed"] == p["data_seed"]
    if "per_token_loss" in p:
        assert o["model.calculate_per_token_loss"] is p["per_token_loss"]
    if "average_in_collective" in p:
        assert o["ddp.average_in_collective"] is p["average_in_collective"]
    if "lora" in p:
        lo = p["lora"]
        assert (o["+peft.dim"], o["+peft.alpha"], o["+peft.dropout"]) == (lo["dim"], lo["alpha"], lo["dropout"])
        assert o["+peft.target_modules"] == lo["targets"]
    else:
        assert not any(k.lstrip("+").startswith("peft.") for k in o)


@pytest.mark.parametrize("item", list(NANO_4B))
def test_nano_4b_reproduces_the_verified_card(item):
    p = NANO_4B[item]
    launch, plan = _plan("nemotron-3-nano-4b", p)
    _check(launch, plan, p)
    assert plan.preset == plan.base_preset == "nemotron-3-nano-4b" and not plan.generic
    assert not any(k.startswith("model.hidden_size") or k == "model.num_layers" for k in plan.overrides)


@pytest.mark.parametrize("item", list(NANO_30B))
def test_nano_30b_a3b_reproduces_the_upstream_recipe_defaults(item):
    p = NANO_30B[item]
    launch, plan = _plan("nemotron-3-nano-30b-a3b", p)
    _check(launch, plan, p)
    assert plan.preset == "nemotron-3-nano-30b-a3b" and not plan.generic


def test_the_argv_is_run_recipe_with_the_cards_override_text():
    _, plan = _plan("nemotron-3-nano-4b", NANO_4B["sft"])
    argv = plan.argv()
    assert argv[:8] == ["python", "scripts/training/run_recipe.py", "--recipe",
                        "nemotron_3_nano_4b_sft_8gpu_h100_bf16_config", "--mode", "sft", "--dataset", "local-jsonl"]
    # verbatim from the card's sft command
    for text in ("dataset.enable_offline_packing=true",
                 "rng.seed=5678", "dataset.seed=1234", "scheduler.lr_decay_iters=100",
                 "validation.eval_iters=0", "validation.eval_interval=0"):
        assert text in argv
    # the card's convenience options, as the dotted keys run_recipe.py turns them into
    for text in ("train.train_iters=100", "dataset.seq_length=2048", "optimizer.lr=5e-06", "optimizer.min_lr=0.0",
                 "scheduler.lr_warmup_iters=10", "checkpoint.save_interval=100",
                 'checkpoint.pretrained_checkpoint="/runs/r/megatron/import/iter_0000000"',
                 'checkpoint.save="/runs/r/megatron/ckpt"'):
        assert text in argv
    # the card's `dataset.offline_packing_specs={packed_sequence_size:2048,pad_seq_to_mult:1}` names the
    # class, so the release's override processing builds it rather than leaving a dict
    assert ('dataset.offline_packing_specs={_target_:"megatron.bridge.data.packing.PackedSequenceSpecs",'
            'packed_sequence_size:2048,pad_seq_to_mult:1}') in argv
    assert 'dataset.dataset_root="/runs/r/data/sft-megatron"' == argv[-1]
    assert "dataset.split" not in plan.overrides  # SFT reads its rows (local-jsonl), not indexed data
    _, lc = _plan("nemotron-3-nano-4b", NANO_4B["sft_32k"])
    for text in ("model.sequence_parallel=true", "model.cp_comm_type=\"a2a\"", "model.calculate_per_token_loss=true",
                 "ddp.average_in_collective=false", "model.tensor_model_parallel_size=2",
                 "model.context_parallel_size=2",
                 'dataset.offline_packing_specs={_target_:"megatron.bridge.data.packing.PackedSequenceSpecs",'
                 'packed_sequence_size:32768,pad_seq_to_mult:4}'):
        assert text in lc.argv()
    # the card's LoRA shape, appended to the recipe's LoRA object (a plain `peft.dim=8` finds no key)
    _, lora = _plan("nemotron-3-nano-4b", NANO_4B["lora"])
    assert lora.argv()[:6] == ["python", "scripts/training/run_recipe.py", "--recipe",
                               "nemotron_3_nano_4b_peft_8gpu_h100_bf16_config", "--mode", "lora"]
    for text in ("+peft.dim=8", "+peft.alpha=16", "+peft.dropout=0.0", '+peft.target_modules=["linear_qkv","linear_proj"]',
                 'dataset.offline_packing_specs={_target_:"megatron.bridge.data.packing.PackedSequenceSpecs",'
                 'packed_sequence_size:2048,pad_seq_to_mult:4}'):
        assert text in lora.argv()
    assert not any(a.startswith("peft.") for a in lora.argv())


def test_pretrain_blend_selects_the_indexed_dataset():
    _, plan = _plan("nemotron-3-nano-4b", NANO_4B["pretrain"])
    assert plan.dataset == "megatron-indexed"
    assert 'dataset.blend=[["/runs/r/data/megatron/web"],[1.0]]' in plan.argv()
    # all of it the training split: the preset's "9999,8,2" would hold documents back for splits we
    # never evaluate, and hang the data build on a prefix of fewer than ~2,500 documents
    assert plan.overrides["dataset.split"] == "1,0,0" and 'dataset.split="1,0,0"' in plan.argv()
    assert "checkpoint.pretrained_checkpoint" not in plan.overrides  # random init, as the card


# --------------------------------------------------------------------------- schedules


def _small(kind="cosine", **sched) -> TrainConfig:
    return TrainConfig(tokens=100 * 64 * 16, seq_length=64, global_batch=16, micro_batch=2, precision="auto",
                       schedule=ScheduleConfig(kind=kind, **sched))


def _tiny_plan(train, **kw):
    launch = kw.pop("launch", LaunchConfig(env=ENV, nodes=1, gpus_per_node=8))
    kw.setdefault("blend", BLEND)
    return plan_megatron(train, launch, ModelConfig(preset="tiny"), stage_mode=kw.pop("stage_mode", "pretrain"),
                         save_dir=f"{RUN}/ckpt", vocab_size=4096, **kw)


def test_wsd_maps_to_megatron_wsd_with_its_decay_style_and_length():
    o = _tiny_plan(_small("wsd", warmup_tokens=5 * 64 * 16, decay="minus_sqrt", decay_fraction=0.2)).overrides
    assert o["scheduler.lr_decay_style"] == "WSD" and o["scheduler.lr_decay_iters"] == 100
    assert o["scheduler.lr_wsd_decay_style"] == "minus_sqrt" and o["scheduler.lr_wsd_decay_iters"] == 20
    assert o["scheduler.lr_warmup_iters"] == 5
    o = _tiny_plan(_small("wsd", decay="linear", decay_tokens=30 * 64 * 16)).overrides
    assert (o["scheduler.lr_wsd_decay_style"], o["scheduler.lr_wsd_decay_iters"]) == ("linear", 30)
    o = _tiny_plan(_small("constant")).overrides
    assert o["scheduler.lr_decay_style"] == "constant" and "scheduler.lr_wsd_decay_iters" not in o


def test_a_schedule_kind_without_a_megatron_style_is_refused_naming_the_field():
    bad = ScheduleConfig.model_construct(kind="step", warmup_tokens=0, decay="minus_sqrt", decay_tokens=None,
                                         decay_fraction=0.2)
    with pytest.raises(MegatronUnsupported, match=r"^stages\.pretrain\.schedule\.kind: .*'step'"):
        _tiny_plan(_small().model_copy(update={"schedule": bad}), field="stages.pretrain")
    bad = ScheduleConfig.model_construct(kind="wsd", warmup_tokens=0, decay="exponential", decay_tokens=None,
                                         decay_fraction=0.2)
    with pytest.raises(MegatronUnsupported, match=r"schedule\.decay"):
        _tiny_plan(_small().model_copy(update={"schedule": bad}))


def test_token_amounts_off_the_step_grid_round_as_our_engine_counts_steps():
    # a step here is 64 x 16 = 1,024 tokens
    o = _tiny_plan(_small().model_copy(update=dict(tokens=100 * 1024 + 1000))).overrides
    assert o["train.train_iters"] == 100  # the budget rounded down (TrainConfig.total_steps)
    o = _tiny_plan(_small().model_copy(update=dict(schedule=ScheduleConfig(kind="cosine", warmup_tokens=1600),
                                                   checkpoint_every_tokens=300))).overrides
    assert o["scheduler.lr_warmup_iters"] == 2 and o["checkpoint.save_interval"] == 1  # nearest, at least 1


@pytest.mark.parametrize("change, field", [
    (dict(precision="fp32"), "stages.pretrain.precision"),
    (dict(global_batch=12, micro_batch=2), "stages.pretrain.global_batch"),
])
def test_untranslatable_settings_are_refused(change, field):
    train = _small().model_copy(update=change)
    with pytest.raises(MegatronUnsupported) as e:
        _tiny_plan(train, field="stages.pretrain")
    assert e.value.field == field


def test_sft_refusals_name_their_field():
    sub = TrainConfig(tokens=10 * 256 * 8, seq_length=256, global_batch=8, micro_batch=1)
    kw = dict(stage_mode="sft", blend=None, dataset="local-jsonl", pretrained_checkpoint="/ck/iter_0000000",
              field="stages.sft.stages[0]")
    with pytest.raises(MegatronUnsupported, match=r"^stages\.sft\.stages\[0\]\.normalization: .*per conversation"):
        _tiny_plan(sub, normalization="conversation", **kw)
    with pytest.raises(MegatronUnsupported, match=r"\.micro_batch: "):
        _tiny_plan(sub.model_copy(update={"micro_batch": 2}), **kw)
    with pytest.raises(MegatronUnsupported, match=r"\.lora\.target_modules: .*linear_qkv"):
        _tiny_plan(sub, lora=LoRAConfig(target_modules=["q_proj", "o_proj"]), **kw)
    with pytest.raises(MegatronUnsupported, match=r"\.lora\.target_modules: .*'gate'"):
        _tiny_plan(sub, lora=LoRAConfig(target_modules=["gate"]), **kw)
    with pytest.raises(MegatronUnsupported, match=r"\.lora\.alpha: "):
        _tiny_plan(sub, lora=LoRAConfig(alpha=16.5), **kw)
    with pytest.raises(MegatronUnsupported, match=r"pretrained_checkpoint"):
        _tiny_plan(sub, **{**kw, "pretrained_checkpoint": None})
    with pytest.raises(MegatronUnsupported, match=r"pass dataset"):
        _tiny_plan(sub, **{**kw, "dataset": None})
    with pytest.raises(MegatronUnsupported, match=r"dataset_overrides"):
        _tiny_plan(sub, dataset_overrides={"train.train_iters": 3}, **kw)


def test_layout_refusals():
    dense = ModelConfig(preset="nemotron-3-nano-4b")
    train = TrainConfig(tokens=10 * 4096 * 64, seq_length=4096, global_batch=64, micro_batch=1)
    ep = LaunchConfig(env=ENV, nodes=1, gpus_per_node=8, parallel=Parallelism(ep=8))
    with pytest.raises(MegatronUnsupported, match=r"^stages\.pretrain\.launch\.parallel\.ep: .*no experts"):
        plan_megatron(train, ep, dense, stage_mode="pretrain", save_dir="/c", blend=BLEND, field="stages.pretrain")
    bare = LaunchConfig(env=EngineEnv(image="img"), nodes=1, gpus_per_node=8)
    with pytest.raises(MegatronUnsupported, match=r"launch\.env\.workdir"):
        plan_megatron(train, bare, dense, stage_mode="pretrain", save_dir="/c", blend=BLEND)
    plan = plan_megatron(train, bare, dense, stage_mode="pretrain", save_dir="/c", blend=BLEND,
                         bridge_root="/opt/mb")
    assert plan.argv()[1] == "/opt/mb/scripts/training/run_recipe.py"
    with pytest.raises(MegatronUnsupported, match=r"mock data"):
        plan_megatron(train, bare, dense, stage_mode="pretrain", save_dir="/c", bridge_root="/opt/mb")
    with pytest.raises(MegatronUnsupported, match=r"^model\.mtp\.num_heads"):
        plan_megatron(train, bare, ModelConfig(preset="nemotron-3-nano-4b", mtp={"num_heads": 1}),
                      stage_mode="pretrain", save_dir="/c", blend=BLEND, bridge_root="/opt/mb")


# --------------------------------------------------------------------------- shapes without their own recipe


def test_tiny_runs_the_moe_base_recipe_with_its_own_provider_fields():
    plan = _tiny_plan(_small())
    assert plan.preset is None and plan.base_preset == "nemotron-3-nano-30b-a3b" and plan.generic
    assert plan.recipe == "nemotron_3_nano_pretrain_8gpu_h100_bf16_config"
    o = plan.overrides
    assert o["model.hybrid_layer_pattern"] == "M*EM-E" and o["model.num_layers"] == 6
    assert (o["model.hidden_size"], o["model.ffn_hidden_size"], o["model.num_query_groups"]) == (128, 512, 2)
    assert (o["model.mamba_num_heads"], o["model.mamba_state_dim"], o["model.mamba_chunk_size"]) == (8, 32, 32)
    assert (o["model.num_moe_experts"], o["model.moe_router_topk"], o["model.vocab_size"]) == (8, 2, 4096)
    assert o["model.share_embeddings_and_output_weights"] is False
    with pytest.raises(MegatronUnsupported, match=r"^model\.preset: .*vocab_size"):
        plan_megatron(_small(), LaunchConfig(env=ENV), ModelConfig(preset="tiny"), stage_mode="pretrain",
                      save_dir="/c", blend=BLEND)


def test_moe_lora_targets_leave_the_routed_experts_out():
    sub = TrainConfig(tokens=10 * 256 * 8, seq_length=256, global_batch=8, micro_batch=1)
    plan = _tiny_plan(sub, stage_mode="sft", blend=None, dataset="local-jsonl", pretrained_checkpoint="/ck",
                      lora=LoRAConfig(r=4, alpha=8))
    assert plan.mode == "lora" and plan.recipe == "nemotron_3_nano_peft_8gpu_h100_bf16_config"
    assert plan.overrides["+peft.target_modules"] == [
        "linear_qkv", "linear_proj", "in_proj", "*.mlp.linear_fc1", "*.mlp.shared_experts.linear_fc1",
        "*.mlp.linear_fc2", "*.mlp.shared_experts.linear_fc2"]


def test_a_from_checkpoint_of_the_4b_shape_gets_the_4b_recipe(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**preset_kwargs("nemotron-3-nano-4b"),
                                                      "architectures": ["NemotronHForCausalLM"]}))
    p = NANO_4B["sft"]
    plan = plan_sft(_block(p).model_copy(), _launch(p), ModelConfig(preset=None, **{"from": str(tmp_path)}),
                    save_dir="/c", pretrained_checkpoint="/ck", dataset="local-jsonl")
    assert plan.preset == "nemotron-3-nano-4b" and plan.recipe == p["recipe"]
    # a 4B-shaped checkpoint with our own 4k vocabulary is another shape: 4B's recipe, fields replaced
    (tmp_path / "config.json").write_text(json.dumps({**preset_kwargs("nemotron-3-nano-4b"), "vocab_size": 4096}))
    plan = plan_sft(_block(p), _launch(p), ModelConfig(preset=None, **{"from": str(tmp_path)}),
                    save_dir="/c", pretrained_checkpoint="/ck", dataset="local-jsonl")
    assert plan.generic and plan.base_preset == "nemotron-3-nano-4b" and plan.overrides["model.vocab_size"] == 4096


def test_a_checkpoint_transformers_saved_reads_as_the_shape_it_is(tmp_path):
    """Recent transformers save `layers_block_type` (a list), not hybrid_override_pattern."""
    from stagewise.model.build import build_hf_config

    build_hf_config(ModelConfig(preset="nemotron-3-nano-4b"), None).save_pretrained(tmp_path)
    assert "hybrid_override_pattern" not in json.loads((tmp_path / "config.json").read_text())
    p = NANO_4B["sft"]
    plan = plan_sft(_block(p), _launch(p), ModelConfig(preset=None, **{"from": str(tmp_path)}),
                    save_dir="/c", pretrained_checkpoint="/ck", dataset="local-jsonl")
    assert plan.preset == "nemotron-3-nano-4b" and not plan.generic
    build_hf_config(ModelConfig(preset="tiny"), 300).save_pretrained(tmp_path)
    plan = plan_sft(_block(p), _launch(p), ModelConfig(preset=None, **{"from": str(tmp_path)}),
                    save_dir="/c", pretrained_checkpoint="/ck", dataset="local-jsonl")
    assert plan.overrides["model.hybrid_layer_pattern"] == preset_kwargs("tiny")["hybrid_override_pattern"]
    assert plan.overrides["model.vocab_size"] == 300


def test_sft_rows_are_read_through_the_chat_preprocessing():
    sub = TrainConfig(tokens=10 * 256 * 8, seq_length=256, global_batch=8, micro_batch=1)
    plan = _tiny_plan(sub, stage_mode="sft", blend=None, dataset="local-jsonl", pretrained_checkpoint="/ck",
                      dataset_overrides=chat_jsonl_overrides("/runs/r/sft/rows"))
    # Hydra 1.3 refuses a dict over the preprocessing node in struct mode, run_recipe.py a bare `~key`:
    # null it, then append the chat config (in this order)
    assert plan.override_args()[-5:] == [
        'dataset.dataset_root="/runs/r/sft/rows"', "dataset.preprocessing=null",
        '+dataset.preprocessing={_target_:"megatron.bridge.data.sft_processing.ChatSFTPreprocessingConfig",'
        'loss_mode:"assistant"}', "dataset.do_validation=false", "dataset.do_test=false"]
    with pytest.raises(MegatronUnsupported, match=r"dataset_overrides"):
        _tiny_plan(sub, stage_mode="sft", blend=None, dataset="local-jsonl", pretrained_checkpoint="/ck",
                   dataset_overrides={"+train.train_iters": 3})


def test_long_context_is_pretraining_at_its_single_length():
    from stagewise.data.long_context_config import LengthShare, LongContextDataConfig
    from stagewise.recipe.blocks.long_context import LongContextStage

    stage = LongContextStage(tokens=50 * 32768 * 8, data=LongContextDataConfig(
        lengths=[LengthShare(length=32768, share=1.0)], global_batch_tokens=8 * 32768, micro_batch_tokens=32768))
    launch = _launch(NANO_4B["sft_32k"])
    plan = plan_long_context(stage, launch, ModelConfig(preset="nemotron-3-nano-4b"), save_dir="/c", blend=BLEND,
                             pretrained_checkpoint="/ck/iter_0000000")
    o = plan.overrides
    assert plan.mode == "pretrain" and plan.recipe == "nemotron_3_nano_4b_pretrain_8gpu_h100_bf16_config"
    assert (o["dataset.seq_length"], o["train.global_batch_size"], o["train.micro_batch_size"]) == (32768, 8, 1)
    assert o["train.train_iters"] == 50 and o["scheduler.lr_decay_style"] == "constant"
    assert o["optimizer.lr"] == o["optimizer.min_lr"] == 3e-4
    assert o["dataset.split"] == "1,0,0"  # our indexed data, all of it trained on, as in pretraining
    mixed = LongContextStage(tokens=10 * 4096, data=LongContextDataConfig(global_batch_tokens=4096))
    with pytest.raises(MegatronUnsupported, match=r"^stages\.long_context\.data\.lengths: .*one sequence length"):
        long_context_train_config(mixed)


def test_a_stage_tokenizer_replaces_the_recipes_tokenizer_and_its_arguments():
    """The stage's directory with exactly {use_fast: true}: nulled, then appended (the 30B-A3B recipes'
    empty mapping refuses a new key, the 4B recipes' would keep their pinned Hub revision; both through
    the release in test_real_plans.py)."""
    args = _tiny_plan(_small(), tokenizer="/runs/r/tokenizer").override_args()
    i = args.index('tokenizer.tokenizer_type="HuggingFaceTokenizer"')
    assert args[i:i + 4] == ['tokenizer.tokenizer_type="HuggingFaceTokenizer"',
                             'tokenizer.tokenizer_model="/runs/r/tokenizer"', "tokenizer.hf_tokenizer_kwargs=null",
                             "+tokenizer.hf_tokenizer_kwargs={use_fast:true}"]
    assert not any(a.startswith("tokenizer.") for a in _tiny_plan(_small()).override_args())  # the recipe's own


# --------------------------------------------------------------------------- logging and checkpoints


def test_mlflow_logs_into_the_stages_own_run():
    target = MLflowTarget(tracking_uri="sqlite:////runs/r/mlflow.db", experiment="demo", run_id="abc123",
                          run_name="pretrain")
    plan = _tiny_plan(_small(), mlflow=target)
    o = plan.overrides
    assert (o["logger.mlflow_tracking_uri"], o["logger.mlflow_experiment"], o["logger.mlflow_run_name"]) == (
        "sqlite:////runs/r/mlflow.db", "demo", "pretrain")
    assert o["logger.mlflow_log_artifacts"] is False
    assert plan.env == {"MLFLOW_TRACKING_URI": "sqlite:////runs/r/mlflow.db", "MLFLOW_RUN_ID": "abc123"}
    assert "logger.mlflow_experiment" not in _tiny_plan(_small()).overrides


def test_checkpoints_cross_through_the_hf_bridge():
    assert import_argv("/runs/r/pretrain/final", "/runs/r/sft/megatron/import") == [
        "python", "scripts/conversion/run_conversion.py", "import", "--device", "cpu",
        "--hf-model", "/runs/r/pretrain/final", "--megatron-path", "/runs/r/sft/megatron/import",
        "--torch-dtype", "bfloat16", "--overwrite"]
    assert imported_checkpoint("/runs/r/sft/megatron/import") == "/runs/r/sft/megatron/import/iter_0000000"
    _, sft = _plan("nemotron-3-nano-4b", NANO_4B["sft"])
    assert sft.final_checkpoint() == "/runs/r/megatron/ckpt/iter_0000100"
    assert export_argv(sft, "/runs/r/pretrain/final", "/runs/r/sft/final", bridge_root="/opt/Megatron-Bridge") == [
        "python", "/opt/Megatron-Bridge/scripts/conversion/run_conversion.py", "export", "--device", "cpu",
        "--hf-model", "/runs/r/pretrain/final", "--megatron-path", "/runs/r/megatron/ckpt/iter_0000100",
        "--hf-path", "/runs/r/sft/final", "--torch-dtype", "bfloat16", "--overwrite"]
    _, lora = _plan("nemotron-3-nano-4b", NANO_4B["lora"])
    assert export_argv(lora, "/runs/r/pretrain/final", "/runs/r/sft/final") == [
        "python", "examples/peft/merge_lora.py", "--lora-checkpoint", "/runs/r/megatron/ckpt/iter_0000100",
        "--hf-model-path", "/runs/r/pretrain/final", "--output", "/runs/r/sft/final",
        "--pretrained", "/runs/r/megatron/import/iter_0000000", "--cpu"]
