"""Which KV blocks each sequence owns: block tables, prefix-cache hits, and the blocks they cache.

Sequence s holds block_tables[s]; entry j is the physical block of its positions j*block_size ..
(j+1)*block_size-1 (see attention/context.py). The invariants, checked by check_integrity():

    what                                  holds
    block_tables[s]                       no block id twice; entries 0 .. n-1 of the n blocks matched by
                                          match_prefix() come first, allocate() appends after them
    ref_count(b)                          == number of block-table entries (over all sequences) equal to b
    free / evictable / in use             a partition of 0 .. num_blocks-1 (states in block_pool.py);
                                          free and evictable blocks have ref 0, in-use blocks ref >= 1
    chain[s]                              keys of block_tables[s][0 .. len(chain[s])-1], the full blocks
                                          already matched or offered to the prefix cache, each built on
                                          the one before; for a block left uncached as a duplicate, the
                                          key of the identical cached block
    prefix cache off                      no block ever has a key; evictable is always empty

The scheduler's order per sequence: match_prefix() (or fork(), maybe then copy_tail()) once while it has no
blocks, allocate() before every step (on False, free() undoes a prefix hit too), cache_full_blocks() after
the step's K/V are written, free() when it finishes or is preempted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.engine.block_pool import BlockKey, BlockPool, count_refs


@dataclass(frozen=True)
class PrefixCacheStats:
    num_queries: int  # match_prefix() calls with prefix caching on
    num_query_tokens: int  # tokens of those sequences
    num_hit_tokens: int  # tokens covered by cached blocks
    num_evicted_blocks: int  # cached blocks evicted to make room

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}
        self._chains: dict[str, list[BlockKey]] = {}
        self._num_queries = 0
        self._num_query_tokens = 0
        self._num_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation could use right now: free ones plus unreferenced cached ones."""
        return self._pool.num_available

    @property
    def num_total_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one sequence."""
        return self._pool.num_in_use / self._pool.num_blocks

    @property
    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            num_queries=self._num_queries,
            num_query_tokens=self._num_query_tokens,
            num_hit_tokens=self._num_hit_tokens,
            num_evicted_blocks=self._pool.num_evicted,
        )

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block: int) -> int:
        """How many block-table entries point at the block."""
        return self._pool.ref_count(block)

    def block_table(self, seq_id: str) -> list[int]:
        """A copy of the sequence's block table ([] for a sequence without blocks)."""
        return list(self._tables.get(seq_id, ()))

    def table(self, seq_id: str) -> Sequence[int]:
        """The sequence's block table itself, not a copy (the step's batch reads every table): read it
        before the next call that changes the sequence's blocks, and never change it."""
        return self._tables.get(seq_id, ())

    def match_prefix(self, seq_id: str, token_ids: Sequence[int], salt: int | None = None) -> int:
        """Start the block table of a sequence without blocks with the longest run of cached full blocks of
        token_ids, referencing each; return the tokens they cover. At most (len-1)//block_size blocks, so at
        least one token is left to compute. 0 with prefix caching off. `salt` (the sequence's LoRA adapter,
        see BlockKey) is the same in every call for one sequence."""
        if self._tables.get(seq_id):
            raise ValueError(f"match_prefix on sequence {seq_id!r}, which already has blocks")
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        blocks: list[int] = []
        chain: list[BlockKey] = []
        parent: BlockKey | None = None
        for i in range((len(token_ids) - 1) // bs):
            block = self._pool.lookup(BlockKey(parent, tuple(token_ids[i * bs : (i + 1) * bs]), salt))
            if block is None:
                break
            parent = self._pool.key(block)
            assert parent is not None
            blocks.append(block)
            chain.append(parent)
        for block in blocks:
            self._pool.ref(block)
        self._tables[seq_id] = blocks
        self._chains[seq_id] = chain
        self._num_queries += 1
        self._num_query_tokens += len(token_ids)
        self._num_hit_tokens += len(blocks) * bs
        return len(blocks) * bs

    def keys_of_new_blocks(
        self, seq_id: str, token_ids: Sequence[int], num_tokens: int, salt: int | None = None
    ) -> list[BlockKey]:
        """The keys the full blocks among the sequence's first num_tokens tokens will have once computed, for
        those past its chain (matched or already offered to the cache); nothing is registered. [] with prefix
        caching off. The scheduler uses it to see which blocks a step is about to compute."""
        if not self.enable_prefix_caching:
            return []
        chain = self._chains.get(seq_id, [])
        bs = self.block_size
        keys: list[BlockKey] = []
        parent = chain[-1] if chain else None
        for i in range(len(chain), min(num_tokens, len(token_ids)) // bs):
            parent = BlockKey(parent, tuple(token_ids[i * bs : (i + 1) * bs]), salt)
            keys.append(parent)
        return keys

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> int:
        """Start a child sequence without blocks on the parent's full blocks covering its first num_tokens
        tokens (K/V already written), referencing each; return the tokens they cover. Works with prefix
        caching off too: this is how the samples of one request share their prompt."""
        if self._tables.get(child_id):
            raise ValueError(f"fork into sequence {child_id!r}, which already has blocks")
        shared = self._tables[parent_id][: num_tokens // self.block_size]
        for block in shared:
            self._pool.ref(block)
        self._tables[child_id] = list(shared)
        self._chains[child_id] = self._chains[parent_id][: len(shared)]
        return len(shared) * self.block_size

    def copy_tail(self, parent_id: str, child_id: str) -> tuple[int, int] | None:
        """Give a child just forked on the parent's full blocks a block of its own for the parent's next
        (partial) block, so the child need not recompute it: returns (the parent's block, the child's new
        one), whose K/V the caller copies. None, changing nothing, when the parent has no such block or
        no block is available. The new block stays uncached until full, like any partial block."""
        parent, child = self._tables[parent_id], self._tables[child_id]
        if len(parent) <= len(child) or self._pool.num_available == 0:
            return None
        [block] = self._pool.take(1)
        child.append(block)
        return parent[len(child) - 1], block

    def allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Grow the sequence's block table to cover num_tokens tokens (free blocks first, then evicting the
        least recently released cached block). Not enough blocks: change nothing and return False."""
        table = self._tables.get(seq_id)
        if table is not None and len(table) * self.block_size >= num_tokens:
            return True  # most calls: a decode step within the sequence's last block
        table = table if table is not None else []
        needed = self.blocks_needed(num_tokens) - len(table)
        if needed > self._pool.num_available:
            return False
        if needed > 0:
            table.extend(self._pool.take(needed))
        self._tables.setdefault(seq_id, table)
        self._chains.setdefault(seq_id, [])
        return True

    def cache_full_blocks(
        self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int, salt: int | None = None
    ) -> None:
        """The first num_computed_tokens of the sequence have their K/V written: offer each full block among
        them to the prefix cache. An identical block already cached stays the cached copy; this sequence's
        block then stays uncached (back to free on release)."""
        if not self.enable_prefix_caching:
            return
        table, chain = self._tables[seq_id], self._chains[seq_id]
        if not 0 <= num_computed_tokens <= min(len(token_ids), len(table) * self.block_size):
            raise ValueError(
                f"sequence {seq_id!r}: {num_computed_tokens} computed tokens, but it has {len(token_ids)} "
                f"tokens and {len(table)} blocks of {self.block_size}"
            )
        bs = self.block_size
        for i in range(len(chain), num_computed_tokens // bs):
            key = BlockKey(chain[-1] if chain else None, tuple(token_ids[i * bs : (i + 1) * bs]), salt)
            # Build on the cached key, so later keys share its parent object and compare in one step.
            chain.append(self._pool.register(table[i], key))

    def free(self, seq_id: str) -> None:
        """Release all the sequence's blocks, tail first, so the tail is evicted before the head."""
        self._chains.pop(seq_id, None)
        for block in reversed(self._tables.pop(seq_id, [])):
            self._pool.release(block)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block back to free (SGLang /flush_cache); False, changing nothing, if any block is
        still referenced."""
        return self._pool.reset()

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant of the table at the top of this file."""
        for seq_id, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"sequence {seq_id!r} has a block twice in its table {table}")
            chain = self._chains.get(seq_id)
            if chain is None or len(chain) > len(table):
                raise AssertionError(f"sequence {seq_id!r}: chain of {chain and len(chain)} keys for {table}")
            for i, key in enumerate(chain):
                if key.parent != (chain[i - 1] if i else None):
                    raise AssertionError(f"sequence {seq_id!r}: key {i} of its chain is not built on key {i - 1}")
        if self._chains.keys() != self._tables.keys():
            raise AssertionError(f"chains for {sorted(self._chains)} but tables for {sorted(self._tables)}")
        if not self.enable_prefix_caching and self._pool.num_cached:
            raise AssertionError(f"prefix caching is off but {self._pool.num_cached} blocks are cached")
        self._pool.check_integrity(count_refs(self._tables.values()))
