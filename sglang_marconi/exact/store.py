"""The tensor side of the cache: checkpoints keyed by tree node id, freed when the policy's
``on_evict`` callback names a node."""
from __future__ import annotations

from sglang_marconi.exact.snapshot import Checkpoint


class CheckpointStore:
    """node id -> :class:`Checkpoint` (real KV and SSM tensors)."""

    def __init__(self) -> None:
        self._entries: dict[int, Checkpoint] = {}
        self.evicted: list[int] = []

    def put(self, node_id: int, ckpt: Checkpoint) -> None:
        self._entries[node_id] = ckpt

    def get(self, node_id: int, position: int) -> Checkpoint:
        """The checkpoint of ``node_id``, which must have been taken after ``position`` tokens."""
        if node_id not in self._entries:
            raise KeyError(f"the tree reports a state at node {node_id}, but the store has none")
        ckpt = self._entries[node_id]
        if ckpt.position != position:
            raise ValueError(f"node {node_id}: stored state is at {ckpt.position}, "
                             f"the hit needs {position}")
        return ckpt

    def on_evict(self, node) -> None:
        """``PrefixCache.on_evict`` callback: drop the node's tensors."""
        if self._entries.pop(node.id, None) is not None:
            self.evicted.append(node.id)

    @property
    def node_ids(self) -> set[int]:
        return set(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._entries.values())
