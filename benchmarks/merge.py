"""Checkpoint merge: our streaming merge against loading every checkpoint at once.

    python benchmarks/merge.py [--n 8] [--preset small] [--repeats 3] [--json]

Inputs: n checkpoints of a preset (`small`: ~34M parameters, fp32, ~140 MB each), built
with different seeds and saved with save_pretrained. Each method runs in a fresh
subprocess, so import costs and heaps do not leak between them, alternating rounds, and
the median time of each counts:
- stream:        model.merge.merge_checkpoints (minus-sqrt coefficients), as the pipeline
                 runs it: output written atomically and fsynced, hashed while written; the
                 inputs' sha256 taken from their stagewise.json.
- stream_verify: the same re-hashing every input (verify_inputs=True, `--verify`).
- naive:         safetensors load_file of every checkpoint, Σ cᵢ θᵢ in fp32 over the full
                 state dicts, save_file: what a short script would do.
- mergekit:      mergekit's `linear` merge with the same weights (lazy loading), when
                 mergekit is installed (it is skipped, and the output says so, otherwise),
                 made to infer the architecture from the files' tensor names (see
                 _run_method: its default inference drops most NemotronH tensors).
Throughput is GB/s of input weights read (n × checkpoint bytes / seconds); peak memory is
the subprocess's peak RSS above its RSS before the merge (VmHWM after a
/proc/self/clear_refs reset), also given in checkpoints. The inputs sit in the page cache
after the first round, so the figures measure the merge, not the disk. Every method runs with the same torch thread count (--threads,
default 1). Ratios are
stream / baseline: throughput > 1 and memory < 1 are wins. Every output is checked
against the naive one (max |Δ|).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("stream", "stream_verify", "naive", "mergekit")


def build_inputs(workdir: Path, n: int, preset: str) -> list[Path]:
    """n checkpoints of `preset` with seeds 0..n-1, saved as the trainer saves them (reused when there)."""
    from transformers.utils import logging as hf_logging

    from stagewise.model.build import build_model
    from stagewise.model.checkpoint import CheckpointMeta, save_checkpoint
    from stagewise.model.config import ModelConfig

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    paths = []
    for i in range(n):
        path = workdir / f"{preset}-seed{i}"
        if not (path / "stagewise.json").is_file():
            model = build_model(ModelConfig(preset=preset), vocab_size=4096, seed=i)
            save_checkpoint(path, model, None, CheckpointMeta("pretrain", i, 1000 * i, "bench"))
        paths.append(path)
    return paths


def mergekit_available() -> tuple[bool, str]:
    try:
        import mergekit  # noqa: F401
    except ImportError:
        return False, "mergekit not installed (`pip install mergekit`; skipped if it would change torch/transformers)"
    return True, ""


# --------------------------------------------------------------------------- workers (one subprocess each)


def _rss(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _run_method(method: str, paths: list[Path], coeffs: list[float], out: Path) -> None:
    if method in ("stream", "stream_verify"):
        from stagewise.model.merge import merge_checkpoints

        merge_checkpoints(paths, coeffs, out, "minus-sqrt", verify_inputs=method == "stream_verify")
    elif method == "naive":
        import torch
        from safetensors.torch import load_file, save_file

        states = [load_file(p / "model.safetensors") for p in paths]
        merged = {k: sum(c * s[k].to(torch.float32) for c, s in zip(coeffs, states)).to(v.dtype)
                  for k, v in states[0].items()}
        out.mkdir(parents=True)
        save_file(merged, out / "model.safetensors", metadata={"format": "pt"})
    elif method == "mergekit":
        import mergekit.architecture.auto as auto
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge

        # mergekit has no NemotronH definition; its inference takes tensor names from
        # transformers' in-memory model (fused experts, `model.` prefix), which do not match
        # the files (`backbone.`, one tensor per expert), and it silently wrote 9 of 71
        # tensors. Without the transformers names it infers from the files' own names.
        auto.get_transformers_info = lambda model, options: (None, None, None, None)

        cfg = {"merge_method": "linear", "dtype": "float32",
               "models": [{"model": str(p), "parameters": {"weight": c}} for p, c in zip(paths, coeffs)]}
        run_merge(MergeConfiguration.model_validate(cfg), str(out),
                  options=MergeOptions(lazy_unpickle=True, copy_tokenizer=False, quiet=True))
    else:
        raise ValueError(method)


def worker(method: str, inputs: list[str], out: str, threads: int) -> None:
    """Run one merge and print {"seconds", "peak_bytes"} as JSON."""
    import logging

    import torch  # imports before the baseline RSS

    if threads:
        torch.set_num_threads(threads)
    from safetensors import safe_open  # noqa: F401

    logging.disable(logging.WARNING)
    from stagewise.model.merge import merge_coefficients

    paths = [Path(p) for p in inputs]
    coeffs = merge_coefficients(len(paths))
    if method == "mergekit":
        import mergekit.merge  # noqa: F401
    base = _rss("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    start = time.perf_counter()
    _run_method(method, paths, coeffs, Path(out))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_bytes": _rss("VmHWM") - base}))


# --------------------------------------------------------------------------- driver


def _spawn(method: str, paths: list[Path], out: Path, threads: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--worker", method, "--out", str(out), "--threads", str(threads), *map(str, paths)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{method} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _max_diff(a: Path, b: Path) -> float:
    import torch
    from safetensors.torch import load_file

    def state(d: Path) -> dict:
        out: dict = {}
        for f in sorted(d.glob("*.safetensors")):
            out |= load_file(f)
        return out

    sa, sb = state(a), state(b)
    if set(sa) != set(sb):
        return float("nan")
    return max(float((sa[k].to(torch.float64) - sb[k].to(torch.float64)).abs().max()) for k in sa)


def run(n: int, preset: str, repeats: int, workdir: Path, threads: int) -> dict:
    paths = build_inputs(workdir, n, preset)
    ckpt_bytes = sum(f.stat().st_size for f in paths[0].glob("*.safetensors"))
    input_bytes = sum(f.stat().st_size for p in paths for f in p.glob("*.safetensors"))
    has_mergekit, why = mergekit_available()
    methods = [m for m in METHODS if m != "mergekit" or has_mergekit]
    samples: dict[str, list[dict]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m in methods:
            samples[m].append(_spawn(m, paths, workdir / f"out-{m}", threads))
    result: dict = {"preset": preset, "n": n, "checkpoint_mb": ckpt_bytes / 1e6, "repeats": repeats,
                    "torch_threads": threads or "default", "methods": {}}
    for m in methods:
        secs = statistics.median(s["seconds"] for s in samples[m])
        peak = max(s["peak_bytes"] for s in samples[m])
        result["methods"][m] = {"seconds": secs, "gb_per_s": input_bytes / secs / 1e9, "peak_mb": peak / 1e6,
                                "peak_checkpoints": peak / ckpt_bytes,
                                "max_abs_diff_vs_naive": _max_diff(workdir / f"out-{m}", workdir / "out-naive")}
    ours = result["methods"]["stream"]
    result["ratios"] = {f"stream/{m}": {"throughput": ours["gb_per_s"] / result["methods"][m]["gb_per_s"],
                                        "peak_memory": ours["peak_mb"] / max(result["methods"][m]["peak_mb"], 1e-9)}
                        for m in methods if m != "stream"}
    if not has_mergekit:
        result["mergekit"] = f"skipped: {why}"
    result["note"] = ("stream also fsyncs its output and hashes it while writing (the checkpoint contract); "
                      "naive and mergekit write without fsync, so their times leave the disk flush out")
    return result


def render(r: dict) -> str:
    lines = [f"merge of {r['n']} x `{r['preset']}` checkpoints ({r['checkpoint_mb']:.0f} MB each), median of "
             f"{r['repeats']}, torch threads {r['torch_threads']}"]
    lines.append(f"{'method':<15}{'seconds':>9}{'GB/s in':>9}{'peak MB':>9}{'peak/ckpt':>10}{'max|Δ| vs naive':>17}")
    for m, v in r["methods"].items():
        lines.append(f"{m:<15}{v['seconds']:>9.2f}{v['gb_per_s']:>9.2f}{v['peak_mb']:>9.0f}{v['peak_checkpoints']:>10.2f}"
                     f"{v['max_abs_diff_vs_naive']:>17.2e}")
    for name, v in r["ratios"].items():
        lines.append(f"{name}: throughput x{v['throughput']:.2f}, peak memory x{v['peak_memory']:.3f}")
    if "mergekit" in r:
        lines.append(f"mergekit: {r['mergekit']}")
    lines.append("note: " + r["note"])
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=8, help="checkpoints to merge")
    ap.add_argument("--preset", default="small", help="model preset of the checkpoints")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per method (median time, max peak)")
    ap.add_argument("--workdir", type=Path, help="keep the checkpoints here (reused across runs)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads in every method (0: torch's default); a merge is memory-bound, "
                         "and on a busy host extra threads mostly add wake-up stalls")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.inputs, args.out, args.threads)
        return
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run(args.n, args.preset, args.repeats, args.workdir, args.threads)
    else:
        with tempfile.TemporaryDirectory(prefix="merge-bench-") as tmp:
            result = run(args.n, args.preset, args.repeats, Path(tmp), args.threads)
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
