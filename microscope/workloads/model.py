"""A small LLaMA-style decoder-only transformer whose swap points are explicit attributes.

Layout: token embedding -> N pre-norm blocks (x + attn(norm(x)), x + mlp(norm(x))) -> final norm ->
untied output projection. RoPE positions, no biases, dropout 0 by default.

Swap points, so an ablation plugin changes exactly one thing (``patch(model, variant)``):

==========================  ===========================================================================
``block.attn.attn_fn``      ``attn_fn(q, k, v, causal) -> o``, q/k/v (B, H, S, D); default
                            ``EagerAttention()`` whose ``.scale`` (None = 1/sqrt(D)) may be set.
                            ``model.set_attention(fn)`` replaces it in every block.
``block.attn_norm``,        ordinary ``nn.Module`` norms (``RMSNorm`` or ``nn.LayerNorm``); replace with
``block.mlp_norm``,         any module mapping (..., d_model) -> (..., d_model).
``model.norm``
``block.mlp.act``           the MLP activation, a plain callable (GELU, or SiLU inside SwiGLU); with
                            ``mlp_norm=True`` a ``NormGelu`` module (LayerNorm over the hidden units,
                            then GELU) whose ``weight``/``bias`` a replacement must reuse.
``block.mlp.glu``            SwiGLU only: ``glu(gate, up) -> hidden`` replacing ``act(gate) * up`` (a fused
                            or activation-compressing kernel); None keeps the default.
``block.checkpoint``        bool: recompute this block in backward (torch.utils.checkpoint,
                            use_reentrant=False); ``model.set_checkpointing(every=k)`` sets every k-th.
``model.rotary``            the RoPE table module (``RotaryEmbedding``); replace for RoPE scaling.
``model.cache_cls``         the KV-cache class ``prefill``/``decode_step`` instantiate (``KVCache``).
every ``nn.Linear``         the q/k/v, output, MLP and output-head projections; ``model.swap_linears(make)``
                            replaces each with ``make(name, linear)`` (e.g. a quantized Linear).
==========================  ===========================================================================

Weights are initialised from a CPU generator seeded by ``build_model(config, seed)``, so baseline
and candidate start from identical weights on any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from microscope.workloads.attention import AttnFn, EagerAttention, RotaryEmbedding, apply_rotary
from microscope.workloads.kv_cache import KVCache
from microscope.workloads.tokenizer import VOCAB_SIZE

__all__ = ["MLP", "Attention", "Block", "ModelConfig", "NormGelu", "RMSNorm", "Transformer", "build_model"]

_NORMS = ("rmsnorm", "layernorm")
_MLPS = ("gelu", "swiglu")


@dataclass(frozen=True)
class ModelConfig:
    """Size and flavour of the model.

    ``context`` is the training context; the model itself accepts longer inputs (RoPE has no table
    limit), which is how extrapolation to 2x/4x is measured. ``ffn_dim=None`` picks 4*d for GELU and
    8/3*d (rounded up to a multiple of 32) for SwiGLU, so both flavours have about the same
    parameter count and an MLP ablation compares like with like. ``mlp_norm`` (GELU MLP only) adds a
    LayerNorm over the hidden units before the activation (up -> LayerNorm -> GELU -> down), the
    normalised-FFN layout that puts a LayerNorm directly in front of a GELU, which is what a fused
    LayerNorm+GELU kernel replaces.
    """

    vocab_size: int = VOCAB_SIZE
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    context: int = 128
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    ffn_dim: int | None = None
    mlp_norm: bool = False
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head_dim={self.d_model // self.n_heads} must be even for RoPE")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")
        if self.mlp not in _MLPS:
            raise ValueError(f"mlp must be one of {_MLPS}, got {self.mlp!r}")
        if self.mlp_norm and self.mlp != "gelu":
            raise ValueError(f"mlp_norm (a LayerNorm before the GELU) needs mlp='gelu', got {self.mlp!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """The MLP's inner width."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        if self.mlp == "gelu":
            return 4 * self.d_model
        return 32 * math.ceil(8 * self.d_model / 3 / 32)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm: x / rms(x) * weight, computed in float32 and cast back."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The norm ``cfg.norm`` names (a fresh module)."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


