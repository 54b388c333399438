"""The physical KV blocks: ref counts, the free list, and the prefix cache with its LRU of evictable blocks.

Every block id 0 .. num_blocks-1 is in exactly one of three states:

    state      ref count   key (prefix cache)   kept in                     leaves it by
    free       0           None                 _free (deque, FIFO)         take() (popleft)
    evictable  0           set, indexed         _evictable (LRU, oldest     ref() on a prefix hit, or take()
                                                first = least recently      evicting it (key dropped)
                                                released)
    in use     >= 1        None or set          (nowhere: ref count > 0)    release() down to 0

    _index[key] is block  <=>  _keys[block] is key   (a block is cached iff it has a key)

A key names a block's content: its block_size token ids and its parent's key (the block before it in the
sequence), hashed once as a chain. Equality compares the tokens and walks the parents, so two different
prefixes whose hashes collide are still two different keys: a lookup can never return another prefix's block.
Nothing here knows about sequences; BlockManager owns the block tables and the ref counts they imply.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from itertools import compress
from typing import NoReturn


def _hash_block(parent_hash: int | None, tokens: tuple[int, ...]) -> int:
    """The chained hash of one full block (a module function so tests can force collisions)."""
    return hash((parent_hash, tokens))


class BlockKey:
    """The identity of a full block's content: (parent block's key, its token ids, salt).

    The salt names what else the K/V depend on besides the tokens: the LoRA adapter of the sequence
    (its uid; None for the base model), so the same prompt under two adapters never shares a block."""

    __slots__ = ("_hash", "parent", "salt", "tokens")
    _hash: int
    parent: BlockKey | None
    tokens: tuple[int, ...]
    salt: int | None

    def __init__(self, parent: BlockKey | None, tokens: tuple[int, ...], salt: int | None = None) -> None:
        self.parent = parent
        self.tokens = tokens
        self.salt = salt
        hashed = _hash_block(None if parent is None else parent._hash, tokens)
        self._hash = hashed if salt is None else hash((hashed, salt))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockKey):
            return NotImplemented
        # Iterative, so a long chain never hits the recursion limit; chains built on the cached parent
        # (as BlockManager does) stop after one step at the `is` check.
        a: BlockKey | None = self
        b: BlockKey | None = other
        while a is not b:
            if a is None or b is None or a._hash != b._hash or a.tokens != b.tokens or a.salt != b.salt:
                return False
            a, b = a.parent, b.parent
        return True

    def __repr__(self) -> str:
        return f"BlockKey(hash={self._hash:#x}, tokens={self.tokens})"


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._keys: list[BlockKey | None] = [None] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # lowest ids first, so allocation is deterministic
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._index: dict[BlockKey, int] = {}
        self.num_evicted = 0

    @property
    def num_available(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def num_cached(self) -> int:
        return len(self._index)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def key(self, block: int) -> BlockKey | None:
        return self._keys[block]

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def take(self, n: int) -> list[int]:
        """n blocks with ref count 1: free ones first, then the least recently released evictable ones."""
        if n > self.num_available:
            raise ValueError(f"asked for {n} blocks, {self.num_available} available")
        blocks = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                key = self._keys[block]
                assert key is not None
                del self._index[key]
                self._keys[block] = None
                self.num_evicted += 1
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def ref(self, block: int) -> None:
        """One more reference, e.g. a prefix hit; an evictable block is revived (leaves the LRU)."""
        if self._ref[block] == 0:
            if block not in self._evictable:
                raise ValueError(f"block {block} is free, not cached: it cannot be referenced")
            del self._evictable[block]
        self._ref[block] += 1

    def release(self, block: int) -> None:
        """One reference fewer; at 0 a cached block becomes the most recently released evictable one."""
        if self._ref[block] <= 0:
            raise ValueError(f"block {block} released with ref count {self._ref[block]}")
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._keys[block] is None:
                self._free.append(block)
            else:
                self._evictable[block] = None

    def lookup(self, key: BlockKey) -> int | None:
        return self._index.get(key)

    def register(self, block: int, key: BlockKey) -> BlockKey:
        """Cache an in-use block under key and return key; if an equal key is already cached, change
        nothing and return that one (the block stays uncached)."""
        existing = self._index.get(key)
        if existing is not None:
            cached = self._keys[existing]
            assert cached is not None
            return cached
        if self._ref[block] == 0 or self._keys[block] is not None:
            raise ValueError(f"block {block} must be in use and uncached to be registered")
        self._index[key] = block
        self._keys[block] = key
        return key

    def reset(self) -> bool:
        """Every evictable block back to free, the index emptied; refused (False) while any block is in use."""
        if self.num_in_use:
            return False
        for block in self._evictable:
            self._keys[block] = None
            self._free.append(block)
        self._evictable.clear()
        self._index.clear()
        return True

    def check_integrity(self, refs: Mapping[int, int]) -> None:
        """Raise AssertionError unless the table above holds; refs is the ref count each block should have.

        The passes over the whole pool run in C (set and list operations, `compress`, `count`) and a message
        is built only for a broken invariant: engine tests check after every step, and a default-sized
        cache has hundreds of thousands of blocks (building every block's message took a second a check)."""
        n = self.num_blocks
        ref, keys = self._ref, self._keys
        free, evictable = set(self._free), set(self._evictable)
        expected = [0] * n
        for block, count in refs.items():
            if 0 <= block < n:  # the range is checked below, in its turn
                expected[block] = count
        # The blocks with ref > 0: those of `refs` when the counts match (the usual case), without a pass.
        refs_match = ref == expected
        in_use = {b for b, c in refs.items() if c > 0} if refs_match else set(compress(range(n), map((0).__lt__, ref)))
        if len(free) != len(self._free):
            _fail(f"free list has duplicates: {sorted(self._free)}")
        groups = [ids for ids in (free, evictable, refs.keys()) if ids]
        if groups and (min(map(min, groups)) < 0 or max(map(max, groups)) >= n):
            _fail(f"block id out of range 0..{n - 1}")
        if free & evictable:
            _fail(f"blocks both free and evictable: {sorted(free & evictable)}")
        if free & in_use:
            _fail(f"free blocks with ref > 0: {sorted(free & in_use)}")
        if evictable & in_use:
            _fail(f"evictable blocks with ref > 0: {sorted(evictable & in_use)}")
        if len(free) + len(evictable) + len(in_use) != n:
            _fail(
                f"free {len(free)} + evictable {len(evictable)} + in use {len(in_use)} != total {n}; "
                f"lost blocks: {sorted(set(range(n)) - free - evictable - in_use)}"
            )
        if not refs_match:
            block = next(b for b in range(n) if ref[b] != expected[b])
            _fail(_ref_message(block, ref[block], expected[block]))
        if any(map(keys.__getitem__, free)):  # a key is an object, always true
            block = next(b for b in free if keys[b] is not None)
            _fail(f"free block {block} still has a prefix-cache key")
        if not all(map(keys.__getitem__, evictable)):
            block = next(b for b in evictable if keys[b] is None)
            _fail(f"evictable block {block} has no prefix-cache key")
        for key, block in self._index.items():
            if keys[block] is not key:
                _fail(f"index entry {key!r} -> block {block}, whose key is {keys[block]!r}")
        num_keyed = n - keys.count(None)
        if num_keyed != len(self._index):
            _fail(f"{num_keyed} blocks have keys but the index has {len(self._index)}")


def _ref_message(block: int, actual: int, expected: int) -> str:
    return f"block {block} has ref count {actual} but {expected} block-table entries point at it"


def _fail(message: str) -> NoReturn:
    # Not `assert`: the check must still run under `python -O`.
    raise AssertionError(message)


def count_refs(tables: Iterable[list[int]]) -> dict[int, int]:
    refs: dict[int, int] = {}
    for table in tables:
        for block in table:
            refs[block] = refs.get(block, 0) + 1
    return refs
