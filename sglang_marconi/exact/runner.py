"""Forward passes: segmented (two-pass) prefill on a cache, greedy decode, uncached reference;
explicit ``position_ids`` on every call, and one token at a time where an architecture's
multi-token path ignores a saved SSM state (Jamba)."""
from __future__ import annotations

import torch

from sglang_marconi.exact.archs import Arch
from sglang_marconi.exact.snapshot import cache_length


@torch.no_grad()
def extend(model, arch: Arch, cache, tokens: list[int], start: int) -> torch.Tensor:
    """Feed ``tokens`` (absolute positions start..) into ``cache``; logits [len(tokens), vocab]."""
    if not tokens:
        raise ValueError("extend() needs at least one token")
    if arch.token_by_token and start > 0:
        return torch.cat([_call(model, cache, [t], start + i) for i, t in enumerate(tokens)])
    return _call(model, cache, tokens, start)


def _call(model, cache, tokens: list[int], start: int) -> torch.Tensor:
    ids = torch.tensor([tokens], dtype=torch.long)
    pos = torch.arange(start, start + len(tokens), dtype=torch.long).unsqueeze(0)
    out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


@torch.no_grad()
def segmented_prefill(model, arch, cache, tokens, start, split_points, on_split):
    """Prefill ``tokens[start:]`` in segments, ``on_split(position, cache)`` after each."""
    bounds = sorted({p for p in split_points if start < p < len(tokens)}) + [len(tokens)]
    logits, pos = None, start
    for end in bounds:
        logits = extend(model, arch, cache, tokens[pos:end], pos)
        if end < len(tokens) or end in split_points:
            on_split(end, cache)
        pos = end
    return logits[-1]


@torch.no_grad()
def greedy_decode(model, arch, cache, first_logits, start, n_tokens):
    """Greedy continuation of ``n_tokens`` tokens: (tokens, each step's logits)."""
    out, step_logits = [], [first_logits]
    for i in range(n_tokens):
        tok = int(torch.argmax(step_logits[-1]))
        out.append(tok)
        if i + 1 < n_tokens:
            step_logits.append(extend(model, arch, cache, [tok], start + i)[-1])
    assert cache_length(cache) in (0, start + n_tokens - 1)  # 0: no attention layer holds KV
    return out, torch.stack(step_logits)


@torch.no_grad()
def uncached_logits(model, tokens: list[int]) -> torch.Tensor:
    """One full forward over ``tokens`` without any cache: logits [len(tokens), vocab]."""
    ids = torch.tensor([tokens], dtype=torch.long)
    pos = torch.arange(len(tokens), dtype=torch.long).unsqueeze(0)
    return model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
