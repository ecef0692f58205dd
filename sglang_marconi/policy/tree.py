"""The radix tree of a hybrid-model prefix cache (metadata only): a node holds its edge's tokens
and at most one SSM checkpoint at its end; a hit ends only at a node with a state."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy.ranking import freed_bytes as ranking_freed_bytes
from sglang_marconi.policy.ranking import ranked_efficiency, states_below
from sglang_marconi.policy.scoring import VictimQueue


def as_tokens(tokens) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError("token sequences must be one-dimensional")
    return arr


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = a[:n] != b[:n]
    i = int(neq.argmax())
    return n if not neq[i] else i


class Node:
    __slots__ = ("id", "parent", "children", "tokens", "prefix_len", "has_state", "last_access",
                 "lock_ref", "hits", "max_children", "hit_score", "last_hit", "__weakref__")

    def __init__(self, node_id: int, parent, tokens: np.ndarray, now: float):
        self.id = node_id
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.tokens = tokens
        self.prefix_len = (parent.prefix_len if parent is not None else 0) + len(tokens)
        self.has_state = False
        self.last_access = now
        self.lock_ref = 0
        self.hits = 0             # times a hit ended here (its state was consumed)
        self.max_children = 0     # the most children it ever had (>1: it was a branch point)
        self.hit_score = 0.0      # decayed hit count (``likelihood.ReuseWeight``)
        self.last_hit = now

    def __repr__(self) -> str:
        return (f"Node(id={self.id}, prefix_len={self.prefix_len}, edge={len(self.tokens)}, "
                f"state={self.has_state}, children={len(self.children)})")

    def __lt__(self, other: "Node") -> bool:  # heap tie-break of last resort
        return self.id < other.id


@dataclass
class Match:
    hit_len: int          # tokens reusable with KV + state (ends at a node with a state)
    hit_node: Node | None
    kv_len: int           # longest common prefix with the tree (KV only)
    kv_node: Node         # deepest node fully matched
    edge_node: Node       # the node whose edge holds position kv_len (kv_node or a child)
    branch_len: int       # where the sequence would branch off the tree (0: it would not)


class RadixTree:
    """Radix tree with byte accounting and an eviction-candidate queue."""

    def __init__(self, spec: CostModel, alpha: float = 0.0, queue: VictimQueue | None = None,
                 value_weight=None):
        self.spec = spec
        self.kv_bytes = spec.kv_bytes_per_token
        self.state_bytes = spec.ssm_state_bytes
        self._ids = itertools.count(1)
        self.root = Node(0, None, np.empty(0, np.int64), 0.0)
        self.root.lock_ref = 1  # never evicted
        self.queue = queue if queue is not None else VictimQueue(alpha)
        self.bytes_used = 0
        self.num_states = 0
        self.num_kv_tokens = 0
        self.num_nodes = 1
        self.on_state_dropped = None  # callback(node) when a node's state is freed
        self.value_weight = value_weight  # node -> reuse likelihood weight (marconi+), or None

    # ---- lookup ---------------------------------------------------------------------------
    def match(self, tokens, limit: int | None = None) -> Match:
        """Walk ``tokens`` down the tree (``hit_len`` capped at ``limit``)."""
        tokens = as_tokens(tokens)
        limit = len(tokens) if limit is None else limit
        node, pos = self.root, 0
        hit_node, hit_len = None, 0
        branch_len = 0
        edge_node = self.root
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None:
                # leaves the tree at a node boundary: a branch if ``node`` has children but no
                # state (an existing branch point that lost or never had its checkpoint)
                if node is not self.root and node.children and not node.has_state:
                    branch_len = pos
                break
            c = common_prefix_len(child.tokens, tokens[pos:])
            edge_node = child
            if c < len(child.tokens):
                if pos + c < len(tokens):
                    branch_len = pos + c  # would split this edge
                pos += c
                break
            pos += c
            node = child
            if node.has_state and node.prefix_len <= limit:
                hit_node, hit_len = node, node.prefix_len
        return Match(hit_len, hit_node, pos, node, edge_node, branch_len)

    # ---- the ranking rules' view of this tree (``ranking.TreeAdapter``) ---------------------
    @staticmethod
    def depth(node: Node) -> int:
        return node.prefix_len

    @staticmethod
    def has_state(node: Node) -> bool:
        return node.has_state

    @staticmethod
    def parent(node: Node):
        return node.parent

    @staticmethod
    def children(node: Node):
        return node.children.values()

    # ---- candidates -------------------------------------------------------------------------
    def freed_bytes(self, node: Node) -> int:
        return ranking_freed_bytes(self.kv_bytes, self.state_bytes, len(node.tokens),
                                   not node.children, node.has_state)

    @staticmethod
    def _evictable_shape(node: Node) -> bool:
        """A leaf, or a one-child node with a state (evicting it drops the state)."""
        n = len(node.children)
        return n == 0 or (n == 1 and node.has_state)

    def is_candidate(self, node: Node) -> bool:
        return node.lock_ref <= 0 and self._evictable_shape(node)

    def efficiency(self, node: Node) -> float:
        return ranked_efficiency(self.spec, self, node, self.freed_bytes(node), self.value_weight)

    def refresh(self, node: Node) -> None:
        """Re-evaluate whether ``node`` is a candidate and its score."""
        if node is self.root:
            return
        if self.is_candidate(node):
            self.queue.update(node, node.last_access, self.efficiency(node))
        else:
            self.queue.discard(node)

    def _refresh_state_descendants(self, node: Node) -> None:
        for x in states_below(self, node):
            self.refresh(x)

    # ---- locking ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        while node is not None and node is not self.root:
            node.lock_ref += 1
            if node.lock_ref == 1:
                self.queue.discard(node)
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of an unlocked node {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.refresh(node)
            node = node.parent

    # ---- structure --------------------------------------------------------------------------
    def _split(self, child: Node, offset: int) -> Node:
        """Split ``child``'s edge after ``offset`` tokens; return the new parent node."""
        parent = child.parent
        mid = Node(next(self._ids), parent, child.tokens[:offset], child.last_access)
        mid.lock_ref = child.lock_ref
        mid.children = {int(child.tokens[offset]): child}
        mid.max_children = 1
        parent.children[int(child.tokens[0])] = mid
        child.tokens = child.tokens[offset:]
        child.parent = mid
        self.num_nodes += 1
        self.refresh(child)
        return mid

    def _set_state(self, node: Node, now: float) -> bool:
        if node.has_state:
            return False
        node.has_state = True
        node.last_access = now
        self.num_states += 1
        self.bytes_used += self.state_bytes
        self.refresh(node)
        self._refresh_state_descendants(node)
        return True

    def insert(self, tokens, state_positions, now: float) -> tuple[dict, int]:
        """Insert ``tokens`` with states at ``state_positions``: ({position: node}, new)."""
        tokens = as_tokens(tokens)
        wanted = sorted(set(int(p) for p in state_positions))
        node, pos = self.root, 0
        out: dict[int, Node] = {}
        new_states = 0
        wi = 0
        while wi < len(wanted) and wanted[wi] <= 0:
            wi += 1
        while pos < len(tokens):
            target = wanted[wi] if wi < len(wanted) else len(tokens)
            child = node.children.get(int(tokens[pos]))
            if child is None:
                # new leaf up to the next wanted position (or the end)
                seg = tokens[pos:target].copy()
                leaf = Node(next(self._ids), node, seg, now)
                node.children[int(seg[0])] = leaf
                node.max_children = max(node.max_children, len(node.children))
                self.num_nodes += 1
                self.num_kv_tokens += len(seg)
                self.bytes_used += len(seg) * self.kv_bytes
                self.refresh(node)
                node, pos = leaf, target
            else:
                c = common_prefix_len(child.tokens, tokens[pos:target])
                if c < len(child.tokens):
                    child = self._split(child, c)
                node, pos = child, pos + c
            if wi < len(wanted) and pos == wanted[wi]:
                if self._set_state(node, now):
                    new_states += 1
                node.last_access = now
                out[pos] = node
                self.refresh(node)
                wi += 1
        return out, new_states

    def bytes_to_insert(self, tokens, state_positions) -> int:
        """Bytes ``insert`` would add (new KV tokens + new states), without changing anything."""
        tokens = as_tokens(tokens)
        m = self.match(tokens)
        new_kv = len(tokens) - m.kv_len
        new_states = 0
        for p in set(int(x) for x in state_positions):
            if p <= 0:
                continue
            if p > m.kv_len:
                new_states += 1
                continue
            node = self.node_at(tokens, p)
            if node is None or not node.has_state:
                new_states += 1
        return new_kv * self.kv_bytes + new_states * self.state_bytes

    def node_at(self, tokens: np.ndarray, pos: int) -> Node | None:
        """The node ending exactly at ``pos`` along ``tokens`` (None if mid-edge)."""
        node, p = self.root, 0
        while p < pos:
            node = node.children.get(int(tokens[p]))
            if node is None:
                return None
            p += len(node.tokens)
        return node if p == pos else None

    # ---- eviction ---------------------------------------------------------------------------
    def evict_one(self) -> tuple[str, Node] | None:
        """Evict the lowest-utility candidate: ("delete" | "drop_state", node) or None."""
        node = self.queue.pop_victim()
        if node is None:
            return None
        return self._evict(node)

    def candidates(self) -> list:
        """The current eviction candidates (unordered)."""
        return list(self.queue._live)

    def evict_node(self, node: Node):
        """Evict a chosen candidate (an offline policy or a search picks it)."""
        if node not in self.queue:
            raise ValueError(f"{node} is not an eviction candidate")
        self.queue.discard(node)
        return self._evict(node)

    def _evict(self, node: Node):
        if node.children:
            self._drop_state(node)
            parent = node.parent
            self._merge_into_child(node)
            self.refresh(parent)
            return "drop_state", node
        self._delete_leaf(node)
        return "delete", node

    def _drop_state(self, node: Node) -> None:
        node.has_state = False
        self.num_states -= 1
        self.bytes_used -= self.state_bytes
        if self.on_state_dropped is not None:
            self.on_state_dropped(node)
        self._refresh_state_descendants(node)

    def _merge_into_child(self, node: Node) -> None:
        """A stateless node with one child is folded into that child (path compression)."""
        if node.lock_ref > 0 or len(node.children) != 1 or node.has_state:
            self.refresh(node)
            return
        (child,) = node.children.values()
        parent = node.parent
        child.tokens = np.concatenate([node.tokens, child.tokens])
        child.parent = parent
        parent.children[int(node.tokens[0])] = child
        self.queue.discard(node)
        self.num_nodes -= 1
        self.refresh(child)

    def _delete_leaf(self, node: Node) -> None:
        if node.has_state:
            self._drop_state(node)
        parent = node.parent
        del parent.children[int(node.tokens[0])]
        self.num_nodes -= 1
        self.num_kv_tokens -= len(node.tokens)
        self.bytes_used -= len(node.tokens) * self.kv_bytes
        self.queue.discard(node)
        if parent is not self.root:
            if len(parent.children) == 1 and not parent.has_state:
                self._merge_into_child(parent)
            else:
                self.refresh(parent)

    def path_tokens(self, node: Node) -> np.ndarray:
        """The tokens from the root to the end of ``node``'s edge."""
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.tokens)
            node = node.parent
        return np.concatenate(parts[::-1]) if parts else np.empty(0, np.int64)

    def path_nodes(self, tokens) -> list:
        """The nodes whose edges ``tokens`` run fully through, root excluded."""
        tokens = as_tokens(tokens)
        node, pos, out = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None or common_prefix_len(child.tokens, tokens[pos:]) < len(child.tokens):
                break
            out.append(child)
            pos += len(child.tokens)
            node = child
        return out

    # ---- checks -----------------------------------------------------------------------------
    def iter_nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def check(self) -> None:
        """Recompute the accounting from the nodes; raise AssertionError on a mismatch."""
        kv = states = nodes = 0
        for n in self.iter_nodes():
            nodes += 1
            if n is self.root:
                continue
            kv += len(n.tokens)
            states += n.has_state
            assert len(n.tokens) > 0, f"empty edge {n}"
            assert n.parent.children.get(int(n.tokens[0])) is n, f"broken link {n}"
            assert n.prefix_len == n.parent.prefix_len + len(n.tokens), f"prefix_len {n}"
            assert (n in self.queue) == self.is_candidate(n), f"candidate set wrong for {n}"
        assert kv == self.num_kv_tokens, (kv, self.num_kv_tokens)
        assert states == self.num_states, (states, self.num_states)
        assert nodes == self.num_nodes, (nodes, self.num_nodes)
        assert self.bytes_used == kv * self.kv_bytes + states * self.state_bytes
