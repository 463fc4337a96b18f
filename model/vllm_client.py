"""The HTTP calls we make to a vLLM OpenAI-compatible server: one small client, no vLLM import.

    client = VLLMClient("http://127.0.0.1:8000", who="rollouts")
    client.completions({"prompt": [[5, 6, 7]], "max_tokens": 8, ...})   # POST /v1/completions
    client.reload_weights("/runs/.../vllm-weights")   # POST /collective_rpc (the server's dev endpoints)
    client.reset_prefix_cache()

Rollouts (model/rollout/vllm.py), teachers (model/teachers.py) and `stagewise serve-model`'s health
check go through it, so a server that is down, or answers an error, reads the same everywhere: a
RuntimeError naming who was asked, the URL and vLLM's own message. The trainer runs in our
environment and vLLM in its own (its CPU build pins an older transformers), so everything crosses
HTTP as JSON; nothing here needs vLLM installed.

Weight reload: `reload_weights` is vLLM's worker method `reload_weights(weights_path=...)`, reached
through `POST /collective_rpc`, which the server offers only with VLLM_SERVER_DEV_MODE=1 (our
launcher, model/vllm_server.py, sets it). The path is read by the server, so it must be on a file
system the server sees (the same machine, or a shared one).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class VLLMClient:
    """JSON over HTTP to one vLLM server (see the module docstring). `who` (what asks) begins its errors,
    `hint` (how to start a server) ends the one for a server that does not answer."""

    def __init__(self, url: str, timeout_s: float = 600.0, who: str = "", hint: str = ""):
        self.url, self.timeout_s, self.who, self.hint = url.rstrip("/"), timeout_s, who, hint
        self._model: str | None = None

    def request(self, path: str, body: dict | None = None, timeout_s: float | None = None) -> Any:
        """GET `path` (body None) or POST `body` as JSON; the decoded answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise RuntimeError(f"{self._who}the vLLM server at {self.url} answered {err.code} to {path}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            raise RuntimeError(f"{self._who}no vLLM server answers at {self.url} ({err}){self.hint}") from None
        return json.loads(raw) if raw.strip() else None

    @property
    def _who(self) -> str:
        return f"{self.who}: " if self.who else ""

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """GET /health answers 200."""
        try:
            self.request("/health", timeout_s=timeout_s)
        except RuntimeError:
            return False
        return True

    def model(self) -> str:
        """The served model's name (GET /v1/models, its only entry; asked once)."""
        if self._model is None:
            models = [m.get("id") for m in (self.request("/v1/models") or {}).get("data", [])]
            if len(models) != 1:
                raise RuntimeError(f"{self._who}the vLLM server at {self.url} serves {models}; name the model explicitly")
            self._model = models[0]
        return self._model

    def completions(self, body: dict) -> dict:
        """POST /v1/completions with `body` (the served model filled in when absent)."""
        return self.request("/v1/completions", {"model": self.model(), **body})

    def chat(self, body: dict) -> dict:
        """POST /v1/chat/completions with `body` (the served model filled in when absent)."""
        return self.request("/v1/chat/completions", {"model": self.model(), **body})

    def reload_weights(self, weights_dir: str) -> None:
        """The server's workers load every *.safetensors file of `weights_dir` in place (dev endpoints)."""
        self.request("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}})

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (computed under the old weights)."""
        self.request("/reset_prefix_cache", {})
