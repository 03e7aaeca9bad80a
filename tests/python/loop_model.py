"""tests/python/loop_model.py: a decoder written the way the generator's PyTorch loop
(framework:pytorch, src/workload/torch_loop.cpp) assumes, from the generator's own keys, so that
what PyTorch does with it can be set against the trace `tensorpool generate` writes for the same
keys. Used by tests/python/test_loop_rules.py (what autograd saves, on the CPU) and
scripts/gpu/loop_check.py (the peak of a training step, on a GPU). Needs torch.

    model = LoopModel(keys, device="cpu")   # keys: "hidden", "heads", ..., "attention", "loss", ...
    logits = model.forward(ids)             # ids: [batch, seq] of token ids
    loss = model.loss(logits, targets)
"""
import math

import torch
import torch.nn.functional as F


class LoopModel:
    """Its parameters (`params`, in the order made) and buffers (`buffers`: rotary cos and sin)."""

    def __init__(self, k, device="cpu"):
        self.k = k
        self.device = torch.device(device)
        self.h, self.heads, self.kv_heads = k["hidden"], k["heads"], k["kv_heads"]
        self.d = self.h // self.heads
        self.kv = self.d * self.kv_heads
        self.vocab = k["vocab"]
        self.gated, self.rms = k["mlp"] == "gated", k["norm"] == "rmsnorm"
        self.biases, self.fused_qkv = k["biases"] == "true", k.get("qkv") == "fused"
        self.dtype = torch.bfloat16 if k.get("precision") == "bf16" else torch.float32  # bf16: the model in 16 bits
        self.params, self.buffers = [], []
        h, f, kv = self.h, k["ffn"], self.kv
        self.layers = []
        for _ in range(k["layers"]):
            w = {"n1": self._norm_params(), "n2": self._norm_params(), "o": (self._p(h, h), self._bias(h))}
            if self.fused_qkv:
                w["qkv"] = (self._p(h + 2 * kv, h), self._bias(h + 2 * kv))
            else:
                w["q"], w["k"], w["v"] = ((self._p(h, h), self._bias(h)), (self._p(kv, h), self._bias(kv)),
                                          (self._p(kv, h), self._bias(kv)))
            if self.gated:
                w["gate"] = (self._p(f, h), None)
            w["up"], w["down"] = (self._p(f, h), self._bias(f)), (self._p(h, f), self._bias(h))
            self.layers.append(w)
        self.emb = self._p(self.vocab, h)
        self.pos = self._p(k["positions"], h) if k["positions"] else None
        self.final = self._norm_params()
        self.head = self.emb if k["tied_embeddings"] == "true" else self._p(self.vocab, h)
        self.cos = self.sin = None
        if self.pos is None:  # rotary positions: buffers, which model.to(dtype) casts too
            inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, device=self.device).float() / self.d))
            angles = torch.outer(torch.arange(k["context"], device=self.device).float(), inv)
            self.cos, self.sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
            self.buffers += [self.cos, self.sin]

    def _p(self, *shape):
        t = torch.nn.Parameter((torch.randn(*shape, device=self.device) * 0.02).to(self.dtype))
        self.params.append(t)
        return t

    def _bias(self, n):
        return self._p(n) if self.biases else None

    def _norm_params(self):
        return (self._p(self.h), None if self.rms else self._p(self.h))

    def _norm(self, x, w):
        if self.rms:  # written out, as Llama's and the CS336 handout's are
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[0]
        return F.layer_norm(x, (self.h,), w[0], w[1])

    def _rope(self, x, seq):  # [b, s, n, d]: halves
        if self.cos is None:
            return x
        x1, x2 = x[..., : self.d // 2], x[..., self.d // 2:]
        c, s = self.cos[:seq, None, :], self.sin[:seq, None, :]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)

    def _repeat_kv(self, x, b, seq):  # [b, s, kv_heads, d] -> [b, s, heads, d]: a copy (Hugging Face's repeat_kv)
        if self.kv_heads == self.heads:
            return x
        groups = self.heads // self.kv_heads
        return x[:, :, :, None, :].expand(b, seq, self.kv_heads, groups, self.d).reshape(b, seq, self.heads, self.d)

    def _activation(self, x):
        if self.k.get("activation") == "written":
            if self.gated:
                return x * torch.sigmoid(x)
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))
            return 0.5 * x * (1 + torch.tanh(inner))
        return F.silu(x) if self.gated else F.gelu(x, approximate="tanh")

    def _attend(self, q, k, v, b, seq):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.k["attention"] == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # written out
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=self.device))
            scores = scores.masked_fill(~mask, float("-inf"))
            shifted = scores - scores.max(dim=-1, keepdim=True).values
            e = torch.exp(shifted)
            out = (e / e.sum(dim=-1, keepdim=True)) @ v
        return out.transpose(1, 2).reshape(b, seq, self.h)

    def forward(self, ids):
        b, seq = ids.shape
        h, kv, heads, kv_heads, d = self.h, self.kv, self.heads, self.kv_heads, self.d
        x = self.emb[ids]
        if self.pos is not None:
            x = x + self.pos[torch.arange(seq, device=self.device)]
        for w in self.layers:
            n = self._norm(x, w["n1"])
            if self.fused_qkv:
                q, k, v = F.linear(n, *w["qkv"]).split([h, kv, kv], dim=-1)
            else:
                q, k, v = F.linear(n, *w["q"]), F.linear(n, *w["k"]), F.linear(n, *w["v"])
            q = self._rope(q.reshape(b, seq, heads, d), seq)
            k = self._repeat_kv(self._rope(k.reshape(b, seq, kv_heads, d), seq), b, seq)
            v = self._repeat_kv(v.reshape(b, seq, kv_heads, d), b, seq)
            x = x + F.linear(self._attend(q, k, v, b, seq), *w["o"])
            n = self._norm(x, w["n2"])
            up = F.linear(n, *w["up"])
            inner = self._activation(F.linear(n, *w["gate"])) * up if self.gated else self._activation(up)
            x = x + F.linear(inner, *w["down"])
        return F.linear(self._norm(x, self.final), self.head)

    def loss(self, logits, targets):
        flat = logits.view(-1, self.vocab)
        if self.k.get("loss") == "written":
            shifted = flat - flat.max(dim=-1, keepdim=True).values
            lse = torch.log(torch.exp(shifted).sum(dim=-1))
            return (lse - shifted.gather(-1, targets.view(-1, 1)).squeeze(-1)).mean()
        return F.cross_entropy(flat, targets.view(-1))
