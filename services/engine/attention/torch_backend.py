"""Paged attention in plain torch: runs on CPU and CUDA, and is the reference the Triton kernels
are tested against.

Two paths over the same cache layout (see context.py):
- decoding sequences (one new token each): their K/V is gathered by block table into padded
  (b, max_len, Hkv, D) tensors, a few length groups at a time, each attended in ONE batched
  SDPA call with a key-padding mask;
- sequences with a prefill chunk: a loop over them, each a causal SDPA whose mask is shifted
  by the sequence's cached prefix (query i sits at position L - q + i).
A batch mixing both sends each sequence down its own path, so one new prompt's chunk does not
turn every running decode into a separate SDPA call.

Slots past a sequence's length are never trusted: they may hold another request's stale K/V
(even NaN), so the prefill path slices them off and the decode path gathers padding from the
cache's zero block (KVCache.null_slot) instead of reading them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from services.engine.attention.backend import AttentionBackend

if TYPE_CHECKING:
    from services.engine.attention.context import ForwardContext


# Decode batches are split into at most this many length groups of at least this many sequences.
DECODE_MAX_GROUPS = 4
DECODE_MIN_GROUP = 8


class TorchAttentionBackend(AttentionBackend):
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        k_cache = self.kv_cache.k[layer]  # (N, bs, Hkv, D)
        v_cache = self.kv_cache.v[layer]  # (N, bs, Hkv, D)
        self._store(k_cache, v_cache, k, v, ctx.slot_mapping)
        if ctx.is_decode_only:
            return self._decode(q, k_cache, v_cache, ctx)
        out = torch.empty_like(q)  # (T, Hq, D)
        decoding, rows = self._decoding_rows(ctx, q.device)
        self._prefill(out, q, k, v, k_cache, v_cache, ctx, skip=decoding)
        if decoding:
            out[rows] = self._decode(q[rows], k_cache, v_cache, ctx)
        return out

    @staticmethod
    def _store(
        k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
    ) -> None:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        # A view of the pool as one row per slot: slot = block * block_size + offset.
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))  # (N*bs, Hkv, D)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))  # (N*bs, Hkv, D)

    @staticmethod
    def _decoding_rows(ctx: ForwardContext, device: torch.device) -> tuple[frozenset[int], torch.Tensor]:
        """In a mixed batch: the sequences bringing one token, and those tokens' rows (once per batch)."""
        if "decoding_rows" not in ctx.scratch:
            starts = [0]
            for n in ctx.query_lens_cpu:
                starts.append(starts[-1] + n)
            decoding = [b for b, n in enumerate(ctx.query_lens_cpu) if n == 1]
            ctx.scratch["decoding_rows"] = torch.tensor([starts[b] for b in decoding], device=device)
            ctx.scratch["decoding_seqs"] = torch.tensor(decoding, device=device)
            ctx.scratch["decoding_seqs_cpu"] = decoding
            ctx.scratch["decoding_seqs_set"] = frozenset(decoding)
        return ctx.scratch["decoding_seqs_set"], ctx.scratch["decoding_rows"]

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """q (b, Hq, D): one token of each decoding sequence of ctx, in batch order."""
        batch, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        # GQA without repeating K/V: the `group` query heads sharing a KV head become that head's
        # query rows; they all sit at the same position, so one key mask serves them all.
        queries = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (B, Hkv, G, D)
        k_rows = k_cache.view(-1, num_kv_heads, head_dim)  # (slots, Hkv, D)
        v_rows = v_cache.view(-1, num_kv_heads, head_dim)
        groups = self._decode_groups(ctx, k_cache.shape[1], q.device)
        out = queries if len(groups) == 1 else torch.empty_like(queries)
        for members, gather, valid in groups:
            keys = k_rows[gather]  # (b, L, Hkv, D), zeros past each length
            values = v_rows[gather]  # (b, L, Hkv, D)
            group_out = F.scaled_dot_product_attention(
                queries if members is None else queries[members],
                keys.transpose(1, 2),  # (b, Hkv, L, D)
                values.transpose(1, 2),  # (b, Hkv, L, D)
                attn_mask=valid[:, None, None, :],  # (b, 1, 1, L)
                scale=self.scale,
            )  # (b, Hkv, G, D)
            if members is None:
                out = group_out
            else:
                out[members] = group_out
        return out.reshape(batch, num_heads, head_dim)  # (T, Hq, D)

    def _decode_groups(
        self, ctx: ForwardContext, block_size: int, device: torch.device
    ) -> list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]:
        """Sequences grouped by length, each group padded only to its own longest: gathering K/V
        is most of a CPU decode step and grows with padding. Per group: member rows (None: all, in
        order), the cache slot of every (member, position) with padding sent to the zero block, and
        the valid-position mask. Computed once per batch and shared by all layers."""
        cached = ctx.scratch.get("decode_groups")
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        # The decoding sequences (all of them, or those of a mixed batch), in batch order.
        subset = None if ctx.is_decode_only else ctx.scratch["decoding_seqs"]
        index = list(range(ctx.num_sequences)) if subset is None else ctx.scratch["decoding_seqs_cpu"]
        lengths = [ctx.seq_lens_cpu[b] for b in index]
        all_tables = ctx.block_tables if subset is None else ctx.block_tables[subset]  # (b, nb)
        all_lens = ctx.seq_lens if subset is None else ctx.seq_lens[subset]  # (b,)
        num_groups = max(1, min(DECODE_MAX_GROUPS, len(lengths) // DECODE_MIN_GROUP))
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        size = -(-len(order) // num_groups)
        groups: list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]] = []
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            members = None if num_groups == 1 else torch.tensor(rows, device=device)
            tables = all_tables if members is None else all_tables[members]  # (g, nb)
            seq_lens = all_lens if members is None else all_lens[members]  # (g,)
            positions = torch.arange(max(lengths[r] for r in rows), device=device)  # (L,)
            valid = positions[None, :] < seq_lens[:, None]  # (b, L)
            block_index = (positions // block_size).clamp(max=tables.shape[1] - 1).expand(len(rows), -1)
            slots = tables.gather(1, block_index) * block_size + positions % block_size  # (b, L)
            groups.append((members, torch.where(valid, slots, self.kv_cache.null_slot), valid))
        ctx.scratch["decode_groups"] = groups
        return groups

    def _prefill(
        self,
        out: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        ctx: ForwardContext,
        skip: frozenset[int],
    ) -> None:
        """Write into out (T, Hq, D) the attention of every sequence not in `skip`."""
        block_size = k_cache.shape[1]
        start = 0
        for b, (q_len, seq_len) in enumerate(zip(ctx.query_lens_cpu, ctx.seq_lens_cpu, strict=True)):
            end = start + q_len
            if b in skip:
                start = end
                continue
            if q_len == seq_len:
                # Nothing cached before this chunk: its own K/V are the whole sequence.
                keys, values = k[start:end], v[start:end]  # (L, Hkv, D)
            else:
                blocks = ctx.block_tables[b, : -(-seq_len // block_size)]  # (nb,)
                keys = k_cache[blocks].flatten(0, 1)[:seq_len]  # (L, Hkv, D)
                values = v_cache[blocks].flatten(0, 1)[:seq_len]  # (L, Hkv, D)
            out[start:end] = self._causal(q[start:end], keys, values)
            start = end

    def _causal(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """q (q, Hq, D) are the last q of L positions; keys/values (L, Hkv, D) -> (q, Hq, D)."""
        q_len, seq_len = q.shape[0], keys.shape[0]
        mask = None
        if q_len != seq_len:
            # Query i sits at position L - q + i and sees keys 0 .. L - q + i (SDPA's is_causal
            # would align the triangle to the top-left corner instead).
            rows = torch.arange(q_len, device=q.device)[:, None] + (seq_len - q_len)  # (q, 1)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= rows  # (q, L)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),  # (Hq, q, D)
            keys.transpose(0, 1),  # (Hkv, L, D)
            values.transpose(0, 1),  # (Hkv, L, D)
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )  # (Hq, q, D)
        return out.transpose(0, 1)  # (q, Hq, D)
