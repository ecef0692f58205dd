"""Marconi's admission rule, its single home: a checkpoint at the branch point a speculative
insertion finds and at the last state whose KV exists (on the grid, beyond the hit, at most
``max_states``); ``block`` is the vLLM+ baseline."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionPlan:
    positions: tuple  # absolute token positions that get a state, ascending
    cached_len: int   # tokens of the sequence the tree keeps (KV), = the last position
    branch_len: int = 0  # the grid-aligned branch point, 0 if none was admitted


def _floor(x: int, grid: int) -> int:
    return (x // grid) * grid


def cached_length(input_len: int, output_len: int, grid: int = 1) -> int:
    """Tokens whose KV exists at finish (the last sampled token has none), on the grid."""
    return _floor(input_len + max(0, output_len - 1), grid)


def branch_checkpoint(input_len: int, hit_len: int, branch_len: int | None, grid: int = 1,
                      max_states: int = 2) -> int:
    """The mid-prompt position to checkpoint now (0: none): the branch point on the grid."""
    if grid < 1:
        raise ValueError(f"checkpoint grid must be >= 1, got {grid}")
    branch = _floor(branch_len, grid) if branch_len else 0
    return branch if max_states > 0 and hit_len < branch < input_len else 0


def plan_checkpoints(input_len: int, output_len: int, hit_len: int, branch_len: int | None,
                     grid: int = 1, max_states: int = 2) -> AdmissionPlan:
    """Marconi admission: the branch point (if any) and the end of the cached sequence."""
    branch = branch_checkpoint(input_len, hit_len, branch_len, grid, max_states)
    end = cached_length(input_len, output_len, grid)
    positions = [branch] if branch and branch < end else []
    if end > hit_len:
        positions.append(end)
    positions = positions[:max(0, max_states)]
    cached = positions[-1] if positions else 0
    return AdmissionPlan(tuple(positions), cached, branch if branch in positions else 0)


def plan_block_checkpoints(input_len: int, output_len: int, hit_len: int,
                           block: int = 32) -> AdmissionPlan:
    """vLLM+ admission: a state at every block boundary beyond the hit (full blocks only)."""
    end = cached_length(input_len, output_len, block)
    start = _floor(hit_len, block) + block
    positions = tuple(range(start, end + 1, block))
    return AdmissionPlan(positions, positions[-1] if positions else 0, 0)
