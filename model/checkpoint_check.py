"""Is this directory a checkpoint we can load? Checked before anything loads it, each problem named.

A checkpoint directory handed to the CLI (`stagewise inspect`, `eval`, `merge`, `data pack
--tokenizer`) or named by `model.from` is user input: a missing or unparsable `config.json`,
a config field of the wrong type, a truncated `model.safetensors`, weights whose embedding
does not match the config, or a missing tokenizer would otherwise surface as a traceback deep
inside transformers (or, worse, as randomly initialised weights). check_checkpoint() reads
only JSON and safetensors headers (no tensors, no model) and raises the project's one bad-input
type, data.errors.BadInput (exit 2), naming the file and the field.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import NemotronHConfig

from stagewise.data.errors import BadInput, read_utf8
from stagewise.model.config import MTPConfig

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
META = "stagewise.json"
TOKENIZER_FILES = ("tokenizer.json",)
MODEL_TYPE = "nemotron_h"
_MAX_HEADER = 100 * 1024 * 1024
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_EMBEDDINGS = ("backbone.embeddings.weight", "model.embeddings.weight")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; BadInput naming the file (and line) otherwise."""
    text = read_utf8(path)
    try:
        doc = json.loads(text)
    except ValueError as e:
        line = getattr(e, "lineno", None)
        raise BadInput(f"{path}{f':{line}' if line else ''}: not valid JSON ({getattr(e, 'msg', e)})") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: must hold a JSON object, got a JSON {type(doc).__name__}")
    return doc


@lru_cache(maxsize=1)
def _config_defaults() -> dict[str, Any]:
    return NemotronHConfig().to_dict()


def _type_problem(key: str, value: Any, default: Any) -> str | None:
    """Why `value` cannot stand where NemotronHConfig's default is `default` (None: it can)."""
    if default is None or value is None and default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be true or false; got {value!r}"
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer; got {value!r}"
        return f"must be > 0; got {value}" if default > 0 and value <= 0 else None
    if isinstance(default, float):
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else f"must be a number; got {value!r}"
    if isinstance(default, str):
        return None if isinstance(value, str) else f"must be a string; got {value!r}"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, list) else f"must be a list; got {value!r}"
    if isinstance(default, dict):
        return None if isinstance(value, dict) else f"must be a mapping; got {value!r}"
    return None


