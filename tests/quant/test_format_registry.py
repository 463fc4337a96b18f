"""The format registry: every format carries what the planner, the loader, the FLOP model and the
chart read from it, and the config accepts exactly the registry's names.

A format is one file under quant/formats/ and one line in FORMATS; nothing else in quant/ names it.
So a new format that forgets a field would only fail where that field is first read (a search, a
reload, a chart): `problems` finds it here instead, and is itself shown to find broken formats.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing

import pytest
from matplotlib.colors import is_color_like
from pydantic import ValidationError

from stagewise.quant.config import QUANT_FORMATS, Format, Pin, QuantizeConfig
from stagewise.quant.export import DTYPE_BYTES
from stagewise.quant.formats import FORMATS, UNQUANTIZED, QuantFormat, format_named
from stagewise.quant.formats.fp8 import FP8
from stagewise.quant.formats.nvfp4 import NVFP4


def _takes_tensors_and_base(fn) -> bool:
    return callable(fn) and len(inspect.signature(fn).parameters) == 2


def problems(fmt: QuantFormat) -> list[str]:
    """What `fmt` lacks for the code that reads it (empty: nothing)."""
    out = []
    if not re.fullmatch(r"[a-z][a-z0-9_]*", fmt.name):
        out.append("name: lower-case word (it ends metric names and recipe values)")
    if not 0 < fmt.bits <= 16:
        out.append("bits: storage bits per element, in (0, 16] (the effective-bits budget)")
    if not 0 < fmt.flop_cost <= 1:
        out.append("flop_cost: time per FLOP relative to BF16, in (0, 1] (the FLOP budget)")
    if not isinstance(fmt.colour, str) or not is_color_like(fmt.colour):
        out.append("colour: a matplotlib colour (the report's chart)")
    if not fmt.quantized:
        if fmt.name != UNQUANTIZED:
            out.append(f"modelopt_preset: only {UNQUANTIZED} may have none")
        if (fmt.bits, fmt.flop_cost) != (16.0, 1.0):
            out.append("bits/flop_cost: the unquantized format is both budgets' baseline (16 bits, cost 1)")
        if fmt.num_bits or fmt.stored_as or fmt.decode or fmt.amax:
            out.append("num_bits/stored_as/decode/amax: the unquantized format has no quantizer to match or decode")
        return out
    if not (isinstance(fmt.num_bits, tuple) and len(fmt.num_bits) == 2):
        out.append("num_bits: (exponent, mantissa) of the weight quantizer (the planner's format_of)")
    if fmt.stored_as not in DTYPE_BYTES:
        out.append(f"stored_as: a safetensors dtype the recount knows ({', '.join(DTYPE_BYTES)})")
    elif fmt.bits < DTYPE_BYTES[fmt.stored_as] * 8 / max(fmt.packing, 1):
        out.append("bits: fewer than the stored dtype holds per element (stored_as, packing)")
    if not (isinstance(fmt.packing, int) and fmt.packing >= 1):
        out.append("packing: elements per stored element, at least 1 (the recount)")
    if not fmt.scales:
        out.append("scales: the scale tensors' suffixes (the loader skips them as weights)")
    if not _takes_tensors_and_base(fmt.decode):
        out.append("decode: (tensors, base) -> float32 weight (the loader)")
    if not _takes_tensors_and_base(fmt.amax):
        out.append("amax: (tensors, base) -> (weight amax, input amax) (the loader)")
    return out


def test_every_registered_format_is_complete():
    assert {name: problems(f) for name, f in FORMATS.items()} == {name: [] for name in FORMATS}
    assert all(name == f.name for name, f in FORMATS.items())


@pytest.mark.parametrize("broken,what", [
    (dataclasses.replace(NVFP4, decode=None), "decode"),
    (dataclasses.replace(FP8, amax=lambda tensors: (0.0, 0.0)), "amax"),
    (dataclasses.replace(FP8, colour="not a colour"), "colour"),
    (dataclasses.replace(NVFP4, stored_as=None), "stored_as"),
    (dataclasses.replace(NVFP4, bits=2.0), "bits"),
    (dataclasses.replace(FP8, num_bits=None), "num_bits"),
    (dataclasses.replace(FP8, flop_cost=0.0), "flop_cost"),
    (dataclasses.replace(FP8, scales=()), "scales"),
    (dataclasses.replace(FP8, name="int8", modelopt_preset=None), "modelopt_preset"),
    (QuantFormat(name="Int4", bits=4.0, flop_cost=0.25, colour="red"), "name"),
])
def test_the_check_finds_a_format_that_lacks_something(broken, what):
    assert any(p.startswith(what) for p in problems(broken)), problems(broken)


def test_formats_are_told_apart_by_what_the_code_reads():
    """The planner maps modelopt's num_bits, the loader a stored dtype, the chart a colour back to
    one format each; exactly one format is unquantized."""
    quantized = [f for f in FORMATS.values() if f.quantized]
    assert len({f.num_bits for f in quantized}) == len({f.stored_as for f in quantized}) == len(quantized)
    assert len({f.colour.lower() for f in FORMATS.values()}) == len(FORMATS)
    assert [n for n, f in FORMATS.items() if not f.quantized] == [UNQUANTIZED]


def test_each_format_is_its_own_module():
    """One file per format, named after it: `stagewise.quant.formats.<name>` defines it."""
    for name, fmt in FORMATS.items():
        module = importlib.import_module(f"stagewise.quant.formats.{name}")
        assert fmt in vars(module).values(), f"quant/formats/{name}.py does not define the {name} format"


def test_modelopt_presets_exist_and_their_weight_bits_name_the_format():
    """The preset is what the search and the reload quantize with; the planner reads the format of
    a candidate back from its weight quantizer's num_bits."""
    import modelopt.torch.quantization as mtq

    for fmt in (f for f in FORMATS.values() if f.quantized):
        preset = getattr(mtq, fmt.modelopt_preset, None)
        assert isinstance(preset, dict), f"{fmt.name}: modelopt has no preset {fmt.modelopt_preset}"
        weight = next(e["cfg"] for e in preset["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer")
        assert tuple(weight["num_bits"]) == fmt.num_bits, fmt.name


def test_the_configs_choices_are_the_registrys_names():
    names = list(FORMATS)
    assert list(typing.get_args(Format)) == names
    schema = QuantizeConfig.model_json_schema()
    assert schema["properties"]["formats"]["items"]["enum"] == names
    assert Pin.model_json_schema()["properties"]["format"]["enum"] == names
    assert list(QUANT_FORMATS) == [n for n in names if n != UNQUANTIZED]


def test_a_name_outside_the_registry_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as e:
        QuantizeConfig(formats=["nvfp4", "int3"])
    (err,) = e.value.errors()
    assert err["loc"] == ("formats", 1) and "'nvfp4', 'fp8' or 'bf16'" in err["msg"]
    with pytest.raises(ValueError, match="unknown quantization format 'int3'; formats: nvfp4, fp8, bf16"):
        format_named("int3")
