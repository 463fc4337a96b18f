"""The model's own reasoning switch: detected from the template or named in the recipe, applied the
model's way (a kwarg, a system-prompt flag), reasoning_off_fraction through it, refused without one;
and our template installed only on a tokenizer that has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from stagewise.data.chat import chat_template, chat_text, install_chat_template, install_chat_template_dir
from stagewise.data.config import TokenizerConfig
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import (
    KwargSwitch,
    NoSwitch,
    SystemFlagSwitch,
    detect_switch,
    resolve_switch,
    switched,
)
from stagewise.data.sft_config import PackingConfig
from stagewise.data.sft_packs import encode, pack_conversations

TEMPLATES = Path(__file__).parent / "templates"
FLAG = SystemFlagSwitch(when_off="/no_think", when_on="/think")
# 20 one-answer conversations; with off_fraction 0.5 and seed 3 these ids are the reasoning-off ones
# (the seeded choice data.chat.reasoning_enabled makes, written out here).
CONVS = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                      {"role": "assistant", "content": f"{i + 1}.", "reasoning_content": "Add one."}]}
         for i in range(20)]
OFF = {"c2", "c4", "c6", "c7", "c8", "c9", "c10", "c13", "c14", "c15", "c17", "c18", "c19"}
HEADER_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture
def with_template(chat_tokenizer_dir):
    def make(name: str):
        tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
        tok.add_tokens(HEADER_TOKENS, special_tokens=True)
        tok.chat_template = (TEMPLATES / name).read_text()
        return tok
    return make


def supervised_text(tok, ids, mask) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_detected_from_the_variable_the_template_reads():
    assert detect_switch(chat_template()) == KwargSwitch(name="reasoning", when_on=True, when_off=False)
    assert detect_switch((TEMPLATES / "chatml_think_kwarg.jinja").read_text()) == KwargSwitch(name="enable_thinking")
    assert detect_switch((TEMPLATES / "chatml_system_flag.jinja").read_text()) == NoSwitch()
    assert detect_switch((TEMPLATES / "llama3_tools.jinja").read_text()) == NoSwitch()
    both = "{% if reasoning %}a{% endif %}{% if enable_thinking %}b{% endif %}"
    assert detect_switch(both).name == "reasoning"  # ours first
    assert detect_switch("{% set enable_thinking = true %}{{ enable_thinking }}") == NoSwitch()  # set, not read
    assert detect_switch(None) == NoSwitch()


def test_the_recipe_names_a_switch_the_template_does_not_show():
    assert TokenizerConfig().reasoning_switch == "auto"
    cfg = TokenizerConfig.model_validate({"reasoning_switch": {"kind": "system_flag", "when_off": "detailed thinking off",
                                                               "when_on": "detailed thinking on"}})
    assert cfg.reasoning_switch == SystemFlagSwitch(when_off="detailed thinking off", when_on="detailed thinking on")
    assert TokenizerConfig.model_validate({"reasoning_switch": {"kind": "none"}}).reasoning_switch == NoSwitch()
    for bad in ({"kind": "system_flag"}, {"kind": "kwarg", "name": "not a name"}, "on", {"kind": "flag"}):
        with pytest.raises(ValidationError):
            TokenizerConfig.model_validate({"reasoning_switch": bad})

    class Tok:  # a tokenizer whose template reads enable_thinking
        chat_template = "{{ enable_thinking }}"

    assert resolve_switch(Tok()) == KwargSwitch(name="enable_thinking")
    assert resolve_switch(Tok(), FLAG) == FLAG  # the recipe overrides detection


def test_switched_writes_reasoning_the_models_way():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "a", "thinking": "b", "reasoning": "c"}]
    assert switched(msgs, KwargSwitch(name="enable_thinking"), True) == (msgs, {"enable_thinking": True})
    off, kwargs = switched(msgs, KwargSwitch(name="mode", when_on="deep", when_off="fast"), False)
    assert kwargs == {"mode": "fast"} and off[2] == {"role": "assistant", "content": "Hello"}  # every trace name
    assert msgs[2]["reasoning_content"] == "a"  # the caller's messages are untouched
    on, kwargs = switched(msgs, FLAG, True)
    assert kwargs == {} and on[0] == {"role": "system", "content": "Be brief.\n\n/think"} and on[2] == msgs[2]
    assert switched(msgs[1:], FLAG, False)[0][0] == {"role": "system", "content": "/no_think"}
    assert switched(msgs, SystemFlagSwitch(when_off="/no_think"), True) == (msgs, {})  # no on flag: nothing
    assert switched(msgs, NoSwitch(), False) == ([msgs[0], msgs[1], {"role": "assistant", "content": "Hello"}], {})


def test_half_off_with_the_models_kwarg(with_template):
    tok = with_template("chatml_think_kwarg.jinja")
    enc = encode(CONVS, tok, off_fraction=0.5, seed=3)
    assert enc.reasoning_off == len(OFF) == 13 and enc.owners == list(range(20))
    for conv, (ids, mask) in zip(CONVS, enc.examples):
        n = int(conv["id"][1:]) + 1
        if conv["id"] in OFF:
            assert supervised_text(tok, ids, mask) == f"{n}.<|im_end|>"
            assert tok.decode(ids).endswith(f"<|im_start|>assistant\n<think>\n\n</think>\n\n{n}.<|im_end|>\n")
        else:
            assert supervised_text(tok, ids, mask) == f"<think>\nAdd one.\n</think>\n\n{n}.<|im_end|>"


def test_half_off_with_a_system_flag(with_template):
    tok = with_template("chatml_system_flag.jinja")
    packed = pack_conversations(CONVS, tok, PackingConfig(pack_size=256), off_fraction=0.5, seed=3, switch=FLAG)
    assert packed.reasoning_off == 13 and packed.to_dict()["conversations"] == 20
    enc = encode(CONVS, tok, off_fraction=0.5, seed=3, switch=FLAG)
    for conv, (ids, mask) in zip(CONVS, enc.examples):
        n = int(conv["id"][1:]) + 1
        flag, answer = ("/no_think", f"{n}.<|im_end|>") if conv["id"] in OFF else \
            ("/think", f"<think>\nAdd one.\n</think>\n{n}.<|im_end|>")
        assert tok.decode(ids).startswith(f"<|im_start|>system\n{flag}<|im_end|>\n<|im_start|>user\n")
        assert supervised_text(tok, ids, mask) == answer


def test_no_switch_and_a_fraction_is_refused_naming_the_field(with_template):
    tok = with_template("llama3_tools.jinja")
    plain = [{**c, "messages": [{k: v for k, v in m.items() if k != "reasoning_content"} for m in c["messages"]]}
             for c in CONVS]
    with pytest.raises(BadInput, match=r"^tokenizer\.reasoning_switch: the chat template of the tokenizer SFT packs "
                                       r"with has no reasoning switch .* reasoning_off_fraction: 0\.5 cannot train"):
        encode(plain, tok, off_fraction=0.5, seed=3)
    assert encode(plain, tok, off_fraction=0.0).reasoning_off == 0
    with pytest.raises(BadInput, match=r"^tokenizer\.reasoning_switch: "):  # a flag template, left on auto
        encode(CONVS, with_template("chatml_system_flag.jinja"), off_fraction=0.5, seed=3)


def test_the_recipe_check_refuses_no_switch_with_a_fraction():
    from stagewise.recipe import RecipeError, load_recipe

    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(tiny, ["tokenizer.reasoning_switch={kind: none}"])
    assert info.value.problems[0].startswith(
        "tokenizer.reasoning_switch: {kind: none}: the model cannot be told reasoning is off, so "
        "stages.sft.stages[0].blend.reasoning_off_fraction 0.5 cannot train")
    assert load_recipe(tiny, ["tokenizer.reasoning_switch={kind: none}", "stages.sft.stages[0].blend.reasoning_off_fraction=0",
                              "stages.sft.stages[1].blend.reasoning_off_fraction=0"]).recipe


def test_the_sft_stage_refuses_once_the_start_tokenizer_is_known(with_template, tmp_path):
    from stagewise.flows.sft import _refuse_without_switch, select
    from stagewise.recipe import load_recipe

    with_template("llama3_tools.jinja").save_pretrained(tmp_path)
    block = select(load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml").recipe)
    with pytest.raises(BadInput, match=r"^tokenizer\.reasoning_switch: the chat template of the SFT start checkpoint "
                                       rf"{tmp_path} has no reasoning switch .*stages\.sft\.stages\[0\]\.blend\."
                                       r"reasoning_off_fraction: 0\.5"):
        _refuse_without_switch(str(tmp_path), block)
    _refuse_without_switch(str(tmp_path), block.model_copy(update={"reasoning_switch": FLAG}))


def test_prompts_say_reasoning_off_the_models_way(with_template, chat_tokenizer):
    prompt = [{"role": "user", "content": "Compute 2 + 3."}]
    think = chat_text(prompt, with_template("chatml_think_kwarg.jinja"), reasoning=False, add_generation_prompt=True)
    assert think == "<|im_start|>user\nCompute 2 + 3.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    flag = chat_text(prompt, with_template("chatml_system_flag.jinja"), reasoning=False, add_generation_prompt=True,
                     switch=FLAG)
    assert flag == "<|im_start|>system\n/no_think<|im_end|>\n<|im_start|>user\nCompute 2 + 3.<|im_end|>\n<|im_start|>assistant\n"
    ours = chat_text(prompt, chat_tokenizer, reasoning=False, add_generation_prompt=True)
    assert ours == "<|im_start|>system\nreasoning: off<|im_end|>\n<|im_start|>user\nCompute 2 + 3.<|im_end|>\n<|im_start|>assistant\n"


def test_a_checkpoints_own_template_is_never_replaced(with_template, tmp_path):
    own = with_template("llama3_tools.jinja")
    assert install_chat_template(own).chat_template == (TEMPLATES / "llama3_tools.jinja").read_text()
    own.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    install_chat_template_dir(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # byte for byte
    bare = with_template("llama3_tools.jinja")
    bare.chat_template = None
    assert install_chat_template(bare).chat_template == chat_template()  # a tokenizer we trained gets ours
