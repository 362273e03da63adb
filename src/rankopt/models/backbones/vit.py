"""Pure-torch Vision Transformer (Dosovitskiy et al. 2021; DeiT, Touvron et al. 2021) with timm key names.

Parameter names follow ``timm.models.vision_transformer.VisionTransformer``
(``cls_token``, ``pos_embed``, ``patch_embed.proj``, ``blocks.{i}.norm1``,
``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.proj``, ``blocks.{i}.mlp.fc1``, ``norm``,
...) without the classifier ``head``. The output is the final-normed CLS token,
``(B, embed_dim)``. Inputs whose size differs from ``img_size`` use a bicubic
interpolation of the patch position embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def resize_pos_embed(pos_embed: Tensor, grid: tuple[int, int], num_prefix: int = 1) -> Tensor:
    """Bicubic resampling of the patch part of ``(1, prefix + h*w, D)`` position embeddings to ``grid``."""
    prefix, patches = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    side = int(round(patches.shape[1] ** 0.5))
    if side * side != patches.shape[1]:
        raise ValueError(f"position embeddings hold {patches.shape[1]} patches, not a square grid")
    if (side, side) == grid:
        return pos_embed
    patches = patches.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    patches = F.interpolate(patches, size=grid, mode="bicubic", align_corners=False)
    return torch.cat([prefix, patches.permute(0, 2, 3, 1).flatten(1, 2)], dim=1)


class VisionTransformer(nn.Module):
    """ViT encoder returning the CLS token; ``num_features = embed_dim``."""

    def __init__(
        self,
        *,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not a multiple of patch_size {patch_size}")
        self.patch_size = patch_size
        self.num_features = embed_dim
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (img_size // patch_size) ** 2, embed_dim))
        self.blocks = nn.Sequential(*(Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        tokens = self.patch_embed(x)
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + resize_pos_embed(self.pos_embed, grid)
        return self.norm(self.blocks(tokens))[:, 0]


VIT_LAYOUTS: dict[str, dict[str, int]] = {
    "deit_small_distilled_patch16_224": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "deit_small_patch16_224": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "vit_base_patch16_224": {"embed_dim": 768, "depth": 12, "num_heads": 12},
}


def vit(name: str, **kwargs: int) -> VisionTransformer:
    """Build a ViT/DeiT by timm name (randomly initialised)."""
    return VisionTransformer(**{**VIT_LAYOUTS[name], **kwargs})
