"""Hand-traced replays of the allocator baselines (`pytorch`, `bfc`).

Replay rule: at step t, allocate the buffers with lower == t (input order), run the op, then
free the buffers with upper == t + 1.  Segments/regions sit one after the other in the arena in
creation order.
"""

from roam_cli import layout
from roam_cli.layout.allocators import bfc_arena, pytorch_caching

MIB = 1 << 20


def test_pytorch_caching_allocator_trace():
    buffers = [
        (0, 2, 1000),      # a: small (<= 1 MiB), rounds to 1024. No free block: new 2 MiB small
                           #    segment S0 at 0; remainder 2 MiB-1024 >= 512 -> split; a at 0.
        (0, 1, 3 * MIB),   # b: large, < 10 MiB -> new 20 MiB segment S1 at 2 MiB; remainder 17 MiB
                           #    > 1 MiB -> split; b at 2 MiB.  End of step 0: b freed, merges with
                           #    the rest of S1 (one free 20 MiB block).
        (1, 3, 5 * MIB),   # c: best fit = S1's 20 MiB block -> c at 2 MiB, split (15 MiB left).
        (1, 3, 600),       # d: rounds to 1024; small pool: [1024, 2 MiB) -> d at 1024, split.
                           #    End of step 1: a freed -> free block [0, 1024) (d is in use).
        (2, 3, 512),       # e: small pool best fit: the 1024 B block at 0 (remainder 512 >= 512
                           #    -> split) -> e at 0.
        (2, 3, 12 * MIB),  # f: large: S1's free [7 MiB, 22 MiB) (15 MiB) -> f at 7 MiB; split
                           #    (3 MiB > 1 MiB left).  End of step 2: c, d, e, f freed; S1 whole.
        (3, 4, 21 * MIB),  # g: >= 10 MiB -> segment of the size rounded to 2 MiB = 22 MiB. S1 (20
                           #    MiB) is too small -> new S2 at 22 MiB; remainder 1 MiB is not
                           #    > 1 MiB -> no split: g holds all 22 MiB.
        (4, 5, 30 * MIB),  # h: after g is freed, S1 (20 MiB) and S2 (22 MiB) are adjacent in the
                           #    arena but never merge across segments -> new 30 MiB S3 at 44 MiB.
    ]
    offsets, stats = pytorch_caching(buffers)
    assert offsets == [0, 2 * MIB, 2 * MIB, 1024, 0, 7 * MIB, 22 * MIB, 44 * MIB]
    assert stats["segments"] == 4
    assert stats["peak_reserved"] == (2 + 20 + 22 + 30) * MIB
    # allocated (block sizes): step 2 = c 5 MiB + d 1024 + e 512 + f 12 MiB; step 3 = g 22 MiB
    # (unsplit block); step 4 = h 30 MiB
    assert stats["peak_allocated"] == 30 * MIB
    placed = layout.place(buffers, "pytorch")
    assert placed.offsets == offsets
    assert placed.arena == 44 * MIB + 30 * MIB
    assert placed.stats["allocator_bytes"] == stats["peak_reserved"]


def test_pytorch_split_thresholds():
    # small pool: a 600 KiB request in a 2 MiB segment leaves 1448 KiB (>= 512 B) -> split;
    # a second 600 KiB request takes the front of the remainder.
    offsets, stats = pytorch_caching([(0, 1, 600 * 1024), (0, 1, 600 * 1024)])
    assert offsets == [0, 600 * 1024] and stats["segments"] == 1
    # large pool: 19.5 MiB in a 20 MiB segment leaves 0.5 MiB, not > 1 MiB -> no split, so the
    # next large request needs a new segment
    offsets, stats = pytorch_caching([(0, 1, 19 * MIB + 512 * 1024), (0, 1, 2 * MIB)])
    assert offsets == [0, 20 * MIB] and stats["segments"] == 2
    assert stats["peak_allocated"] == 20 * MIB + 2 * MIB


