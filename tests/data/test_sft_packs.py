"""Render -> pack -> rows -> batches, with a real tokenizer; resumable batch source."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stagewise.data.loader import DataExhausted
from stagewise.data.packing import IGNORE
from stagewise.data.sft_config import PackingConfig
from stagewise.data.sft_packs import KEYS, PackedBatches, load_packed, pack_conversations, save_packed
from stagewise.data.world.conversations import domain_conversations


@pytest.fixture(scope="module")
def convs():
    return domain_conversations("arithmetic", 40, 0) + domain_conversations("calculator", 40, 0)


def test_pack_conversations(convs, chat_tokenizer, tmp_path):
    packed = pack_conversations(convs, chat_tokenizer, PackingConfig(pack_size=1024), off_fraction=0.5, seed=0)
    rows, report = packed.rows, packed.report
    assert rows["input_ids"].shape == (len(report.packs), 1024)
    assert report.dropped == 0 and sum(len(p) for p in report.packs) == len(convs)
    assert int((rows["labels"] != IGNORE).sum()) == report.supervised_tokens > 0
    assert 10 < packed.reasoning_off < 70
    # every conversation starts with <|im_start|> at position 0
    starts = rows["position_ids"] == 0
    im_start = chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    real = rows["seq_idx"] < np.array([len(p) for p in report.packs])[:, None]
    assert (rows["input_ids"][starts & real] == im_start).all()
    again = load_packed(save_packed(tmp_path / "packs.npz", rows))
    assert all(np.array_equal(again[k], rows[k]) for k in KEYS)


def test_packed_batches_resume_exactly():
    rows = {"input_ids": np.arange(10 * 4).reshape(10, 4), "labels": np.zeros((10, 4), dtype=np.int64),
            "position_ids": np.zeros((10, 4), dtype=np.int64), "seq_idx": np.zeros((10, 4), dtype=np.int32)}
    a = PackedBatches(rows, global_batch=3, seed=1)
    first = [a.next_batch()["input_ids"][:, 0].tolist() for _ in range(4)]
    b = PackedBatches(rows, global_batch=3, seed=1)
    b.next_batch()
    state = b.state_dict()
    c = PackedBatches(rows, global_batch=3, seed=1)
    c.load_state_dict(state)
    assert [c.next_batch()["input_ids"][:, 0].tolist() for _ in range(3)] == first[1:]
    assert sorted(sum(first[:3], [])) == sorted(set(sum(first[:3], [])))  # an epoch never repeats a pack
    with pytest.raises(DataExhausted):
        capped = PackedBatches(rows, global_batch=3, seed=1, max_epochs=1)
        for _ in range(4):
            capped.next_batch()
    with pytest.raises(ValueError, match="cannot resume"):
        PackedBatches(rows, global_batch=3, seed=2).load_state_dict(state)


def test_packed_batch_splits_like_a_tensor():
    rows = {"input_ids": np.arange(24).reshape(6, 4), "labels": np.zeros((6, 4), dtype=np.int64),
            "position_ids": np.zeros((6, 4), dtype=np.int64), "seq_idx": np.zeros((6, 4), dtype=np.int32)}
    batch = PackedBatches(rows, global_batch=6, seed=0).next_batch().to("cpu")
    micros = batch.split(4)
    assert [m["input_ids"].shape[0] for m in micros] == [4, 2] and set(micros[0]) == set(KEYS)
    assert micros[1].device.type == "cpu"
    assert torch.equal(torch.cat([m["input_ids"] for m in micros]), batch["input_ids"])
