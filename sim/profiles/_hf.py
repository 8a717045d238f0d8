"""A model profile from a Hugging Face ``config.json`` (a local file, or a model folder holding one).

Read: layers, hidden size, attention and KV heads, head dim, intermediate size, vocab, dtype, tied embeddings,
max positions, and for mixture-of-experts models the experts and experts per token.  Names vary by
architecture, so each field is looked up under the spellings transformers' configs use (Llama/Mistral/Qwen:
``num_hidden_layers``, GPT-2: ``n_layer``, ...); a multimodal config's ``text_config`` is read for its language
model.  Parameters are counted from the architecture (gated MLP, as in Llama, Mistral, Qwen and Mixtral):

- per layer: attention ``hidden * head_dim * (2 * heads + 2 * kv_heads)`` (q, o, k, v), MLP ``3 * hidden *
  intermediate`` per expert (plus the router ``hidden * experts`` for MoE), two norms ``2 * hidden``;
- embeddings ``vocab * hidden``, once more for the LM head unless the embeddings are tied.

Active parameters count ``experts_per_token`` experts.  A field that is missing, of the wrong type or out of
range is a ConfigError naming the file and the key.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.fields import at, fail, file_error, in_file
from sim.profiles._types import ModelProfile

#: Accepted spellings of each field, first match wins (transformers' config classes).
_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "vocab_size": ("vocab_size",),
    "max_model_len": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "num_experts_per_token", "top_k"),
}
_DTYPES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


def config_path(value: str | Path) -> Path | None:
    """The ``config.json`` that ``value`` names (the file, or a folder holding it); None if it names none."""
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "config.json"
        return path if path.is_file() else None
    if path.is_file() and path.suffix == ".json":
        return path
    return None


def _get(cfg: dict, field: str, where: str, *, required: bool = True, default: Any = None, minimum: int = 1) -> Any:
    for key in _KEYS[field]:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise fail(at(where, key), "a whole number", value)
            if value < minimum:
                raise fail(at(where, key), f">= {minimum}", value)
            return value
    if required:
        raise ConfigError(at(where, _KEYS[field][0]), f"is required (looked for {', '.join(_KEYS[field])})")
    return default


@functools.cache
def _load(path: str):
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise file_error(path, f"cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise file_error(path, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise file_error(path, "must hold a JSON object (a Hugging Face config.json)")
    try:
        return _profile(raw, path)
    except ConfigError as exc:
        raise in_file(exc, path) from None


def _profile(raw: dict, path: str):
    cfg, where = raw, ""
    if "text_config" in raw and isinstance(raw["text_config"], dict) and not any(k in raw for k in _KEYS["num_layers"]):
        cfg, where = raw["text_config"], "text_config"
    layers = _get(cfg, "num_layers", where)
    hidden = _get(cfg, "hidden_size", where)
    heads = _get(cfg, "num_attention_heads", where)
    kv_heads = _get(cfg, "num_kv_heads", where, required=False, default=heads)
    if heads % kv_heads:
        raise ConfigError(at(where, "num_key_value_heads"), f"{kv_heads} does not divide num_attention_heads {heads}")
    head_dim = _get(cfg, "head_dim", where, required=False, default=None)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(at(where, "head_dim"), f"is required: hidden_size {hidden} is not a multiple of "
                                                     f"num_attention_heads {heads}")
        head_dim = hidden // heads
    intermediate = _get(cfg, "intermediate_size", where, required=False, default=4 * hidden)
    vocab = _get(cfg, "vocab_size", where)
    max_len = _get(cfg, "max_model_len", where)
    experts = _get(cfg, "num_experts", where, required=False, default=1)
    per_token = _get(cfg, "experts_per_token", where, required=False, default=1) if experts > 1 else 1
    if per_token > experts:
        raise ConfigError(at(where, "num_experts_per_tok"), f"{per_token} exceeds the {experts} experts")
    expert_size = _get(cfg, "moe_intermediate_size", where, required=False, default=intermediate) \
        if experts > 1 else intermediate
    tied = raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    if not isinstance(tied, bool):
        raise fail("tie_word_embeddings", "true or false", tied)
    dtype = raw.get("torch_dtype") or raw.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dtype not in _DTYPES:
        raise fail("torch_dtype", f"one of {sorted(_DTYPES)}", dtype)

    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp_per_expert = 3 * hidden * expert_size
    router = hidden * experts if experts > 1 else 0
    norms = 2 * hidden
    embeddings = vocab * hidden * (1 if tied else 2) + hidden
    total = layers * (attention + experts * mlp_per_expert + router + norms) + embeddings
    active = layers * (attention + per_token * mlp_per_expert + router + norms) + embeddings
    folder = Path(path).parent.name or Path(path).stem
    return ModelProfile(
        name=folder, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=expert_size if experts > 1 else intermediate, vocab_size=vocab,
        params_b=total / 1e9, max_model_len=max_len, source=str(path),
        active_params_b=active / 1e9 if experts > 1 else None, num_experts=experts, experts_per_token=per_token,
        dtype=str(dtype), tie_word_embeddings=tied,
    )


def model_from_hf_config(value: str | Path):
    """The ModelProfile of a Hugging Face ``config.json`` (the file or its folder); ConfigError if unreadable."""
    path = config_path(value)
    if path is None:
        raise file_error(value, "no config.json there (give a Hugging Face model folder or its config.json)")
    return _load(str(path.resolve()))


__all__ = ["config_path", "model_from_hf_config"]
