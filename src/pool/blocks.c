/* SPDX-License-Identifier: MIT */
/*
 * An arena's blocks as the rest of the pool sees them, whichever allocator keeps them: the
 * buddy (power-of-two blocks) or, under CUHEAP_VMM_PLACEMENT=first-fit, first fit by address
 * (src/fit.c). Where a block goes is place.c's; these answer what is where.
 *
 * Lock rule: p->lock held by every caller. No driver call.
 */
#include "internal.h"

/* Bytes of the block that starts at ptr (live, pending or kept on a list), or -EINVAL when
 * none does. */
int64_t block_bytes_at(const struct cuheap_arena *a, uint64_t ptr)
{
    if (arena_first_fit(a)) {
        uint64_t bytes = cuheap_fit_bytes_at(&a->fit, ptr);
        return bytes ? (int64_t)bytes : -EINVAL;
    }
    int order = cuheap_buddy_order_at(&a->buddy, ptr);
    return order < 0 ? order : (int64_t)(1ull << order);
}

/* The block that holds addr: 0 with its start and bytes and whether it is allocated (not
 * free in the arena), -EINVAL outside it. Under first fit a free addr answers allocated false
 * alone. */
int block_holding(const struct cuheap_arena *a, uint64_t addr, uint64_t *ret_start,
                  uint64_t *ret_bytes, bool *ret_allocated)
{
    if (arena_first_fit(a)) {
        uintptr_t start = 0;
        int r = cuheap_fit_block_of(&a->fit, addr, &start, ret_bytes);
        *ret_allocated = r == 0;
        *ret_start = start;
        return r == -EINVAL ? r : 0;
    }
    uintptr_t start;
    unsigned order;
    int r = cuheap_buddy_block_of(&a->buddy, addr, &start, &order, ret_allocated);
    if (r == 0) {
        *ret_start = start;
        *ret_bytes = 1ull << order;
    }
    return r;
}

/* What starts at addr, a block or free space, for a walk over an arena: 0 with its bytes,
 * -EINVAL when nothing starts there. */
int piece_at(const struct cuheap_arena *a, uint64_t addr, uint64_t *ret_bytes, bool *ret_allocated)
{
    if (arena_first_fit(a))
        return cuheap_fit_piece_at(&a->fit, addr, ret_bytes, ret_allocated);
    uintptr_t start;
    unsigned order;
    if (cuheap_buddy_block_of(&a->buddy, addr, &start, &order, ret_allocated) || start != addr)
        return -EINVAL;
    *ret_bytes = 1ull << order;
    return 0;
}

/* The largest request the arena serves without a free. */
uint64_t largest_free_of(const struct cuheap_arena *a)
{
    return arena_first_fit(a) ? cuheap_fit_largest_free(&a->fit)
                              : cuheap_buddy_largest_free(&a->buddy);
}
