"""What the `vllm` tests compare vLLM's answers with ours by (tests/model/test_vllm_real.py,
tests/e2e/test_rl_on_vllm.py): chat prompts through the checkpoint's own template, and greedy
answers equal up to a tie the kernels may break either way."""

from __future__ import annotations

import torch


def prompts(tokenizer, n: int = 32) -> list[list[int]]:
    """n chat prompts rendered by the checkpoint's own template (the generation prompt included)."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i + 1}?"}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for i in range(n)]


def greedy_agrees(policy, prompt: list[int], got: list[int], want: list[int]) -> bool:
    """Equal, or diverging first where `policy`'s (the trainer's) top two logits at that position are within 1e-4:
    a tie fp32 kernels may break either way."""
    if got == want:
        return True
    k = next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-2])) if a != b)
    with torch.no_grad():
        logits = policy(torch.tensor([prompt + want[:k]])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1]) < 1e-4
