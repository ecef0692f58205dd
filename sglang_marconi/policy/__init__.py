"""The framework-free Marconi policy: radix tree (``tree``), admission (``admission``),
eviction scoring (``scoring``), alpha tuning (``alpha``) and the request-level cache that
ties them together (``cache``). No torch or sglang imports here."""
from sglang_marconi.policy.admission import AdmissionPlan, plan_block_checkpoints, plan_checkpoints
from sglang_marconi.policy.cache import CacheStats, PrefixCache, RequestPlan
from sglang_marconi.policy.scoring import VictimQueue, flop_efficiency, utility
from sglang_marconi.policy.tree import RadixTree

__all__ = ["AdmissionPlan", "CacheStats", "PrefixCache", "RadixTree", "RequestPlan",
           "VictimQueue", "flop_efficiency", "plan_block_checkpoints", "plan_checkpoints",
           "utility"]
