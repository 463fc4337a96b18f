"""The data we write for Megatron, read by the released libraries' own dataset code (side_env/read_data.py).

Pretraining: shards written by our code (data/shards.py), a source tokenized by the tiny checkpoint's
BPE (uint16) and a wide-vocabulary shard (uint32, written as int32), handed over by
write_indexed_dir. megatron-core's IndexedDataset must read exactly our documents, and the
GPTDataset the `megatron-indexed` preset builds over our blend with a pretraining plan's dataset
settings (plan_megatron's blend, seed, sequence length and split; its steps x global batch as the
samples) must train on our token stream: every document (held_out: none, under the plan's split),
every sample a contiguous window of our documents in the order it drew them, as many samples and
tokens as that stream holds. The prefixes are smaller than the preset's own split needs (N_DOCS), so
the build finishing at all shows the plan's split is what the library read.

The corpus build (`stagewise data build`, data/corpus/): its shards are written as indexed datasets
directly, several per source; megatron-core must read each exactly as our reader does, with the
manifest's document and token counts.

SFT: conversations written by write_chat_rows (reasoning on, and off), read by Megatron-Bridge's
GPT SFT builder with the chat preprocessing: the token ids must be ours (data.chat.render) exactly,
and the loss mask ours but for the one difference chat_rows.py names: the newline after each
assistant turn's `<|im_end|>` is supervised there (asserted position by position).

Expected values come from our code (the shards' documents, data.chat.render) or from first
principles (how many samples of `seq_length + 1` tokens a stream holds), never from the side run.
Everything runs in one side-environment process: its import is most of the time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from stagewise.data.chat import render
from stagewise.data.indexed_format import read_indexed
from stagewise.data.sft_assembly import write_jsonl
from stagewise.data.shards import TokenShard, write_shard, write_source_shards
from stagewise.engines.megatron.chat_rows import write_chat_rows
from stagewise.engines.megatron.indexed_data import write_indexed_dir

pytestmark = pytest.mark.megatron

SCRIPT = Path(__file__).resolve().parent / "side_env" / "read_data.py"
SIDE_TIMEOUT_S = 300
N_DOCS = 1000
"""Documents per prefix: fewer than the ~2,500 the preset's own split ("9999,8,2") needs to give its test
split any. Asked for no samples of an empty split (validation off), megatron-core's GPTDataset never
finishes counting its epochs (_get_num_epochs adds 0 tokens an epoch), so under that split the side
run would hang here (until SIDE_TIMEOUT_S); the plan's split (translate.TRAIN_ONLY_SPLIT) builds no
validation or test dataset at all."""
WIDE_VOCAB = 131_072
BLEND = {"facts": 0.7, "wide": 0.3}
SEQ_LENGTH, GLOBAL_BATCH, STEPS, DATA_SEED = 32, 16, 100, 5
SAMPLES = STEPS * GLOBAL_BATCH
"""The plan's training samples: enough that the wide prefix (short documents) is read more than once."""
PRESET_SPLIT = "9999,8,2"
"""The megatron-indexed preset's own split (recipes/utils/dataset_utils.py), which our plans replace."""


def held_out(n_docs: int, split: str) -> int:
    """Documents of a prefix that `split` keeps from training: BlendedMegatronDatasetBuilder gives the
    training split the first round(n * w_train / sum(w)) documents of each prefix (its split
    bookends), the rest to validation and test splits, which our plans never evaluate (validation is
    off). The preset's split holds some back (1 of N_DOCS, 3 of 3,000); the plan's none."""
    weights = [float(w) for w in split.split(",")]
    return n_docs - int(round(n_docs * weights[0] / sum(weights)))


CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"expression": "2 + 3"}'}}
COMPACT_CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"expression":"7*6"}'}}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": {"type": "object"}}}]
CONVS = [
    {"id": "tool-call", "tools": TOOLS, "messages": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "It is 5.", "reasoning_content": "The tool said 5."}]},
    {"id": "multi-turn", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye.", "reasoning_content": "A farewell."}]},
    {"id": "no-system", "messages": [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue.", "reasoning_content": "Any colour will do."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Red."}]},
    {"id": "compact-arguments-and-empty-tool", "tools": TOOLS, "messages": [  # arguments written as given
        {"role": "system", "content": "You calculate."},
        {"role": "user", "content": "7 times 6?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [COMPACT_CALL],
         "reasoning_content": "Use the tool."},
        {"role": "tool"},  # no content: written "" in the row, as the template renders a missing one
        {"role": "assistant", "content": "42."}]},
]


