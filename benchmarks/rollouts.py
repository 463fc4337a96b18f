"""Rollout sampling: our HF generator against transformers' own sampling `generate` (and a vLLM
server with --vllm), same prompts, same model, one run.

    python benchmarks/rollouts.py [--prompts 64] [--samples 4] [--max-new-tokens 11] [--json]
    STAGEWISE_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/rollouts.py --vllm

Both sample n responses per prompt from the demo's `tiny` preset (random weights: the work per
token does not depend on them) at temperature 1 over the whole vocabulary, on prompts of the
demo's RL lengths (30-50 tokens), 128 rows per generate call:
- ours:          model/rollout/hf.py's HFGenerator (a prompt's n samples share one prefill; the
                 draw is by inverse CDF from a private seeded generator);
- transformers:  `model.generate(do_sample=True, top_k=0, num_return_sequences=n)`, the stock path
                 (every row prefilled; torch.multinomial).
- vllm (--vllm):  model/rollout/vllm.py's VLLMGenerator against a vLLM server on the same weights
                 (fp32, started by model/vllm_server.py; its start-up reported apart). vLLM's CPU
                 build serves no MoE layer, so --vllm runs every column on `tiny-dense`.
Reported: sampled tokens/s of each (best of --repeat) and their ratios, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from packing import timed as best_of  # noqa: E402  (best of `repeat` runs, one helper for every benchmark)

END = 2


def prompts_like_the_demo(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(30, 51))] for _ in range(count)]


def ours(model, prompts: list[list[int]], n: int, max_new: int) -> int:
    from stagewise.model.rollout.hf import HFGenerator

    groups = HFGenerator(model, [END], 0).generate(prompts, n, max_new, 1.0, seed=0)
    return sum(len(r.response_ids) for g in groups for r in g)


@torch.no_grad()
def transformers_sampling(model, prompts: list[list[int]], n: int, max_new: int, rows: int = 128) -> int:
    """The stock sampling path, in generate calls of `rows` rows like ours."""
    torch.manual_seed(0)
    per_call, sampled = max(1, rows // n), 0
    order = sorted(prompts, key=len)
    for start in range(0, len(order), per_call):
        part = order[start:start + per_call]
        width = max(map(len, part))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in part])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part])
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             num_return_sequences=n, max_new_tokens=max_new, eos_token_id=END, pad_token_id=0)
        sampled += tokens_until_end(out[:, width:])
    return sampled


def tokens_until_end(new: torch.Tensor) -> int:
    """Sampled tokens of [rows, T] continuations: each row's up to and including its first END
    (generate pads a finished row after it), as ours counts a response."""
    ended = (new == END).int().cumsum(1)
    return int(((ended == 0) | ((ended == 1) & (new == END))).sum())


def vllm_column(model, batch: list[list[int]], n: int, max_new: int, repeat: int) -> dict:
    """The same sampling through a vLLM server on `model`'s weights (saved to a temporary directory)."""
    import tempfile
    import time

    from stagewise.data.tokenizer import train_bpe
    from stagewise.data.world.arithmetic import arithmetic_texts
    from stagewise.model.rollout.vllm import VLLMGenerator
    from stagewise.model.vllm_server import VLLMServer

    with tempfile.TemporaryDirectory() as ckpt:
        model.save_pretrained(ckpt)
        train_bpe(arithmetic_texts(50, 0), 300).save_pretrained(ckpt)  # vLLM loads one; prompts are token ids
        t0 = time.monotonic()
        with VLLMServer(ckpt, dtype="float32") as server:
            start = time.monotonic() - t0
            gen = VLLMGenerator(model, [END], 0, url=server.url, keep_copy=False)

            def sample() -> int:
                return sum(len(r.response_ids) for g in gen.generate(batch, n, max_new, 1.0, seed=0) for r in g)

            sample()  # the first request warms the server's kernels
            seconds, tokens = best_of(sample, repeat)
            gen.close()
    return {"seconds": seconds, "sampled_tokens": tokens, "tokens_per_s": tokens / seconds, "startup_s": start}


def run(prompts: int, samples: int, max_new: int, repeat: int, threads: int | None, with_vllm: bool = False) -> dict:
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    if threads:
        torch.set_num_threads(threads)
    preset = "tiny-dense" if with_vllm else "tiny"
    model = build_model(ModelConfig(preset=preset), 4096, seed=0).eval()
    model.generation_config.use_cache = True
    batch = prompts_like_the_demo(prompts, 4096)
    t_ours, n_ours = best_of(lambda: ours(model, batch, samples, max_new), repeat)
    t_hf, n_hf = best_of(lambda: transformers_sampling(model, batch, samples, max_new), repeat)
    out = {"preset": preset, "prompts": prompts, "samples": samples, "max_new_tokens": max_new,
           "threads": torch.get_num_threads(),
           "ours": {"seconds": t_ours, "sampled_tokens": n_ours, "tokens_per_s": n_ours / t_ours},
           "transformers": {"seconds": t_hf, "sampled_tokens": n_hf, "tokens_per_s": n_hf / t_hf}}
    out["speed_ratio_ours_over_transformers"] = out["ours"]["tokens_per_s"] / out["transformers"]["tokens_per_s"]
    if with_vllm:
        out["vllm"] = vllm_column(model, batch, samples, max_new, repeat)
        out["speed_ratio_vllm_over_ours"] = out["vllm"]["tokens_per_s"] / out["ours"]["tokens_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4, help="responses per prompt (the demo: 4 in RL, 8 held out)")
    ap.add_argument("--max-new-tokens", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--vllm", action="store_true", help="add a vLLM server's column (STAGEWISE_VLLM_PYTHON; tiny-dense)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.prompts, args.samples, args.max_new_tokens, args.repeat, args.threads, args.vllm)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"preset {out['preset']}, {out['prompts']} prompts x {out['samples']} samples, {out['threads']} torch threads")
    for name in ("ours", "transformers", "vllm"):
        r = out.get(name)
        if r:
            print(f"{name:>12}: {r['tokens_per_s']:>9,.0f} sampled tokens/s ({r['sampled_tokens']} in {r['seconds']:.2f} s)"
                  + (f"; server start {r['startup_s']:.0f} s" if "startup_s" in r else ""))
    print(f"ours / transformers = {out['speed_ratio_ours_over_transformers']:.2f}x")
    if "vllm" in out:
        print(f"vllm / ours = {out['speed_ratio_vllm_over_ours']:.2f}x")
    return 0


if __name__ == "__main__":  # the guard vLLM's spawned workers need too
    sys.exit(main())
