#!/usr/bin/env python3
"""A host model of fa3_wgmma_sm90's backward grid under a causal mask: how far
above the balanced time the last CTA ends, in the grid's own order and in
KeyBlockOrder's sections (src/kernels/common/tile_scheduler.h), with its
16-key-block threshold (below it the two columns agree).

One CTA an SM, CTAs start in the order of their linear index on the SM that
frees first; a CTA's time is its walk (the query blocks that see its key block)
plus a fixed cost of two steps (K/V in, dK/dV out). Not a timing: it says where
the tail is, not what a step costs. Usage: backward_order_model.py [SMS] [L2_MB]
"""
import heapq
import sys


def makespan(works, sms):
    free = [0.0] * sms
    end = 0.0
    for work in works:
        t = heapq.heappop(free) + work
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def cta_at(index, key_blocks, pairs, sections):  # key_block_cta_at
    small, big_sections = pairs // sections, pairs % sections
    big_ctas = (small + 1) * key_blocks
    if index < big_sections * big_ctas:
        size, first, within = small + 1, index // big_ctas * (small + 1), index % big_ctas
    else:
        rest = index - big_sections * big_ctas
        size = small
        first = big_sections * (small + 1) + rest // (small * key_blocks) * small
        within = rest % (small * key_blocks)
    return within // size, first + within % size


SECTIONED_KEY_BLOCKS = 16  # kSectionedKeyBlocks: fewer keep the grid's order


def sections_for(key_blocks, pairs, pair_bytes, sms, l2_bytes):  # key_block_order
    if key_blocks < SECTIONED_KEY_BLOCKS or pairs <= 1:
        return pairs
    section_pairs = min(-(-2 * sms // key_blocks), max(1, l2_bytes * 3 // 4 // pair_bytes))
    return min(max((pairs + section_pairs // 2) // section_pairs, 1), pairs)


def main():
    sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132
    l2_bytes = (int(sys.argv[2]) if len(sys.argv) > 2 else 50) << 20
    print(f"{sms} SMs, {l2_bytes >> 20} MB L2; 16k tokens, 2048 model dim; end over the balanced time")
    for head_dim, block_m, block_n in ((64, 128, 128), (128, 64, 128), (256, 64, 64)):
        heads = 2048 // head_dim if head_dim < 256 else 8
        for seqlen in (1024, 2048, 3000, 4096, 5000, 8192, 16384):
            batch = max(1, 16384 // seqlen)
            pairs = batch * heads
            key_blocks, query_blocks = -(-seqlen // block_n), -(-seqlen // block_m)
            walk = [sum(1 for m in range(query_blocks) if (m + 1) * block_m - 1 >= n * block_n) + 2.0
                    for n in range(key_blocks)]
            own = [walk[n] for _ in range(pairs) for n in range(key_blocks)]
            balanced = sum(own) / sms
            sections = sections_for(key_blocks, pairs, seqlen * head_dim * 8, sms, l2_bytes)
            ordered = [walk[cta_at(i, key_blocks, pairs, sections)[0]] for i in range(key_blocks * pairs)]
            print(f"head_dim {head_dim:3d} seqlen {seqlen:5d} batch {batch:2d}: grid order "
                  f"{makespan(own, sms) / balanced:.3f}, {sections} sections of {pairs / sections:.1f} pairs "
                  f"{makespan(ordered, sms) / balanced:.3f}")


if __name__ == "__main__":
    main()
