"""PretrainBatches: blend proportions, exact phase switch, epoch caps, exact resume.

Toy shards make every token tell its source and position: source k's i-th train token is
1000·k + i, so a row's first token says where it came from.
"""

import json

import numpy as np
import pytest

from stagewise.data.config import PhaseConfig
from stagewise.data.loader import DataExhausted, PretrainBatches, apportion, validation_rows
from stagewise.data.prepare import PreparedData
from stagewise.data.shards import SourceShards, write_shard

L, B = 8, 10  # seq_length, global_batch
IDS = {"a": 1, "b": 2, "c": 3}


def _prepared(tmp_path, sizes: dict[str, int]) -> PreparedData:
    shards = {}
    for name, n in sizes.items():
        t = write_shard(tmp_path / name / "train", [np.arange(n) + 1000 * IDS[name]], 4096, eos_id=2)
        v = write_shard(tmp_path / name / "val", [np.arange(n // 10) + 1000 * IDS[name] + 500], 4096, eos_id=2)
        shards[name] = SourceShards(t.path, v.path, n, n // 10, 2)
    return PreparedData(tmp_path, tmp_path, "toy", False, shards, vocab_size=4096)


def _loader(prepared, phases, total_steps=100, epochs=100.0, seed=0, warnings=None, **kw):
    return PretrainBatches(prepared, phases, {s: epochs for s in prepared.sources}, kw.pop("seq_length", L),
                           kw.get("global_batch", B), total_steps * kw.get("global_batch", B) * L, seed,
                           on_warning=None if warnings is None else warnings.append)


def _sources(batch):
    return ["abc"[int(t) // 1000 - 1] for t in batch[:, 0]]


ONE = [PhaseConfig(name="mix", blend={"a": 5, "b": 3, "c": 2})]


@pytest.fixture
def toy(tmp_path):
    return _prepared(tmp_path, {"a": 997, "b": 991, "c": 983})


def test_batch_shape_and_rows_are_contiguous(toy):
    loader = _loader(toy, [PhaseConfig(name="only", blend={"a": 1})])
    x = loader.next_batch()
    assert x.shape == (B, L + 1) and str(x.dtype) == "torch.int64"
    stream = np.concatenate([loader.next_batch().numpy().ravel() for _ in range(20)]) - 1000
    expected = np.arange(B * (L + 1), B * (L + 1) * 21) % 997  # row after row, wrapping at the end
    assert (stream == expected).all()


@pytest.mark.parametrize("weights, batch", [({"a": 5, "b": 3, "c": 2}, 10), ({"a": 1, "b": 1, "c": 1}, 7),
                                            ({"a": 0.71, "b": 0.2, "c": 0.09}, 4)])
def test_blend_proportions_track_weights_every_step(toy, weights, batch):
    loader = _loader(toy, [PhaseConfig(name="mix", blend=weights)], global_batch=batch)
    w = {s: v / sum(weights.values()) for s, v in weights.items()}
    rows = {s: 0 for s in w}
    for step in range(1, 31):
        for s in _sources(loader.next_batch()):
            rows[s] += 1
        for s in w:  # never more than one row away from the exact share
            assert abs(rows[s] - w[s] * batch * step) < 1, (step, rows)
    assert loader.realized() == {"mix": {s: n * L for s, n in rows.items()}}


def test_rows_are_shuffled_by_seed_and_step(toy):
    a = [_sources(_loader(toy, ONE, seed=1).next_batch()) for _ in range(2)]
    b = _sources(_loader(toy, ONE, seed=2).next_batch())
    assert a[0] == a[1] and a[0] != b and sorted(a[0]) == sorted(b)
    loader = _loader(toy, ONE, seed=1)
    assert len({tuple(_sources(loader.next_batch())) for _ in range(5)}) > 1  # the order changes with the step


def test_phase_switch_at_the_exact_step(toy):
    # tokens_per_step = 80; total 1000 -> switch at 300 tokens: step 3 starts at 240 (< 300), step 4 at 320
    phases = [PhaseConfig(name="one", until=0.3, blend={"a": 1}), PhaseConfig(name="two", blend={"b": 1})]
    loader = PretrainBatches(toy, phases, {"a": 9, "b": 9, "c": 9}, L, B, total_tokens=1000, seed=0)
    assert [loader.phase_at(s).name for s in range(6)] == ["one"] * 4 + ["two"] * 2
    assert [set(_sources(loader.next_batch())) for _ in range(6)] == [{"a"}] * 4 + [{"b"}] * 2
    assert loader.realized() == {"one": {"a": 4 * B * L}, "two": {"b": 2 * B * L}}
    exact = PretrainBatches(toy, phases, {"a": 9, "b": 9}, L, B, total_tokens=800, seed=0)  # 0.3 · 800 = 240
    assert [exact.phase_at(s).name for s in (2, 3)] == ["one", "two"]


def test_epoch_cap_retires_renormalises_warns_then_exhausts(tmp_path):
    # a: 50 tokens, 1 epoch -> 5 rows of 9; b: 400 tokens, 1 epoch -> 44 rows
    prepared = _prepared(tmp_path, {"a": 50, "b": 400})
    warnings = []
    loader = PretrainBatches(prepared, [PhaseConfig(name="p", blend={"a": 1, "b": 1})], {"a": 1.0, "b": 1.0},
                             L, 4, total_tokens=10**6, seed=0, on_warning=warnings.append)
    counts = [_sources(loader.next_batch()).count("a") for _ in range(3)]
    assert counts == [2, 2, 1] and len(warnings) == 1  # step 2: a has one row left, gives it, retires
    assert "'a'" in warnings[0] and "epoch cap" in warnings[0] and "b=1.000" in warnings[0]
    for _ in range(7):  # b now fills every row
        assert _sources(loader.next_batch()) == ["b"] * 4
    assert loader.sources["a"].consumed == 45 <= 50 and len(warnings) == 1
    with pytest.raises(DataExhausted, match="every source of phase 'p'"):
        for _ in range(100):
            loader.next_batch()
    assert loader.sources["b"].consumed <= 400 and len(warnings) == 2 and "'b'" in warnings[1]


def test_retired_source_stays_retired_in_later_phases(tmp_path):
    prepared = _prepared(tmp_path, {"a": 50, "b": 4000})
    phases = [PhaseConfig(name="p1", until=0.5, blend={"a": 1, "b": 1}), PhaseConfig(name="p2", blend={"a": 9, "b": 1})]
    loader = PretrainBatches(prepared, phases, {"a": 1.0, "b": 1.0}, L, 4, total_tokens=20 * 32, seed=0,
                             on_warning=lambda m: None)
    batches = [_sources(loader.next_batch()) for _ in range(20)]
    assert all(s == ["b"] * 4 for s in batches[10:])


def test_exact_resume(tmp_path):
    prepared = _prepared(tmp_path, {"a": 997, "b": 300, "c": 983})
    phases = [PhaseConfig(name="p1", until=0.4, blend={"a": 2, "b": 3, "c": 1}),
              PhaseConfig(name="p2", blend={"a": 1, "b": 1, "c": 3})]
    make = lambda: PretrainBatches(prepared, phases, {"a": 4, "b": 1.5, "c": 4}, L, 7, total_tokens=30 * 56,  # noqa: E731
                                   seed=11, on_warning=lambda m: None)
    straight = make()
    for _ in range(9):
        straight.next_batch()
    state = json.loads(json.dumps(straight.state_dict()))
    expected = [straight.next_batch() for _ in range(15)]  # crosses the phase switch and b's retirement
    assert "b" in straight.retired
    resumed = make()
    resumed.load_state_dict(state)
    for want in expected:
        assert (resumed.next_batch() == want).all()
    assert resumed.realized() == straight.realized() and resumed.state_dict() == straight.state_dict()


def test_resume_refuses_a_different_loader(toy):
    state = _loader(toy, ONE, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        _loader(toy, ONE, seed=2).load_state_dict(state)


def test_bad_arguments(toy):
    with pytest.raises(ValueError, match="max_epochs has no entry"):
        PretrainBatches(toy, ONE, {"a": 1}, L, B, 1000, 0)
    with pytest.raises(ValueError, match="unknown sources"):
        PretrainBatches(toy, [PhaseConfig(name="x", blend={"zz": 1})], {}, L, B, 1000, 0)


def test_apportion_keeps_the_carry():
    counts, carry = apportion({"a": 0.5, "b": 0.5}, 3, {})
    assert counts == {"a": 2, "b": 1} and carry == {"a": -0.5, "b": 0.5}
    counts, carry = apportion({"a": 0.5, "b": 0.5}, 3, carry)
    assert counts == {"a": 1, "b": 2} and carry == {"a": 0.0, "b": 0.0}


def test_validation_rows(toy):
    rows = validation_rows(toy, seq_length=L, max_tokens=3 * 4 * L)  # 4 rows per source; val shards hold 99/98
    assert sorted(rows) == ["a", "b", "c"] and rows["a"].shape == (4, L + 1)
    assert rows["b"].flatten().tolist() == list(range(2500, 2500 + 4 * (L + 1)))
    assert rows["c"].equal(validation_rows(toy, L, 3 * 4 * L)["c"])
    assert validation_rows(toy, seq_length=200, max_tokens=10, sources=["a"]) == {}  # shard shorter than a row
