"""check_same_tokenizer (data/tokenizer_match.py): equal tokenizers pass however their files
are formatted; a teacher whose vocabulary, special tokens or chat template differ is refused
with its name, its directory, the differing files and what differs."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from stagewise.data.errors import BadInput
from stagewise.data.tokenizer_match import TokenizerMismatch, check_same_tokenizer

LINES = ["The heron nests by the river in Velmora.", "def add(a, b):\n    return a + b\n",
         "Compute 47 + 29.\nAnswer: 76", "<|im_start|>user\nhello<|im_end|>"] * 20


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A byte-level BPE from data/tokenizer.py's own trainer, with the chat template installed."""
    from stagewise.data.chat import install_chat_template
    from stagewise.data.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("student")
    install_chat_template(train_bpe(LINES, 320)).save_pretrained(out)
    return out


def copy_of(student, tmp_path, name="teacher"):
    out = tmp_path / name
    shutil.copytree(student, out)
    return out


def resave(directory, change):
    tok = AutoTokenizer.from_pretrained(directory)
    change(tok)
    tok.save_pretrained(directory)


def test_same_directory_and_a_copy_pass(student, tmp_path):
    check_same_tokenizer(student, {"self": student})
    check_same_tokenizer(str(student), {"copy": str(copy_of(student, tmp_path)), "again": student})


def test_an_added_token_is_refused_naming_the_teacher_and_tokenizer_json(student, tmp_path):
    teacher = copy_of(student, tmp_path)
    resave(teacher, lambda tok: tok.add_tokens(["zebrafish"]))
    with pytest.raises(TokenizerMismatch) as err:
        check_same_tokenizer(student, {"ok": copy_of(student, tmp_path, "ok"), "math": teacher})
    message = str(err.value)
    assert isinstance(err.value, BadInput)  # the CLI exits 2 on it
    assert f"teacher 'math' ({teacher})" in message and "'ok'" not in message
    assert "tokenizer.json" in message
    n = len(AutoTokenizer.from_pretrained(student).get_vocab())
    assert f"vocab: {n} vs {n + 1} entries" in message and "only in the teacher: 'zebrafish'" in message


def test_a_changed_chat_template_is_refused_naming_its_file(student, tmp_path):
    teacher = copy_of(student, tmp_path)
    template = (teacher / "chat_template.jinja").read_text()
    (teacher / "chat_template.jinja").write_text(template.replace("<|im_start|>", "<|im_start|> "))
    with pytest.raises(TokenizerMismatch, match=r"files that differ: chat_template\.jinja; chat template differs"):
        check_same_tokenizer(student, {"code": teacher})


def test_a_template_inside_tokenizer_config_json_is_compared_too(student, tmp_path):
    """Older transformers keep the chat template in tokenizer_config.json."""
    legacy_student, teacher = copy_of(student, tmp_path, "legacy"), copy_of(student, tmp_path, "legacy_teacher")
    for d, template in ((legacy_student, "{{ messages }}"), (teacher, "{{ messages | length }}")):
        (d / "chat_template.jinja").unlink()
        config = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}, indent=2))
    with pytest.raises(TokenizerMismatch) as err:
        check_same_tokenizer(legacy_student, {"code": teacher})
    assert "files that differ: tokenizer_config.json;" in str(err.value)
    assert "chat template differs (14 vs 23 chars, first at char 12: '}}' vs '| length }}')" in str(err.value)


def test_a_missing_chat_template_names_the_side_without_one(student, tmp_path):
    teacher = copy_of(student, tmp_path)
    (teacher / "chat_template.jinja").unlink()
    with pytest.raises(TokenizerMismatch, match=r"chat_template\.jinja \(only the student's\); chat template: the "
                                                r"teacher has none"):
        check_same_tokenizer(student, {"t": teacher})


def test_reformatted_but_equal_files_pass(student, tmp_path):
    teacher = copy_of(student, tmp_path)
    for name in ("tokenizer_config.json", "tokenizer.json"):
        data = json.loads((teacher / name).read_text())
        reordered = dict(reversed(list(data.items())))
        (teacher / name).write_text(json.dumps(reordered, separators=(",", ":")))
    assert (teacher / "tokenizer_config.json").read_bytes() != (student / "tokenizer_config.json").read_bytes()
    check_same_tokenizer(student, {"t": teacher})


def test_other_special_tokens_are_refused(student, tmp_path):
    teacher = copy_of(student, tmp_path)
    resave(teacher, lambda tok: tok.add_special_tokens({"eos_token": "<|im_end|>"}))
    with pytest.raises(TokenizerMismatch) as err:
        check_same_tokenizer(student, {"t": teacher})
    message = str(err.value)
    assert "special token roles differ: eos_token: '<|eos|>' vs '<|im_end|>'" in message
    assert "tokenizer_config.json" in message
    assert "special tokens (token, id) differ: only the student's: ('<|eos|>', 2); only the teacher's: none" in message


def test_a_directory_without_a_tokenizer_is_bad_input_naming_it(student, tmp_path):
    with pytest.raises(BadInput, match=f"{tmp_path / 'nowhere'}: the teacher 'x''s tokenizer directory does not exist"):
        check_same_tokenizer(student, {"x": tmp_path / "nowhere"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match=f"{tmp_path / 'empty'}: cannot load the teacher 'y''s tokenizer"):
        check_same_tokenizer(student, {"y": tmp_path / "empty"})