class Attention(nn.Module):
    """Multi-head self-attention: fused QKV projection, RoPE on q and k, ``attn_fn``, output projection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attn_fn: AttnFn = EagerAttention()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Without a cache: training/evaluation (causal). With one, the cache stores k and v and runs the
        # attention over all it holds (causal for a prefill, not for a one-token decode step).
        o = self.attn_fn(q, k, v, True) if cache is None else cache.attend(self.layer_idx, q, k, v, self.attn_fn)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))


class NormGelu(nn.Module):
    """``gelu(layer_norm(h))`` over the MLP's hidden units: the eager pair a fused kernel replaces.

    It owns the norm's ``weight`` and ``bias`` so a replacement module can take over the very same
    parameters (same names, same optimizer state) and change only how the pair is computed.
    """

    def __init__(self, dim: int, eps: float = 1e-5, approximate: str = "none") -> None:
        super().__init__()
        self.eps = eps
        self.approximate = approximate
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(h, self.weight.shape, self.weight, self.bias, self.eps)
        return F.gelu(normed, approximate=self.approximate)


class MLP(nn.Module):
    """GELU MLP (up, act, down) or SwiGLU (act(gate) * up, down); ``self.act`` is the swap point."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.mlp
        hidden = cfg.hidden_dim
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.gate = nn.Linear(cfg.d_model, hidden, bias=False) if cfg.mlp == "swiglu" else None
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)
        self.act: Callable[[torch.Tensor], torch.Tensor] = F.silu if cfg.mlp == "swiglu" else F.gelu
        if cfg.mlp_norm:
            self.act = NormGelu(hidden, cfg.norm_eps)
        #: SwiGLU only: ``glu(gate, up) -> hidden`` in place of ``act(gate) * up`` (None: that default)
        self.glu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            if self.glu is not None:
                return self.down(self.glu(self.gate(x), self.up(x)))
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-norm residual block. ``checkpoint=True`` recomputes it in backward to save activations."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.checkpoint = False

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, cache))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    """The decoder: ``forward(tokens) -> logits``; ``prefill``/``decode_step`` for cached generation."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_base)
        self.cache_cls: type[KVCache] = KVCache

    # -- swap-point helpers -------------------------------------------------------------------
    def set_attention(self, attn_fn: AttnFn | type) -> None:
        """Use ``attn_fn`` in every block; a class is instantiated once per block (own attributes)."""
        for block in self.blocks:
            block.attn.attn_fn = attn_fn() if isinstance(attn_fn, type) else attn_fn

    def set_checkpointing(self, every: int) -> None:
        """Checkpoint blocks 0, k, 2k, ... for ``every=k``; ``every=0`` turns checkpointing off."""
        if every < 0:
            raise ValueError(f"checkpoint every must be >= 0, got {every}")
        for i, block in enumerate(self.blocks):
            block.checkpoint = every > 0 and i % every == 0

    def swap_linears(self, make: Callable[[str, nn.Linear], nn.Module]) -> int:
        """Replace every ``nn.Linear`` with ``make(qualified_name, linear)``; returns how many were replaced.

        A replacement that should take trained weights later (``load_state_dict``) must accept the float
        ``weight`` (and ``bias``) keys of the Linear it replaces.
        """
        found = [(name, module) for name, module in self.named_modules() if isinstance(module, nn.Linear)]
        for name, linear in found:
            parent_name, _, attr = name.rpartition(".")
            setattr(self.get_submodule(parent_name) if parent_name else self, attr, make(name, linear))
        return len(found)

    # -- forward ----------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, S, vocab) for ``tokens`` (B, S). With a ``cache``, the tokens continue it.

        With a non-empty cache only one new token per call is supported (see the attention contract:
        ``causal=True`` is never passed with queries shorter than keys).
        """
        start = 0 if cache is None else cache.seq_len
        if start and tokens.shape[1] != 1:
            raise ValueError("a non-empty KV cache takes one token per call (use decode_step)")
        x = self.embed(tokens)
        cos, sin = self.rotary(start, tokens.shape[1], tokens.device)
        recompute = torch.is_grad_enabled() and cache is None
        for block in self.blocks:
            if block.checkpoint and recompute:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache)
        return self.lm_head(self.norm(x))

    def new_cache(self) -> KVCache:
        """An empty cache of ``self.cache_cls`` for this model's layers."""
        return self.cache_cls(self.cfg.n_layers)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        """Run the prompt ``tokens`` (B, S) once, filling a new cache; returns (logits (B, S, V), cache)."""
        cache = self.new_cache()
        return self(tokens, cache), cache

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, V) for the next position, given the last token (B,) or (B, 1); extends ``cache``."""
        token = token.reshape(-1, 1)
        return self(token, cache)[:, -1]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@torch.no_grad()
def _init_weights(model: Transformer, gen: torch.Generator) -> None:
    """Normal(0, std) for embeddings and projections; residual outputs scaled by 1/sqrt(2 * layers)."""
    std = model.cfg.init_std
    residual_std = std / math.sqrt(2 * model.cfg.n_layers)
    for name, param in model.named_parameters():
        if param.dim() < 2:  # norm weights and biases keep their defaults (ones / zeros)
            continue
        s = residual_std if name.endswith(("attn.proj.weight", "mlp.down.weight")) else std
        param.copy_(torch.randn(param.shape, generator=gen) * s)


def build_model(cfg: ModelConfig, seed: int = 0, device: torch.device | str = "cpu") -> Transformer:
    """A freshly initialised model: identical weights for the same (cfg, seed) on every device."""
    model = Transformer(cfg)
    _init_weights(model, torch.Generator().manual_seed(seed))
    return model.to(device)
