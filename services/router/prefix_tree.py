"""An approximate prefix tree over prompt token ids: what one engine has probably cached.

The cache-aware policy keeps one tree per engine and inserts every prompt it
routes there. It is approximate: the engine may have evicted blocks the tree
still remembers, and the tree forgets prompts on its own schedule. Routing
only needs "which engine most likely holds most of this prompt".

A radix tree: each edge holds a run of token ids, children are keyed by the
first token of their edge. Invariants (`check_integrity`):

- `size` == the sum of edge lengths == the tokens remembered; `size <= max_tokens`
  after every insert;
- a child's edge is never empty, and it is stored under its first token;
- `last_access` never decreases from a child to its parent (an insert touches
  the whole path), so the least recently used leaf is always evicted before
  any of its ancestors.

Eviction removes least recently used leaves until the tree is back under
`evict_to` of its bound (so an insert at the bound does not evict every time).
Access times come from a counter, not a clock: eviction order is exact and
testable.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "key", "last_access", "parent")

    def __init__(self, key: tuple[int, ...], parent: _Node | None, last_access: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last_access = last_access


def _common_length(a: Sequence[int], a_start: int, b: tuple[int, ...]) -> int:
    n = min(len(a) - a_start, len(b))
    i = 0
    while i < n and a[a_start + i] == b[i]:
        i += 1
    return i


class PrefixTree:
    def __init__(self, max_tokens: int, evict_to: float = 0.9) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = max_tokens
        self._evict_target = int(max_tokens * evict_to)
        self._root = _Node((), None, 0)
        self._tick = 0
        self.size = 0

    def match(self, tokens: Sequence[int]) -> int:
        """Length of the longest remembered prefix of `tokens` (does not count as an access)."""
        node, matched = self._root, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            common = _common_length(tokens, matched, child.key)
            matched += common
            if common < len(child.key):
                break
            node = child
        return matched

    def insert(self, tokens: Sequence[int]) -> None:
        """Remember `tokens` as recently used, then evict down to the bound if needed."""
        self._tick += 1
        now = self._tick
        node, pos = self._root, 0
        node.last_access = now
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(tuple(tokens[pos:]), node, now)
                node.children[leaf.key[0]] = leaf
                self.size += len(leaf.key)
                break
            common = _common_length(tokens, pos, child.key)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            node, pos = child, pos + common
        if self.size > self.max_tokens:
            self._evict()

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        upper = _Node(child.key[:at], parent, child.last_access)
        parent.children[upper.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _evict(self) -> None:
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n is not self._root]
        heapq.heapify(leaves)
        while self.size > self._evict_target and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            if not parent.children and parent is not self._root:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        total = 0
        for node in self._nodes():
            for first, child in node.children.items():
                assert child.key and child.key[0] == first, "child stored under the wrong token"
                assert child.parent is node, "broken parent link"
                assert child.last_access <= node.last_access, "a child was used after its parent"
                total += len(child.key)
        assert total == self.size, f"size {self.size} != {total} tokens on edges"
        assert self.size <= self.max_tokens, f"size {self.size} over the bound {self.max_tokens}"