def _documents(shard: TokenShard) -> list[list[int]]:
    return [shard.doc(i).tolist() for i in range(shard.n_docs)]


@pytest.fixture(scope="module")
def pretrain_tokenizer(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint's BPE alone, as data prepare leaves the tokenizer a pretraining plan names (a
    checkpoint directory would not do: the side environment's transformers refuses our config.json)."""
    out = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def shards(pretrain_tokenizer, tmp_path_factory) -> dict[str, TokenShard]:
    """Our shards: short arithmetic facts through write_source_shards (uint16), and a wide-vocabulary
    shard through write_shard (uint32 ids above 65,535), N_DOCS documents each."""
    root = tmp_path_factory.mktemp("shards")
    tok = AutoTokenizer.from_pretrained(pretrain_tokenizer)
    rng = np.random.default_rng(0)
    texts = [f"{a} + {b} = {a + b}" for a, b in rng.integers(0, 1000, size=(N_DOCS, 2))]
    facts = write_source_shards(texts, tok, root / "facts", 0.0, seed=1, name="facts")
    docs = [np.append(rng.integers(3, WIDE_VOCAB, size=int(rng.integers(1, 6))), tok.eos_token_id)
            for _ in range(N_DOCS)]
    wide = write_shard(root / "wide", docs, WIDE_VOCAB, tok.eos_token_id)
    found = {"facts": TokenShard.open(facts.train), "wide": wide}
    assert [found["facts"].tokens.dtype, wide.tokens.dtype] == [np.uint16, np.uint32]
    assert found["facts"].n_docs == wide.n_docs == N_DOCS and int(wide.tokens.max()) > 65_535
    return found


@pytest.fixture(scope="module")
def corpus(pretrain_tokenizer, tmp_path_factory):
    """A corpus build of two JSONL sources in small work units (many shards a source), in process."""
    from stagewise.data.config import SourceConfig
    from stagewise.data.corpus.build import build_corpus
    from stagewise.data.corpus.config import CorpusBuildConfig

    root = tmp_path_factory.mktemp("corpus")
    for name, n in (("sums", 600), ("products", 400)):
        rows = [json.dumps({"text": f"{name} {i}: {i} and {i * 7 % 13} make {i + i * 7 % 13} in all"}) for i in range(n)]
        (root / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    sources = [SourceConfig(name=n, path=f"{n}.jsonl") for n in ("sums", "products")]
    return build_corpus(sources, root, None, pretrain_tokenizer, CorpusBuildConfig(shard_mb=0.01), 0.05, 3,
                        root / "out")


@pytest.fixture(scope="module")
def chat_roots(chat_tokenizer_dir, tmp_path_factory) -> dict[bool, Path]:
    """CONVS through write_chat_rows twice: every conversation with reasoning on, then off."""
    root = tmp_path_factory.mktemp("chat")
    sample = root / "sample.jsonl"
    write_jsonl(sample, [{"domain": "d", "conversation": c} for c in CONVS])
    roots = {True: root / "on", False: root / "off"}
    for on, out in roots.items():
        report = write_chat_rows(sample, chat_tokenizer_dir, 512, 0.0 if on else 1.0, 0, out)
        assert report == {"conversations": len(CONVS), "dropped": 0, "reasoning_off": 0 if on else len(CONVS)}
    return roots


def _run_side(python: Path, request: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env |= {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([str(python), str(SCRIPT), str(request)], capture_output=True, text=True, env=env,
                         timeout=SIDE_TIMEOUT_S, cwd=SCRIPT.parent)
    if run.returncode:
        pytest.fail(f"{SCRIPT.name} exited {run.returncode}:\n{run.stderr[-6000:]}\n{run.stdout[-2000:]}", pytrace=False)
    return json.loads(run.stdout.strip().splitlines()[-1])


def pretrain_plan(prefixes: dict[str, str], tokenizer: Path, save_dir: Path):
    """The plan a pretraining stage on engine megatron makes over these prefixes (plan_megatron, as
    engines/megatron/stage.py's pretrain_plan calls it): STEPS steps of GLOBAL_BATCH x SEQ_LENGTH."""
    from stagewise.engines.config import EngineEnv, LaunchConfig
    from stagewise.engines.megatron.translate import plan_megatron
    from stagewise.model.config import ModelConfig, TrainConfig

    train = TrainConfig(tokens=STEPS * GLOBAL_BATCH * SEQ_LENGTH, seq_length=SEQ_LENGTH, global_batch=GLOBAL_BATCH,
                        micro_batch=2, precision="bf16")
    launch = LaunchConfig(env=EngineEnv(venv="/opt/mb", workdir="/opt/Megatron-Bridge"), gpus_per_node=8)
    return plan_megatron(train, launch, ModelConfig(preset="tiny"), stage_mode="pretrain", save_dir=save_dir,
                         seed=1, data_seed=DATA_SEED, tokenizer=str(tokenizer), vocab_size=WIDE_VOCAB,
                         blend=[(prefixes[n], w) for n, w in BLEND.items()])


@pytest.fixture(scope="module")
def side(megatron_python, shards, corpus, chat_roots, pretrain_tokenizer, chat_tokenizer_dir, tmp_path_factory):
    """(prefixes, the side run's report, the pretraining plan): our shards as indexed datasets, what the
    libraries read, and the plan whose dataset settings the GPTDataset was built with."""
    root = tmp_path_factory.mktemp("megatron-data")
    prefixes = {name: str(p) for name, p in write_indexed_dir(shards, root / "indexed").items()}
    plan = pretrain_plan(prefixes, pretrain_tokenizer, root / "megatron")
    o = plan.overrides
    corpus_prefixes = [str(corpus.out / shard["prefix"]) for s in corpus.manifest["sources"].values()
                       for split in ("train", "val") for shard in s[split]]
    request = {"indexed": list(prefixes.values()) + corpus_prefixes,
               "gpt": {"blend": o["dataset.blend"], "seq_length": o["dataset.seq_length"],
                       "samples": plan.train_iters * o["train.global_batch_size"], "seed": o["dataset.random_seed"],
                       "tokenizer": o["tokenizer.tokenizer_model"], "split": o["dataset.split"]},
               "chat": {"dataset_roots": [str(chat_roots[True]), str(chat_roots[False])], "seq_length": 512,
                        "tokenizer": str(chat_tokenizer_dir)}}
    (root / "request.json").write_text(json.dumps(request))
    t0 = time.monotonic()
    report = _run_side(megatron_python, root / "request.json")
    print(f"\nread_data in the side environment: {time.monotonic() - t0:.1f} s ({report['import_s']} s import)")
    return prefixes, report, plan


@pytest.mark.parametrize("name, dtype", [("facts", "uint16"), ("wide", "int32")])
def test_megatron_core_reads_exactly_our_documents(side, shards, name, dtype):
    prefixes, report, _ = side
    read = report["indexed"][prefixes[name]]
    assert read["dtype"] == dtype
    assert read["sequence_count"] == shards[name].n_docs == N_DOCS
    assert read["document_indices"] == list(range(N_DOCS + 1))  # one sequence per document
    assert read["documents"] == _documents(shards[name])


def test_megatron_core_reads_the_corpus_builds_shards_as_we_do(side, corpus):
    _, report, _ = side
    shards = [shard for s in corpus.manifest["sources"].values() for split in ("train", "val") for shard in s[split]]
    assert len(shards) > 4
    for shard in shards:
        prefix = corpus.out / shard["prefix"]
        read = report["indexed"][str(prefix)]
        assert read["dtype"] == "uint16" and read["sequence_count"] == shard["docs"]
        assert read["documents"] == [d.tolist() for d in read_indexed(prefix)]
        assert sum(map(len, read["documents"])) == shard["tokens"]
        assert all(d[-1] == 2 for d in read["documents"])  # every document ends with eos


def test_the_plan_builds_the_training_split_alone(side):
    """The plan's split as megatron-core reads it: every document in the training split's bookends, no
    validation or test split at all (the preset's would hold some back, and hang here: see N_DOCS)."""
    _, report, plan = side
    gpt = report["gpt"]
    assert gpt["split"] == plan.overrides["dataset.split"] == "1,0,0"
    assert gpt["split_matrix"] == [[0, 1.0], None, None]
    assert held_out(N_DOCS, gpt["split"]) == 0 < held_out(N_DOCS, PRESET_SPLIT)


def test_the_blend_draws_each_prefix_its_weight_of_the_samples(side):
    prefixes, report, _ = side
    gpt = report["gpt"]
    assert gpt["kind"] == "BlendedDataset"
    assert [d["prefix"] for d in gpt["datasets"]] == [prefixes[n] for n in BLEND]
    shares = [math.ceil(SAMPLES * w / sum(BLEND.values())) for w in BLEND.values()]
    assert gpt["length"] == sum(shares) >= SAMPLES
    assert [gpt["dataset_index"].count(i) for i in range(len(BLEND))] == shares
    for i in range(len(BLEND)):
        drawn = [s for d, s in zip(gpt["dataset_index"], gpt["dataset_sample_index"]) if d == i]
        assert sorted(drawn) == list(range(shares[i]))  # each of its first samples once


@pytest.mark.parametrize("index, name", list(enumerate(BLEND)))
def test_gpt_samples_are_windows_of_our_stream(side, shards, index, name):
    """Per prefix: the training split is every one of our documents (none held_out); tokens per epoch,
    epochs and samples are what that stream implies; sample i is the window shuffle_index[i] of our
    documents concatenated in the order GPTDataset drew them; its tokens / labels are that window shifted."""
    part = side[1]["gpt"]["datasets"][index]
    docs = _documents(shards[name])
    trained = N_DOCS - held_out(N_DOCS, side[2].overrides["dataset.split"])
    assert trained == N_DOCS
    assert part["indices"] == list(range(N_DOCS))
    tokens_per_epoch = sum(len(d) for d in docs[:trained])
    assert part["tokens_per_epoch"] == tokens_per_epoch
    epochs = math.ceil((part["num_samples"] * SEQ_LENGTH + 1) / tokens_per_epoch)
    assert epochs >= (2 if name == "wide" else 1)
    assert sorted(part["document_index"]) == sorted(list(range(trained)) * epochs)  # each document once an epoch
    length = (epochs * tokens_per_epoch - 1) // SEQ_LENGTH  # windows of seq_length + 1, the last partial dropped
    assert part["length"] == length == len(part["samples"]) and sorted(part["shuffle_index"]) == list(range(length))
    stream = np.concatenate([docs[d] for d in part["document_index"]])
    for sample, j in zip(part["samples"], part["shuffle_index"]):
        window = stream[j * SEQ_LENGTH: (j + 1) * SEQ_LENGTH + 1].tolist()
        assert sample["window"] == window
        assert sample["tokens"] == window[:-1] and sample["labels"] == window[1:]


def _newline_after_assistant_end(ids: list[int], mask: list[int], im_end: int, newline: int) -> list[int]:
    """The positions of the newline that follows each supervised `<|im_end|>` (the end of an assistant turn)."""
    return [i for i in range(1, len(ids)) if ids[i - 1] == im_end and mask[i - 1] and ids[i] == newline]


@pytest.mark.parametrize("on", [True, False], ids=["reasoning-on", "reasoning-off"])
def test_chat_rows_tokenize_as_ours_and_mask_as_ours_but_the_newline_after_each_turn(side, chat_roots,
                                                                                   chat_tokenizer, on):
    rows = side[1]["chat"][str(chat_roots[on])]
    assert [r["id"] for r in rows] == [c["id"] for c in CONVS]
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    (newline,) = chat_tokenizer.encode("\n", add_special_tokens=False)
    for conv, theirs in zip(CONVS, rows):
        ids, mask = render(conv, chat_tokenizer, reasoning=on)
        assert theirs["input_ids"] == ids, conv["id"]
        extra = _newline_after_assistant_end(ids, mask, im_end, newline)
        assert len(extra) == sum(m["role"] == "assistant" for m in conv["messages"]), conv["id"]
        assert not any(mask[i] for i in extra)
        expected = [1 if i in extra else m for i, m in enumerate(mask)]
        assert theirs["loss_mask"] == expected, conv["id"]


def test_reasoning_off_reaches_the_megatron_render(side, chat_roots, chat_tokenizer):
    """The switch is in the rows themselves: off and on render differently where a conversation has traces."""
    chat = side[1]["chat"]
    on, off = chat[str(chat_roots[True])], chat[str(chat_roots[False])]
    think = chat_tokenizer.convert_tokens_to_ids("<think>")
    assert all(think in r["input_ids"] for r in on) and not any(think in r["input_ids"] for r in off)
    assert all("reasoning: off<|im_end|>" in chat_tokenizer.decode(r["input_ids"]) for r in off)
