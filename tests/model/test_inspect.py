"""inspect_model: active vs total, the per-layer table adds up, the memory formula."""

import json

import pytest
from rich.table import Table

from stagewise.model.config import ModelConfig
from stagewise.model.inspect import inspect_model


def _report(name, **kw):
    args = {"seq_length": 128, "micro_batch": 2} | kw
    return inspect_model(ModelConfig(preset=name), 4096, **args)


@pytest.mark.parametrize("name", ["tiny", "small", "nemotron-3-nano-30b-a3b"])
def test_active_below_total_for_moe(name):
    r = _report(name)
    assert r.active_params < r.total_params
    assert r.active_params_no_embeddings == r.active_params - r.embedding_params


@pytest.mark.parametrize("name", ["nemotron-3-nano-4b", "nemotron-h-8b", "nemotron-nano-9b-v2"])
def test_active_equals_total_for_dense(name):
    r = _report(name)
    assert r.active_params == r.total_params


def test_layer_table_adds_up_to_total():
    r = _report("tiny")
    norm_f = r.hidden_size
    assert sum(row.params for row in r.layers) + r.embedding_params + norm_f == r.total_params
    assert [row.kind for row in r.layers] == ["mamba2", "attention", "moe", "mamba2", "mlp", "moe"]
    assert r.pattern == "M*EM-E"
    moe = r.layers[2]
    # tiny: 8 experts x (128x128 up + 128x128 down), top-2 -> 6/8 of them inactive
    assert moe.params - moe.active_params == 8 * 2 * 128 * 128 * 6 // 8


def test_memory_formula():
    bf16, fp32 = _report("tiny", precision="bf16"), _report("tiny", precision="fp32")
    p = bf16.total_params
    m = bf16.memory
    assert (m.weights_bytes, m.grads_bytes, m.optimizer_bytes, m.master_bytes) == (2 * p, 4 * p, 8 * p, 4 * p)
    assert fp32.memory.weights_bytes == 4 * p and fp32.memory.master_bytes == 0
    assert _report("tiny", micro_batch=4).memory.activations_bytes == 2 * m.activations_bytes
    assert m.total_bytes == 18 * p + m.activations_bytes


def test_mtp_heads_are_counted():
    plain = _report("tiny")
    r = inspect_model(ModelConfig(preset="tiny", mtp={"num_heads": 2}), 4096, 128, 2)
    assert r.mtp_params > 0 and r.total_params == plain.total_params + r.mtp_params


def test_to_dict_is_json_and_render_is_a_table():
    r = _report("tiny")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["total_params"] == r.total_params and len(d["layers"]) == 6
    assert d["memory"]["total_bytes"] == r.memory.total_bytes
    table = r.render()
    assert isinstance(table, Table) and table.row_count >= len(r.layers) + 3
