"""Tokenizer: special-token ids per CONTRACTS.md, HF save/load, byte-level round trip, caps."""

import pytest
from transformers import AutoTokenizer

from stagewise.data.config import TokenizerConfig
from stagewise.data.tokenizer import SPECIAL_TOKENS, build_tokenizer, capped, train_bpe

CORPUS = ["The heron nests by the river in Velmora, founded in 1482.",
          "def add(a, b):\n    return a + b\n", "Compute 4738 + 2956.\nAnswer: 7694",
          "Ünïcödé — ok ✓ 日本語"] * 30


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    cfg = TokenizerConfig(vocab_size=400)
    return build_tokenizer(cfg, {"a": lambda: CORPUS[:60], "b": lambda: CORPUS[60:]}, out.parent, out)


def test_special_token_ids(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == SPECIAL_TOKENS
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 3 and tok.convert_tokens_to_ids("</tool_response>") == 10
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [3]
    assert 300 <= len(tok) <= 400


@pytest.mark.parametrize("text", ["The heron nests.", "  indented\n\tcode()", "Ünïcödé — 日本語 ✓ 🦜", "12345"])
def test_round_trip(tok_dir, text):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert 1 not in ids and 2 not in ids  # no bos/eos added implicitly


def test_digits_are_split(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert [t.lstrip("Ġ") for t in tok.tokenize("4738")] == ["4", "7", "3", "8"]


def test_existing_tokenizer_is_copied(tok_dir, tmp_path):
    cfg = TokenizerConfig(path=tok_dir.name)
    out = build_tokenizer(cfg, {}, tok_dir.parent, tmp_path / "copy")
    a, b = AutoTokenizer.from_pretrained(tok_dir), AutoTokenizer.from_pretrained(out)
    assert a.get_vocab() == b.get_vocab() and b.eos_token_id == 2
    with pytest.raises(ValueError, match="is not a directory"):
        build_tokenizer(TokenizerConfig(path="missing"), {}, tmp_path, tmp_path / "x")


def test_capped_shares_the_budget():
    got = list(capped([["a" * 10] * 10, ["b" * 10] * 10], max_chars=50))
    assert sum(len(t) for t in got if t[0] == "a") == 25
    assert sum(len(t) for t in got if t[0] == "b") == 25
    got = list(capped([["a" * 5], ["b" * 10] * 10], max_chars=50))  # what a leaves, b may use
    assert sum(map(len, got)) == 50


def test_train_bpe_unknown_source_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown sources"):
        build_tokenizer(TokenizerConfig(train_sources=["zzz"]), {"a": lambda: CORPUS}, tmp_path, tmp_path / "t")
    assert len(train_bpe(CORPUS, 320)) <= 320
