"""The tinygpt model: a GPT-2-style decoder (byte-level vocabulary of 256, learned positions, pre-norm blocks,
GELU MLP), its parameter names those of GPT-2 (``transformer.h.<i>.attn.c_attn.weight``, ...)."""

from __future__ import annotations

import math


def build_model(opts):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln_1 = nn.LayerNorm(d)
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(d, 3 * d)
            self.attn.c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Module()
            self.mlp.c_fc = nn.Linear(d, 4 * d)
            self.mlp.c_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.attn.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.attn.c_proj(y)
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))

    class TinyGPT(nn.Module):
        def __init__(self, o):
            super().__init__()
            d = o["n_embd"]
            self.transformer = nn.Module()
            self.transformer.wte = nn.Embedding(256, d)
            self.transformer.wpe = nn.Embedding(o["block_size"], d)
            self.transformer.h = nn.ModuleList(Block(d, o["n_head"]) for _ in range(o["n_layer"]))
            self.transformer.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, 256, bias=False)
            for name, p in self.named_parameters():
                if name.endswith("weight") and p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * o["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
            for blk in self.transformer.h:
                x = blk(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return F.cross_entropy(logits.view(-1, 256), targets.reshape(-1))

    return TinyGPT(opts)
