"""The streaming safetensors writer and the buffer reader agree with safetensors itself."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from stagewise.model.merge.layout import read_layout
from stagewise.model.merge.reader import TensorReader
from stagewise.model.merge.st_writer import StreamingSafetensorsWriter

TENSORS = {
    "w": torch.randn(5, 3),
    "h": torch.randn(7).to(torch.bfloat16),
    "scalar": torch.tensor(3.5, dtype=torch.float64),
    "empty": torch.zeros(0, 4),
    "flags": torch.tensor([True, False, True]),
    "ids": torch.arange(6, dtype=torch.int32).reshape(2, 3),
}
CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float64: "F64", torch.bool: "BOOL", torch.int32: "I32"}


def test_streamed_file_loads_with_safetensors_and_reads_back(tmp_path):
    path = tmp_path / "model.safetensors"
    entries = {n: (CODES[t.dtype], tuple(t.shape)) for n, t in TENSORS.items()}
    writer = StreamingSafetensorsWriter(path, entries, {"format": "pt"})
    for name in writer.order:
        writer.write(name, TENSORS[name])
    writer.close()
    loaded = load_file(path)
    assert set(loaded) == set(TENSORS) and all(torch.equal(loaded[n], t) for n, t in TENSORS.items())
    layout = read_layout(tmp_path)
    reader = TensorReader(max(t.nbytes for t in layout.tensors.values()))
    for name, info in layout.tensors.items():
        assert torch.equal(reader.read(path, info), TENSORS[name])
    reader.close()


def test_reader_matches_files_written_by_safetensors(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    layout = read_layout(tmp_path)
    reader = TensorReader(1024)
    for name, info in sorted(layout.tensors.items()):
        assert torch.equal(reader.read(tmp_path / "model.safetensors", info), TENSORS[name])
    reader.close()


def test_writer_refuses_anything_out_of_plan(tmp_path):
    writer = StreamingSafetensorsWriter(tmp_path / "x.safetensors", {"a": ("F32", (2,)), "b": ("F32", (2,))})
    with pytest.raises(ValueError, match="expected a next"):
        writer.write("b", torch.zeros(2))
    with pytest.raises(ValueError, match="planned F32"):
        writer.write("a", torch.zeros(3))
    writer.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="1 tensors not written"):
        writer.close()
