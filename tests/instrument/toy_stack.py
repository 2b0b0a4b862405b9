"""A tiny transformer-ish stack for the instrument tests: layers.0..3, each with attn and mlp.

Attention calls a swappable ``attn_fn(q, k, v)`` attribute (a plain callable, like the embedded
workload's swap point), so tests can replace eager attention by a custom autograd.Function or SDPA.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL, HEADS, SEQ, BATCH = 16, 2, 8, 2


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """matmul -> softmax -> matmul, the textbook "before"."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


class FusedAttention(torch.autograd.Function):
    """A stand-in for a fused kernel: one Function, its own backward (SDPA math inside)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return F.scaled_dot_product_attention(q, k, v)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return FusedAttention.apply(q, k, v)


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.attn_fn = eager_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, D_MODEL // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        o = self.attn_fn(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, s, D_MODEL))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D_MODEL, 2 * D_MODEL)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attn()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class TinyStack(nn.Module):
    def __init__(self, n_layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
        self.head = nn.Linear(D_MODEL, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_model(seed: int = 0) -> TinyStack:
    torch.manual_seed(seed)
    return TinyStack()