def check_config(root: Path, nemotron: bool = True) -> dict[str, Any]:
    """config.json of a checkpoint: present, a JSON object, and (nemotron) a NemotronH config
    whose fields have the right types."""
    path = root / CONFIG
    if not path.is_file():
        raise BadInput(f"{root}: not a checkpoint directory (no {CONFIG})")
    config = read_json_object(path)
    if not nemotron:
        return config
    if config.get("model_type") != MODEL_TYPE:
        raise BadInput(f"{path}: model_type must be {MODEL_TYPE!r}; got {config.get('model_type')!r}")
    defaults = _config_defaults()
    problems = [f"{path}: {key} {why}" for key, value in config.items()
                if key in defaults and (why := _type_problem(key, value, defaults[key]))]
    if problems:
        raise BadInput(problems[:5], f"{root} has a broken {CONFIG}:")

    try:
        NemotronHConfig.from_pretrained(str(root))  # how the model loaders read it
    except Exception as e:  # transformers checks the rest (pattern lengths, head divisibility, ...)
        raise BadInput(f"{path}: not a valid NemotronH config: {e}") from None
    return config


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Tensor entries of a safetensors file, checked against the file's size (truncation)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise BadInput(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise BadInput(f"{path}: not a safetensors file (header length {n}, file size {size})")
            text = f.read(n)
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise BadInput(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise BadInput(f"{path}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        ok = (isinstance(entry, dict) and entry.get("dtype") in _DTYPE_BYTES and isinstance(entry.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
              and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(isinstance(o, int) for o in entry["data_offsets"]))
        if not ok:
            raise BadInput(f"{path}: tensor {name!r} has a malformed header entry")
        begin, stop = entry["data_offsets"]
        count = 1
        for d in entry["shape"]:
            count *= d
        if not 0 <= begin <= stop or stop - begin != count * _DTYPE_BYTES[entry["dtype"]]:
            raise BadInput(f"{path}: tensor {name!r}: data offsets do not match its shape and dtype")
        end = max(end, stop)
    if 8 + n + end > size:
        raise BadInput(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size}")
    return header


def check_weights(root: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Every weights file is whole, and the embedding matches the config's vocab and hidden size."""
    if (root / INDEX).is_file():
        index = read_json_object(root / INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BadInput(f"{root / INDEX}: weight_map must map tensor names to file names")
        files = sorted(set(weight_map.values()))
    elif (root / SINGLE).is_file():
        files = [SINGLE]
    else:
        raise BadInput(f"{root}: no weights ({SINGLE} or {INDEX})")
    tensors: dict[str, Any] = {}
    for name in files:
        if "/" in name or name.startswith(".") or not (root / name).is_file():
            raise BadInput(f"{root / INDEX}: names {name!r}, which is not a file of the checkpoint")
        tensors.update(read_safetensors_header(root / name))
    want = [config.get("vocab_size"), config.get("hidden_size")]
    for key in _EMBEDDINGS:
        if key in tensors and all(isinstance(w, int) for w in want) and tensors[key]["shape"] != want:
            raise BadInput(f"{root}: {key} has shape {tensors[key]['shape']} but {CONFIG} says "
                           f"vocab_size x hidden_size = {want}: the weights are not this config's")
    return tensors


def check_tokenizer(root: Path) -> None:
    """A tokenizer directory: tokenizer.json loadable by `tokenizers`, its JSON side files parsable,
    and tokenizer_config.json naming an eos token the vocabulary has."""
    if not root.is_dir():
        raise BadInput(f"{root}: not a tokenizer directory")
    path = root / TOKENIZER_FILES[0]
    if not path.is_file():
        raise BadInput(f"{root}: no tokenizer ({TOKENIZER_FILES[0]} is missing)")

    try:
        text = read_utf8(path)
        tok = Tokenizer.from_str(text)
    except BadInput:
        raise
    except Exception as e:  # tokenizers raises its own Exception type for a bad file
        raise BadInput(f"{path}: not a loadable tokenizer ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
    docs = {name: read_json_object(root / name)  # transformers reads these too when it loads the tokenizer
            for name in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", CONFIG)
            if (root / name).is_file()}
    eos = docs.get("tokenizer_config.json", {}).get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if not isinstance(eos, str) or tok.token_to_id(eos) is None:
        raise BadInput(f"{root / 'tokenizer_config.json'}: eos_token must name a token of {path.name} "
                       f"(every document ends with one); got {eos!r}")


def has_weights(root: str | Path) -> bool:
    """Does the directory hold weights at all (a config-only directory can still be sized)?"""
    return (Path(root) / SINGLE).exists() or (Path(root) / INDEX).exists()


def check_meta(path: Path) -> dict[str, Any]:
    """stagewise.json: a JSON object whose fields merging, resume and MTP read have their types."""
    meta = read_json_object(path)
    problems = []
    for key in ("step", "tokens_seen"):
        v = meta.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            problems.append(f"{path}: {key} must be a whole number >= 0; got {v!r}")
    for key in ("weight_sha256", "stage", "recipe_hash", "parent"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            problems.append(f"{path}: {key} must be a string; got {meta[key]!r}")
    for key in ("extra", "mtp"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            problems.append(f"{path}: {key} must be a mapping; got {meta[key]!r}")
    mtp = meta.get("mtp") or (meta.get("extra") or {}).get("mtp") if isinstance(meta.get("extra") or {}, dict) else None
    if mtp:
        try:
            MTPConfig.model_validate(mtp)
        except Exception as e:  # pydantic's ValidationError, or a non-mapping
            problems.append(f"{path}: mtp is not a valid MTP setting: {str(e).splitlines()[0]}")
    if problems:
        raise BadInput(problems, f"{path.parent} has a broken {META}:")
    return meta


def check_checkpoint(path: str | Path, weights: bool = True, tokenizer: bool = False,
                     nemotron: bool = True) -> dict[str, Any]:
    """Check a checkpoint directory before it is loaded; returns its config.json. Raises BadInput.

    weights: the safetensors files must be whole and fit the config; tokenizer: a loadable
    tokenizer.json must be there too (what evaluation and chat need); nemotron: config.json must
    be a NemotronH config (merging averages any safetensors model, so it checks only the files).
    """
    root = Path(path)
    if not root.is_dir():
        raise BadInput(f"{root}: not a checkpoint directory ({'a file' if root.exists() else 'does not exist'})")
    config = check_config(root, nemotron)
    if (root / META).is_file():
        check_meta(root / META)
    if weights:
        check_weights(root, config)
    if tokenizer:
        check_tokenizer(root)
    return config
