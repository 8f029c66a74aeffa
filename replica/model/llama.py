"""A plain Llama (GQA, RoPE with Llama-3 scaling, RMSNorm, SwiGLU, tied or untied embeddings); no LoRA here.

Module names mirror Hugging Face's LlamaForCausalLM so checkpoints load by name. Inputs are packed: the new
tokens of every sequence in the batch are concatenated into one [num_tokens] vector, and the per-step
Context (replica.forward_context) says which KV-cache row and positions they belong to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from replica.errors import UnsupportedModelError
from replica.forward_context import Context, get_context
from replica.kernels import norm_ops, paged_ops
from replica.model.fused import FusedLinear


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face Llama config.json this model uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        """Build from a parsed config.json; reject architectures and activations we do not implement."""
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        if raw.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in archs:
            raise UnsupportedModelError(f"not a Llama checkpoint: model_type={raw.get('model_type')} {archs}")
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act {raw.get('hidden_act')!r}")
        heads = raw["num_attention_heads"]
        rope_scaling = raw.get("rope_scaling")
        rope_theta = raw.get("rope_theta")
        params = raw.get("rope_parameters")  # transformers >= 5 may store rope settings here
        if isinstance(params, dict):
            rope_theta = rope_theta or params.get("rope_theta")
            if rope_scaling is None and params.get("rope_type", "default") != "default":
                rope_scaling = params
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            extra=raw,
        )


def _rope_default(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    return inv_freq


def _rope_linear(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    return inv_freq / scaling["factor"]


def _rope_llama3(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency-dependent scaling, as in transformers' _compute_llama3_parameters."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


ROPE_SCALINGS = {"default": _rope_default, "linear": _rope_linear, "llama3": _rope_llama3}


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Return inv_freq [head_dim // 2] in fp32 on CPU, scaled as the config says."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    )
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_SCALINGS:
        raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r}")
    return ROPE_SCALINGS[kind](inv_freq, scaling)


class RotaryEmbedding(nn.Module):
    """cos and sin of RoPE at given positions, computed in fp32 (as transformers does) once per forward."""

    inv_freq: torch.Tensor  # a buffer [head_dim // 2]

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [num_tokens] -> cos, sin [num_tokens, head_dim] in dtype
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [num_tokens, head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [num_tokens, head_dim]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, scaled in the input dtype."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [num_tokens, hidden]; one kernel on CUDA (replica.kernels.norm_ops)
        return norm_ops.rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    """Grouped-query attention over the KV cache blocks named by the step's Context."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.scale = self.head_dim**-0.5
        self.qkv_proj: FusedLinear | None = None  # set by fuse_projections: one GEMM for q, k and v
        # bound by the model runner: [num_blocks, block_size, kv_heads, head_dim] each
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # x [num_tokens, hidden]; rope: cos, sin [num_tokens, head_dim]
        n, heads, kv_heads, hd = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if self.qkv_proj is not None:  # q, k and v side by side: rotate q and k in one pass
            qkv = self.qkv_proj(x, projections).view(n, heads + 2 * kv_heads, hd)
            q, k = norm_ops.rope(qkv, heads + kv_heads, *rope).split([heads, kv_heads], dim=1)
            v = qkv[:, heads + kv_heads :]
        else:
            q = norm_ops.rope(self.q_proj(x).view(n, heads, hd), heads, *rope)
            k = norm_ops.rope(self.k_proj(x).view(n, kv_heads, hd), kv_heads, *rope)
            v = self.v_proj(x).view(n, kv_heads, hd)
        ctx = get_context()
        if ctx is None or self.k_cache is None:
            out = self._causal(q, k, v)
        else:
            out = self._cached(ctx, q, k, v)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One sequence, no cache: plain causal attention. Returns [num_tokens, heads, head_dim]."""
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            is_causal=True,
            scale=self.scale,
            enable_gqa=True,
        )  # [heads, num_tokens, head_dim]
        return out.transpose(0, 1)

    def _cached(self, ctx: Context, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this step's k/v into their cache slots, then attend each sequence to its own blocks."""
        kc, vc = self.k_cache, self.v_cache  # [num_blocks, block_size, kv_heads, head_dim]
        assert kc is not None and vc is not None  # forward() takes this path only with the cache bound
        paged_ops.write_kv(kc, vc, ctx.slot_mapping, k, v)
        if ctx.all_decode:
            return self._decode(ctx, q)
        out = torch.empty_like(q)  # [num_tokens, heads, head_dim]
        for first, length, ctx_len, blocks in ctx.prefills:
            qs = q[first : first + length].transpose(0, 1)  # [heads, length, head_dim]
            ks = paged_ops.gather_context(kc, blocks, ctx_len).transpose(0, 1)  # [kv_heads, ctx_len, hd]
            vs = paged_ops.gather_context(vc, blocks, ctx_len).transpose(0, 1)
            mask = None
            if ctx_len != length:  # new tokens sit at the end of the context: causal with an offset
                qpos = torch.arange(ctx_len - length, ctx_len, device=q.device)[:, None]
                mask = torch.arange(ctx_len, device=q.device)[None, :] <= qpos  # [length, ctx_len]
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=True
            )
            out[first : first + length] = o.transpose(0, 1)
        if ctx.decode_token_idx.numel():
            out[ctx.decode_token_idx] = self._decode(ctx, q[ctx.decode_token_idx])
        return out

    def _decode(self, ctx: Context, q: torch.Tensor) -> torch.Tensor:
        """Attention of the decoding rows' queries q [num_decodes, heads, head_dim] over their own blocks."""
        kc, vc = self.k_cache, self.v_cache
        assert kc is not None and vc is not None
        if ctx.decode_index is None and not paged_ops.uses_kernel(q.device):  # the first layer builds it
            ctx.decode_index = paged_ops.decode_index(
                ctx.block_tables, ctx.context_lens, ctx.max_decode_blocks, kc.shape[1]
            )
        return paged_ops.paged_decode(
            q, kc, vc, ctx.block_tables, ctx.context_lens, ctx.max_decode_blocks, self.scale, ctx.decode_index
        )  # [num_decodes, heads, head_dim]


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.gate_up_proj: FusedLinear | None = None  # set by fuse_projections: one GEMM for gate and up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [num_tokens, hidden]
        projections = (self.gate_proj, self.up_proj)
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x, projections).split(self.gate_up_proj.sizes, dim=-1)
        else:
            gate, up = (proj(x) for proj in projections)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # x [num_tokens, hidden]; rope: cos, sin [num_tokens, head_dim]
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder stack and final norm."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids [num_tokens]; positions [num_tokens] -> hidden [num_tokens, hidden]
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions, x.dtype)  # shared by every layer
        for layer in self.layers:
            x = layer(x, rope)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Llama with its LM head; forward returns hidden states, compute_logits maps chosen rows to the vocab."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids [num_tokens]; positions [num_tokens] -> hidden [num_tokens, hidden]
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden [n, hidden] -> logits [n, vocab] in fp32
        return self.lm_head(hidden).float()
