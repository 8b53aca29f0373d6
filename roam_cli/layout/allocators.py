"""Replays of runtime caching allocators, as layout baselines.

Both simulators replay the buffers as an allocation trace: at each step ``t`` (in increasing
order of the distinct times that occur) first the buffers with ``lower == t`` are allocated, in
input order, then the op runs, then the buffers whose last step is ``t`` (``upper == t + 1``)
are freed.  With integer steps that is exactly "a buffer is live on ``[lower, upper)``"; for
general integer times the buffers with ``upper <= next time`` are freed after step ``t``.

Segments / regions obtained from the device are never returned and are laid out one after the
other in one address space, so the resulting offsets form a valid single-arena layout whose
height is the peak reserved memory.

``pytorch`` -- PyTorch's CUDA caching allocator (``CUDACachingAllocator``), default settings:
  * sizes round up to 512 B (minimum 512 B);
  * requests <= 1 MiB use the *small* pool, which grows by 2 MiB segments; larger requests use
    the *large* pool, which grows by 20 MiB segments when the request is < 10 MiB and by the
    request rounded up to 2 MiB otherwise;
  * a request takes the smallest free block of its pool that fits (ties: lowest address);
  * the block is split when the remainder is >= 512 B (small pool) or > 1 MiB (large pool);
    the allocation keeps the front part;
  * a freed block merges with free neighbours inside its segment only.

``bfc`` -- ONNX Runtime's ``BFCArena`` with its default configuration
  (``kNextPowerOfTwo``, initial chunk 1 MiB, max dead bytes per chunk 128 MiB, power-of-two
  growth capped at 1 GiB):
  * sizes round up to 256 B; zero-byte requests allocate nothing;
  * 21 bins: bin ``b`` holds free chunks of ``[256 << b, 256 << (b + 1))`` bytes (the last
    one everything larger), each ordered by (size, address); a request scans bins from its own
    upward and takes the first chunk that fits, i.e. the smallest fitting chunk;
  * a chunk is split only when it is at least twice the rounded request (or the waste would be
    >= 128 MiB); otherwise the whole chunk is handed out (and counted in use);
  * a freed chunk coalesces with free neighbours of the same region;
  * when nothing fits the arena extends by a new region: the current region size (starting at
    1 MiB) is doubled until it holds the request; if it did not need doubling, the next region
    size doubles (up to 1 GiB).

Each function returns ``(offsets, stats)``; ``stats`` holds the simulator's own figures
(peak reserved, peak allocated / in use, segment or region count).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

KIB = 1024
MIB = 1024 * 1024


def _events(buffers):
    """Replay order as a list of (kind, index): allocs of a step, then frees after it."""
    starts: dict[int, list[int]] = {}
    frees: dict[int, list[int]] = {}
    times = set()
    for i, (lo, hi, _sz) in enumerate(buffers):
        if hi <= lo:
            continue
        starts.setdefault(lo, []).append(i)
        times.add(lo)
    ordered = sorted(times)
    for i, (lo, hi, _sz) in enumerate(buffers):
        if hi <= lo:
            continue
        # freed after the last allocation step t < hi
        k = bisect_left(ordered, hi) - 1
        frees.setdefault(ordered[k], []).append(i)
    out = []
    for t in ordered:
        for i in starts.get(t, ()):
            out.append(("alloc", i))
        for i in frees.get(t, ()):
            out.append(("free", i))
    return out


class _Block:
    """A block of a segment (PyTorch) or a chunk of a region (BFC): linked to its neighbours in
    address order. Links never cross a segment, so merging stays inside one."""
    __slots__ = ("addr", "size", "free", "prev", "next", "small")

    def __init__(self, addr, size, small=False):
        self.addr = addr
        self.size = size
        self.free = True
        self.prev = None
        self.next = None
        self.small = small  # PyTorch's pool of the block


def _split(block: _Block, size: int) -> _Block:
    """Keep the first `size` bytes in `block`; the rest becomes a new free block after it."""
    rest = _Block(block.addr + size, block.size - size, block.small)
    rest.prev = block
    rest.next = block.next
    if block.next is not None:
        block.next.prev = rest
    block.next = rest
    block.size = size
    return rest


def _release(block: _Block, unlist) -> _Block:
    """Free `block` and merge it with its free neighbours (`unlist` takes each out of its free
    list); returns the merged free block."""
    block.free = True
    nb = block.next
    if nb is not None and nb.free:
        unlist(nb)
        block.size += nb.size
        block.next = nb.next
        if nb.next is not None:
            nb.next.prev = block
    pb = block.prev
    if pb is not None and pb.free:
        unlist(pb)
        pb.size += block.size
        pb.next = block.next
        if block.next is not None:
            block.next.prev = pb
        block = pb
    return block


# ------------------------------------------------------------------------------ PyTorch
def pytorch_caching(buffers: Sequence[tuple[int, int, int]]) -> tuple[list[int], dict]:
    """Simulate PyTorch's CUDA caching allocator; offsets in one arena of peak reserved bytes."""
    min_block = 512
    small_size = 1 * MIB
    small_buffer = 2 * MIB
    large_buffer = 20 * MIB
    min_large_alloc = 10 * MIB
    round_large = 2 * MIB

    def round_size(sz):
        return min_block if sz < min_block else min_block * ((sz + min_block - 1) // min_block)

    def allocation_size(sz):
        if sz <= small_size:
            return small_buffer
        if sz < min_large_alloc:
            return large_buffer
        return round_large * ((sz + round_large - 1) // round_large)

    n = len(buffers)
    offsets = [0] * n
    seg_base: list[int] = []  # arena address of each segment
    reserved = 0
    allocated = 0
    peak_allocated = 0
    # free-block pools: sorted lists of (size, addr, id) plus id -> block
    pools = {True: [], False: []}
    blocks: dict[int, _Block] = {}
    held: dict[int, _Block] = {}

    def key(b):
        return (b.size, b.addr, id(b))

    def pool_add(b):
        insort(pools[b.small], key(b))
        blocks[id(b)] = b

    def pool_remove(b):
        lst = pools[b.small]
        j = bisect_left(lst, key(b))
        del lst[j]
        blocks.pop(id(b), None)

    for kind, i in _events(buffers):
        sz = buffers[i][2]
        if kind == "alloc":
            if sz <= 0:
                continue
            rs = round_size(sz)
            small = rs <= small_size
            lst = pools[small]
            j = bisect_left(lst, (rs, -1, -1))
            if j < len(lst):
                block = blocks[lst[j][2]]
                pool_remove(block)
            else:
                seg = len(seg_base)
                segsz = allocation_size(rs)
                seg_base.append(reserved)
                reserved += segsz
                block = _Block(seg_base[seg], segsz, small)
            remaining = block.size - rs
            split = remaining >= min_block if small else remaining > small_size
            if split:
                pool_add(_split(block, rs))
            block.free = False
            held[i] = block
            offsets[i] = block.addr
            allocated += block.size
            peak_allocated = max(peak_allocated, allocated)
        else:
            block = held.pop(i, None)
            if block is None:
                continue
            allocated -= block.size
            pool_add(_release(block, pool_remove))
    stats = {
        "peak_reserved": reserved,
        "peak_allocated": peak_allocated,
        "segments": len(seg_base),
    }
    return offsets, stats


# ------------------------------------------------------------------------------ ORT BFC
def bfc_arena(buffers: Sequence[tuple[int, int, int]], *, initial_chunk: int = 1 * MIB,
              max_dead_bytes: int = 128 * MIB,
              max_power_of_two_extend: int = 1024 * MIB) -> tuple[list[int], dict]:
    """Simulate ONNX Runtime's BFC arena (kNextPowerOfTwo); offsets in one arena."""
    min_alloc = 256
    num_bins = 21

    def rounded(sz):
        return min_alloc * ((sz + min_alloc - 1) // min_alloc)

    def bin_for(sz):
        v = sz >> 8
        return min(v.bit_length() - 1, num_bins - 1) if v > 0 else 0

    n = len(buffers)
    offsets = [0] * n
    bins: list[list] = [[] for _ in range(num_bins)]  # sorted (size, addr, id)
    chunks: dict[int, _Block] = {}
    held: dict[int, _Block] = {}
    total_region = 0
    regions = 0
    curr_region = rounded(initial_chunk)
    in_use = 0
    peak_in_use = 0

    def add_free(c):
        insort(bins[bin_for(c.size)], (c.size, c.addr, id(c)))
        chunks[id(c)] = c

    def remove_free(c):
        lst = bins[bin_for(c.size)]
        j = bisect_left(lst, (c.size, c.addr, id(c)))
        del lst[j]
        chunks.pop(id(c), None)

    def find(rb):
        for b in range(bin_for(rb), num_bins):
            lst = bins[b]
            j = bisect_left(lst, (rb, -1, -1))
            if j < len(lst):
                return chunks[lst[j][2]]
        return None

    for kind, i in _events(buffers):
        sz = buffers[i][2]
        if kind == "alloc":
            if sz <= 0:
                continue
            rb = rounded(sz)
            c = find(rb)
            if c is None:
                # Extend: grow the region size by doubling until the request fits
                increased = False
                while rb > curr_region:
                    curr_region *= 2
                    increased = True
                extend = curr_region
                if not increased:
                    if curr_region < max_power_of_two_extend // 2:
                        curr_region *= 2
                    else:
                        curr_region = max_power_of_two_extend
                c = _Block(total_region, extend)
                total_region += extend
                regions += 1
                add_free(c)
                c = find(rb)
            remove_free(c)
            if c.size >= rb * 2 or c.size - rb >= max_dead_bytes:
                add_free(_split(c, rb))
            c.free = False
            held[i] = c
            offsets[i] = c.addr
            in_use += c.size
            peak_in_use = max(peak_in_use, in_use)
        else:
            c = held.pop(i, None)
            if c is None:
                continue
            in_use -= c.size
            add_free(_release(c, remove_free))
    stats = {
        "peak_reserved": total_region,
        "peak_allocated": peak_in_use,
        "regions": regions,
    }
    return offsets, stats
