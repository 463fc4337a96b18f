"""The tokenizer: a byte-level BPE trained on the sources, or an existing HF tokenizer.

Either way the result is a directory that `AutoTokenizer.from_pretrained` loads, with the
special tokens every later stage relies on: ids 0/1/2 are pad/bos/eos (NemotronHConfig's
defaults), then the chat and tool markers that SFT reserves. Training is capped by
`max_train_chars`, shared fairly between the training sources, so prepare stays fast.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from stagewise.data.config import TokenizerConfig
from stagewise.data.errors import BadInput

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *CHAT_TOKENS]
"""In id order: pad=0, bos=1, eos=2, then the SFT markers."""


def train_bpe(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (no unknown tokens) with SPECIAL_TOKENS at ids 0..10.

    Digits are split one per token (as Llama's tokenizer does) so that column arithmetic
    sees every digit as its own token, whatever the number around it.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The HF wrapper with bos/eos/pad and the chat markers registered."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   extra_special_tokens=CHAT_TOKENS)


def capped(sources: list[Iterable[str]], max_chars: int) -> Iterator[str]:
    """Texts from each source in turn; each gets an equal share of what is left of max_chars."""
    left = max_chars
    for i, texts in enumerate(sources):
        budget = left // (len(sources) - i)
        used = 0
        for text in texts:
            if used >= budget:
                break
            text = text[: budget - used]
            used += len(text)
            yield text
        left -= used


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer directory; it must define an eos token (every document ends with one)."""
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.eos_token_id is None:
        raise BadInput(f"tokenizer at {path} has no eos token; documents must end with one")
    return tok


def build_tokenizer(cfg: TokenizerConfig, corpus: Mapping[str, Callable[[], Iterable[str]]],
                    base_dir: Path, out_dir: Path) -> Path:
    """Train (or copy from cfg.path) the tokenizer into out_dir and return out_dir.

    `corpus` maps source name -> a function returning its texts (read lazily, and only for
    cfg.train_sources, default all).
    """
    out_dir = Path(out_dir)
    if cfg.path is not None:
        tok = load_tokenizer(existing_tokenizer_dir(cfg, base_dir))
    else:
        names = cfg.train_sources or list(corpus)
        missing = sorted(set(names) - set(corpus))
        if missing:
            raise BadInput(f"tokenizer.train_sources names unknown sources {missing}")
        tok = train_bpe(capped([corpus[n]() for n in names], cfg.max_train_chars), cfg.vocab_size)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tok.save_pretrained(str(out_dir))
    return out_dir


def existing_tokenizer_dir(cfg: TokenizerConfig, base_dir: Path) -> Path:
    """cfg.path resolved against base_dir (it must be a directory)."""
    assert cfg.path is not None
    path = Path(cfg.path).expanduser()
    path = path if path.is_absolute() else Path(base_dir) / path
    if not path.is_dir():
        raise BadInput(f"tokenizer.path {cfg.path!r}: {path} is not a directory")
    return path