def test_bfc_arena_trace():
    buffers = [
        (0, 2, 1000),      # a: rounds to 1024.  No chunk: extend by the current region size
                           #    1 MiB (enough, so the next region size doubles to 2 MiB).
                           #    R0 = [0, 1 MiB); 1 MiB >= 2*1024 -> split; a at 0.
        (0, 1, 700000),    # b: rounds to 700160; the free chunk (1 MiB - 1024) is < 2*700160 and
                           #    the waste < 128 MiB -> no split: b gets the whole chunk at 1024.
                           #    End of step 0: b freed (its chunk again free, a still in use).
        (1, 3, 2 * MIB),   # c: nothing fits -> extend by 2 MiB (enough; next size 4 MiB):
                           #    R1 = [1 MiB, 3 MiB); 2 MiB < 4 MiB -> no split; c at 1 MiB.
        (1, 2, 300),       # d: rounds to 512; smallest fitting chunk = R0's free chunk at 1024
                           #    (>= 1024 -> split); d at 1024.  End of step 1: a and d freed; they
                           #    coalesce with the rest of R0 -> one free 1 MiB chunk.
        (2, 3, 5 * MIB),   # e: nothing fits; 5 MiB > 4 MiB -> double to 8 MiB (an increase, so
                           #    the next size stays 8 MiB): R2 = [3 MiB, 11 MiB); 8 MiB < 10 MiB
                           #    -> no split; e at 3 MiB and 8 MiB in use.
        (2, 3, 4096),      # f: smallest fitting chunk: R0's 1 MiB -> split; f at 0.
        (3, 4, 9 * MIB),   # g: after c, e, f are freed: R0 1 MiB, R1 2 MiB, R2 8 MiB free; none
                           #    fits 9 MiB and regions never coalesce -> 9 MiB > 8 MiB -> 16 MiB:
                           #    R3 = [11 MiB, 27 MiB); no split (16 < 18); g at 11 MiB.
        (3, 4, 256),       # h: smallest fitting chunk is R0 (1 MiB) -> h at 0.
    ]
    offsets, stats = bfc_arena(buffers)
    assert offsets == [0, 1024, MIB, 1024, 3 * MIB, 0, 11 * MIB, 0]
    assert stats["regions"] == 4
    assert stats["peak_reserved"] == (1 + 2 + 8 + 16) * MIB
    # in use (chunk sizes): step 0: 1024 + (1 MiB - 1024) = 1 MiB; step 1: 1024 + 2 MiB + 512;
    # step 2: 2 MiB + 8 MiB + 4096; step 3: 16 MiB + 256
    assert stats["peak_allocated"] == 16 * MIB + 256
    placed = layout.place(buffers, "bfc")
    assert placed.offsets == offsets
    assert placed.arena == 11 * MIB + 9 * MIB
    assert placed.stats["allocator_bytes"] == 16 * MIB + 256


def test_bfc_bins_pick_the_smallest_fitting_chunk():
    # three regions' worth of free chunks; a 300 KiB request must take the smallest that fits
    buffers = [
        (0, 1, 1 * MIB),   # R0 = 1 MiB (next 2 MiB)
        (0, 1, 2 * MIB),   # R1 = 2 MiB (next 4 MiB)
        (0, 1, 4 * MIB),   # R2 = 4 MiB (next 8 MiB)
        (1, 2, 300 * 1024),  # all free now: chunks of 1, 2 and 4 MiB -> R0 at 0
    ]
    offsets, _ = bfc_arena(buffers)
    assert offsets == [0, MIB, 3 * MIB, 0]


def test_zero_size_requests_allocate_nothing():
    for fn in (pytorch_caching, bfc_arena):
        offsets, stats = fn([(0, 1, 0), (0, 1, 256)])
        assert offsets == [0, 0]
        assert stats["peak_allocated"] in (256, 512)
