"""benchmarks/gpu_check.sh and gpu_check.py on a CPU machine: no GPU is exit 2 saying why, the rows and
the table, the wheelhouse against what the parts import, the wheelhouse's size limit, and --dry-run
rehearsing every part (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.scripts import ROOT, load_benchmark

SCRIPT = str(ROOT / "benchmarks" / "gpu_check.sh")
PART_STEMS = ("pretrain-kernels", "pretrain-torch", "sft", "rl", "quant", "vllm", "megatron")

# What the GPU parts import of our own requirements (benchmarks/gpu_check.py run on this CPU with
# --imports-out lists these among its distributions); the image and the wheelhouse must cover them.
PARTS_IMPORT = {name: "any" for name in ("torch", "transformers", "tokenizers", "safetensors", "pydantic", "pyyaml",
                                         "rich", "numpy", "accelerate", "nvidia-modelopt")}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gpu_check")


def _path_with(tmp_path: Path, fakes: dict[str, str]) -> str:
    """A PATH of the few tools the script needs before its GPU checks (no nvidia-smi unless faked)."""
    bin_dir = tmp_path / "path"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mktemp", "mkdir"):
        os.symlink(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip(),
                   bin_dir / tool)
    for name, body in fakes.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def test_no_gpu_is_exit_2_saying_why(tmp_path):
    env = {"PATH": _path_with(tmp_path, {}), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "nvidia-smi is not on PATH" in proc.stderr and "--dry-run" in proc.stderr
    # a driver but a torch that sees no CUDA (this CPU install): still 2, saying why
    (tmp_path / "path").rename(tmp_path / "old")
    env = {"PATH": _path_with(tmp_path, {"nvidia-smi": "#!/bin/sh\necho 'GPU 0: Fake'\n"}), "HOME": str(tmp_path),
           "STAGEWISE_PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "check")}
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "sees no CUDA device" in proc.stderr


def test_help_and_a_bad_argument():
    shown = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--dry-run" in shown.stdout and "GPU_CHECK_BUDGET_S" in shown.stdout
    bad = subprocess.run(["bash", SCRIPT, "--fast"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --fast" in bad.stderr


def test_rows_table_and_megatron_log(bench, tmp_path, capsys):
    log = "\n".join(f" [t] iteration {i}/ 12 | consumed samples: {8 * i} | elapsed time per iteration (ms): {ms} | "
                    f"throughput per GPU (TFLOP/s/GPU): {tf} | lm loss: 1.0E+01 |"
                    for i, (ms, tf) in enumerate([(9000.0, 10.0), (700.0, 300.0), (500.0, 400.0), (520.0, 390.0),
                                                  (480.0, 410.0)], 1))
    peak = bench.gpu_peak_tflops("NVIDIA H200")
    row = bench.parse_megatron_log(log, global_batch=8, seq_length=2048, peak_tflops=peak)
    assert row["status"] == "ok" and row["step_ms"] == 500.0 and row["tokens_per_s"] == pytest.approx(8 * 2048 / 0.5)
    assert row["mfu"] == pytest.approx(400.0 / 989.0)
    assert bench.parse_megatron_log("Traceback ...", 8, 2048, None)["status"] == "failed"
    assert bench.gpu_peak_tflops("Some GPU") is None

    # the CLI pieces gpu_check.sh uses: a row, the vLLM row when vllm is absent, the table
    assert bench.main(["row", "--what", "Megatron-Bridge: pretrain", "--status", "not installed", "--note", "no",
                       "--out", str(tmp_path / "megatron.json")]) == 0
    (tmp_path / "pretrain.json").write_text(json.dumps(bench.make_row(
        "ours: pretrain (small)", "ok", tokens_per_s=123456.7, mfu=0.1234, kernels="yes: mamba-ssm 2.2.4")))
    if importlib.util.find_spec("vllm") is None:
        assert bench.main(["vllm", "--out", str(tmp_path / "vllm.json")]) == 0
        assert json.loads((tmp_path / "vllm.json").read_text())["status"] == "not installed"
    with pytest.raises(SystemExit) as exit_:
        bench.main(["pretrain", "--out", str(tmp_path / "x.json")])  # this machine has no CUDA
    assert exit_.value.code == 2
    capsys.readouterr()
    bench.main(["table", str(tmp_path / "pretrain.json"), str(tmp_path / "megatron.json"), str(tmp_path / "vllm.json"),
                str(tmp_path / "missing.json"), "--title", "GPU check: test", "--json", str(tmp_path / "all.json")])
    table = capsys.readouterr().out
    assert "GPU check: test" in table
    assert "│ ours: pretrain (small) " in table and "123,457" in table and "12.3%" in table
    assert "yes: mamba-ssm" in table
    assert "│ Megatron-Bridge: pretrain " in table and "not installed" in table
    assert "│ missing " in table and "failed" in table
    statuses = [r["status"] for r in json.loads((tmp_path / "all.json").read_text())]
    assert statuses[:2] == ["ok", "not installed"] and statuses[3] == "failed"
    with pytest.raises(ValueError):
        bench.make_row("x", "great")


def test_a_note_with_rich_markup_prints_as_written(bench):
    table = bench.format_table([bench.make_row("x", "failed", note="KeyError: [bold]'w'[/bold]")])
    assert "[bold]'w'[/bold]" in table


# ----------------------------------------------------------------------- the wheelhouse against the imports


def test_the_image_and_the_wheelhouse_cover_the_parts_imports(bench):
    assert bench.coverage_problems(PARTS_IMPORT) == []


def test_a_needed_package_neither_in_the_image_nor_carried_is_named(bench, monkeypatch):
    pins = bench.wheelhouse_pins()
    del pins["pydantic-core"]
    monkeypatch.setattr(bench, "wheelhouse_pins", lambda: pins)
    (problem,) = bench.coverage_problems(PARTS_IMPORT)
    assert problem.startswith("pydantic-core: pydantic needs it") and "neither in the GPU image" in problem


def test_the_images_transformers_is_too_old_unless_carried(bench, monkeypatch):
    pins = bench.wheelhouse_pins()
    del pins["transformers"]
    monkeypatch.setattr(bench, "wheelhouse_pins", lambda: pins)
    problems = bench.coverage_problems(PARTS_IMPORT)
    assert any(p.startswith("transformers: the GPU image has 5.17.0, pyproject.toml asks ==5.24.*") for p in problems)


def test_a_wheel_nothing_needs_and_a_wrong_pin_are_named(bench, monkeypatch):
    pins = bench.wheelhouse_pins() | {"datasketch": ("2.0.0", "not needed")}
    pins["pydantic"] = ("2.9.0", pins["pydantic"][1])
    monkeypatch.setattr(bench, "wheelhouse_pins", lambda: pins)
    problems = bench.coverage_problems(PARTS_IMPORT)
    assert "datasketch: in the wheelhouse, but nothing the parts import needs it" in problems
    assert "pydantic: the wheelhouse pins 2.9.0, pyproject.toml asks >=2.10" in problems


def test_a_package_the_image_lacks_must_travel(bench, monkeypatch):
    image = bench.read_image()
    del image["safetensors"]
    monkeypatch.setattr(bench, "read_image", lambda: image)
    problems = bench.coverage_problems(PARTS_IMPORT)
    assert any(p.startswith("safetensors: pyproject.toml needs it") for p in problems)


def test_the_image_list_reads_versions_and_keeps(bench):
    image = bench.read_image()
    assert image["torch"] == ("2.11.0", True) and image["transformers"] == ("5.17.0", False)


# ------------------------------------------------------------------------------------- dev.py gpu-wheelhouse


def test_a_wheelhouse_that_would_not_travel_is_refused(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    house = tmp_path / "whl"
    house.mkdir()
    stamp = house / ".stagewise-gpu-wheels"
    stamp.write_text(dev.gpu_wheels_key())  # up to date: nothing is downloaded
    with open(house / "big-1.0-py3-none-any.whl", "wb") as f:
        f.truncate(2 * 2**20)
    monkeypatch.setattr(dev, "GPU_WHEELHOUSE", house)
    monkeypatch.setattr(dev, "GPU_WHEELHOUSE_STAMP", stamp)
    monkeypatch.setattr(dev, "_tracked_bytes", lambda: 63 * 2**20)
    with pytest.raises(SystemExit, match=r"65\.0 MiB would not travel"):
        dev.ensure_gpu_wheelhouse()
    assert not stamp.exists()  # the next call rebuilds rather than trusting it
    stamp.write_text(dev.gpu_wheels_key())
    monkeypatch.setattr(dev, "_tracked_bytes", lambda: 3 * 2**20)
    assert dev.ensure_gpu_wheelhouse() == house


# ---------------------------------------------------------------------------------------------- --dry-run


@pytest.mark.slow
def test_dry_run_lists_every_part_rehearses_them_and_checks_the_wheelhouse(tmp_path):
    """Every part's rehearsal at toy size on this CPU, the wheelhouse installed for CPython 3.12 x86-64,
    and the imports covered: exit 0. CI builds .whl/ (.ci/run) so the install check runs there."""
    has_wheels = any((ROOT / ".whl").glob("*.whl"))
    if not has_wheels and os.environ.get("CI"):
        pytest.fail("CI builds the wheelhouse (python3 dev.py gpu-wheelhouse) before the tests: .whl/ is empty")
    env = dict(os.environ, GPU_CHECK_DIR=str(tmp_path / "check"), STAGEWISE_PYTHON=sys.executable)
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stem in PART_STEMS:
        assert f"\n  {stem} " in proc.stdout
    if has_wheels:
        assert "installs for CPython 3.12 on x86-64" in proc.stdout
    rows = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "check").glob("*.json") if ".imports" not in p.name}
    assert {"pretrain-kernels", "sft", "rl", "quant", "vllm"} <= set(rows)
    for stem in ("pretrain-kernels", "sft", "rl", "quant"):
        assert rows[stem]["status"] == "ok", rows[stem]
    assert rows["pretrain-kernels"]["tokens_per_s"] > 0
    assert rows["quant"]["effective_bits"] <= 6.0 + 1e-9  # the budget it searched under, over the searched weights
    assert "the GPU image and the wheelhouse cover the" in proc.stdout
    imported = {}
    for path in (tmp_path / "check").glob("*.imports.json"):
        imported |= json.loads(path.read_text())
    assert set(PARTS_IMPORT) <= set(imported)  # what the fast coverage tests assume the parts import
