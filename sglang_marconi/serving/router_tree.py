"""sglang-router 0.3.2's approximate radix tree over characters (``src/policies/tree.rs``, cited
by line), re-implemented in Python; differences: equal epochs pop in push order, a hash-order
tenant choice is flagged ``ambiguous``. Checked against the binary."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Dict, List, Optional

EMPTY_TENANT = "empty"    # what tree.rs 590/599 returns for a node without tenants


class Node:
    """One node: ``text`` on the edge from its parent, tenants with last-access epochs."""

    __slots__ = ("children", "text", "tenant_epoch", "parent", "last_tenant")

    def __init__(self, text: str, parent: Optional["Node"], tenant_epoch: Dict[str, int],
                 last_tenant: Optional[str]):
        self.children: Dict[str, Node] = {}
        self.text = text
        self.tenant_epoch = tenant_epoch
        self.parent = parent
        self.last_tenant = last_tenant


@dataclass(frozen=True)
class PrefixMatch:
    """``PrefixMatchResult`` (tree.rs 44-51) plus whether the tenant was a hash-order pick."""
    tenant: str
    matched_chars: int
    input_chars: int
    ambiguous: bool = False


def shared_prefix_len(a: str, b: str) -> int:
    """Characters ``a`` and ``b`` share from the start (tree.rs 289-317), by bisection."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0                      # a[:lo] == b[:lo] holds, a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class CharTree:
    """The multi-tenant character radix tree of tree.rs (single-threaded)."""

    def __init__(self, first_epoch: int = 0):
        self.root = Node("", None, {}, None)
        self.tenant_char_count: Dict[str, int] = {}
        self.next_epoch_value = first_epoch

    def _epoch(self) -> int:
        """``get_epoch`` (tree.rs 225-228): fetch-and-add."""
        value = self.next_epoch_value
        self.next_epoch_value += 1
        return value

    def insert(self, text: str, tenant: str) -> None:
        """tree.rs 362-528."""
        self.root.tenant_epoch.setdefault(tenant, 0)           # 370-373
        self.tenant_char_count.setdefault(tenant, 0)           # 375-377
        remaining = text
        prev = self.root
        while remaining:
            child = prev.children.get(remaining[0])
            if child is None:                                  # vacant: new leaf, 398-423
                epoch = self._epoch()
                prev.children[remaining[0]] = Node(remaining, prev, {tenant: epoch}, tenant)
                self.tenant_char_count[tenant] = (self.tenant_char_count.get(tenant, 0)
                                                  + len(remaining))
                return
            shared = shared_prefix_len(remaining, child.text)
            if shared < len(child.text):                       # split, 435-482
                upper = Node(child.text[:shared], prev, dict(child.tenant_epoch),
                             child.last_tenant)
                upper.children[child.text[shared]] = child
                prev.children[remaining[0]] = upper
                child.text = child.text[shared:]
                child.parent = upper
                if tenant not in upper.tenant_epoch:           # 466-478
                    self.tenant_char_count[tenant] += shared
                    upper.tenant_epoch[tenant] = 0
                prev = upper
            else:                                              # full edge match, 483-505
                if tenant not in child.tenant_epoch:
                    self.tenant_char_count[tenant] += len(child.text)
                    child.tenant_epoch[tenant] = 0
                prev = child
            remaining = remaining[shared:]
        prev.tenant_epoch[tenant] = self._epoch()              # 522-526

    def prefix_match(self, text: str) -> PrefixMatch:
        """``prefix_match_with_counts`` (tree.rs 531-620)."""
        remaining = text
        matched = 0
        prev = self.root
        while remaining:
            child = prev.children.get(remaining[0])
            if child is None:
                break
            shared = shared_prefix_len(remaining, child.text)
            matched += shared
            prev = child
            if shared != len(child.text):                      # partial: still this node
                break
            remaining = remaining[shared:]
        node = prev
        ambiguous = False
        tenant = node.last_tenant
        if tenant is None or tenant not in node.tenant_epoch:  # 568-601
            ambiguous = len(node.tenant_epoch) > 1
            tenant = next(iter(node.tenant_epoch), EMPTY_TENANT)
            node.last_tenant = tenant
        epoch = self._epoch()                                  # 603-606
        if epoch & 0x7 == 0:
            node.tenant_epoch[tenant] = epoch
        return PrefixMatch(tenant, matched, len(text), ambiguous)

    @staticmethod
    def leaf_tenants(node: Node) -> List[str]:
        """``leaf_of`` (tree.rs 697-716): the node's tenants that no child holds."""
        below = set()
        for child in node.children.values():
            below.update(child.tenant_epoch)
        return [t for t in node.tenant_epoch if t not in below]

    def _still_leaf(self, node: Node, tenant: str) -> bool:
        return tenant in node.tenant_epoch and not any(
            tenant in child.tenant_epoch for child in node.children.values())

    def evict_tenant_by_size(self, max_size: int) -> int:
        """tree.rs 718-821; returns how many (tenant, node) entries it removed."""
        heap: list = []
        seq = 0
        stack = [self.root]
        while stack:                                           # 719-737
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in self.leaf_tenants(node):
                heapq.heappush(heap, (node.tenant_epoch[tenant], seq, tenant, node))
                seq += 1
        removed = 0
        while heap:                                            # 746-814
            _, _, tenant, node = heapq.heappop(heap)
            used = self.tenant_char_count.get(tenant)
            if used is not None and used <= max_size:
                continue
            if not self._still_leaf(node, tenant):
                continue
            if tenant in self.tenant_char_count:               # saturating_sub, 769-774
                self.tenant_char_count[tenant] = max(
                    0, self.tenant_char_count[tenant] - len(node.text))
            del node.tenant_epoch[tenant]
            removed += 1
            parent = node.parent
            if not node.children and not node.tenant_epoch and parent is not None and node.text:
                parent.children.pop(node.text[0], None)        # 782-789
            if parent is not None and self._still_leaf(parent, tenant):   # 791-813
                heapq.heappush(heap, (parent.tenant_epoch[tenant], seq, tenant, parent))
                seq += 1
        return removed
