// The dual-tree walk on the device (src/fmm/traversal.rs's `walk` over a rank's own tree,
// every cell a target): the M2L sources and P2P source leaves of every cell, the same lists
// in the same order as the host's, level by level. A target at level l takes the sources its
// parent deferred (the root: itself), merges them with the children of the sources it opens
// on the spot (smallest index first, the opened ones waiting in a ring), decides each pair
// as the host does (`Mac::accepts`, `open_second`, the symmetric walk's order of the pair),
// and writes its M2L and P2P lists and the sources it defers to its children (with its own
// children in their place when it meets itself).
//
// One thread per target, run twice per level: a counting pass, then (after the prefix sums
// of the counts) a writing pass that writes at the offsets. A target's walk is a chain of
// decisions, one per candidate source (a handed one or an opened one), and the longest
// chain of a level sets its time (on disk-in-halo at 1e7, up to ~750 candidates for a
// target against a mean of ~170): each candidate's values are loaded together and one
// candidate ahead (`WalkCell`), while the current one is decided. The counting pass keeps
// each target's entries (up to a number the host picks), so the writing pass only copies
// them; a target with more walks again, repeating the decisions.
//
// The rings: a launch over a range of targets gives each thread a short ring (the host
// picks its length), so that a launch holds enough targets to keep the GPU busy (the walk
// is latency-bound). A target whose ring fills up stops, writes no counts or spans, and
// puts itself on the `retry` list (an integer atomic append; each target's results go to
// its own slots, so the list's order does not matter); the host then launches the listed
// targets again with long rings, and one that fills even those is the host's to walk. (The
// Milky Way model at 1e7, default settings, needs more than 1024 entries for 18 targets of
// its first step and more than 4096 for 2 of its fourth: a large leaf next to the dense bulge
// opens its sources down to many small leaves. 16384 is enough there.) Whatever else the
// host's walk would have had to handle (a list out of increasing order, a leaf that defers
// sources) is counted in `problems` too: the host then walks itself. A target stopped in a
// writing pass has written a prefix of its lists, which its second launch writes again in
// full.

// Relative band around the MAC's thresholds inside which the square root decides
// (traversal.rs: MAC_BAND).
#define WALK_MAC_BAND 1e-9

// Cell c's values in the moments array (moments.cu's finish_moments: mass, centre, r_max).
#define CELL_CENTRE(m, c, k) ((m)[5 * (size_t)(c) + 1 + (k)])
#define CELL_R_MAX(m, c) ((m)[5 * (size_t)(c) + 4])

// A cell's centre and radius (r_max) from the moments array.
struct CellBall {
    double x, y, z, r;
};

__device__ __forceinline__ CellBall cell_ball(const double* m, unsigned c) {
    return CellBall{CELL_CENTRE(m, c, 0), CELL_CENTRE(m, c, 1), CELL_CENTRE(m, c, 2),
                    CELL_R_MAX(m, c)};
}

// traversal.rs: Mac::accepts for cells a and b, unfused, with the same band.
__device__ __forceinline__ bool mac_accepts(const CellBall& a, const CellBall& b, double theta,
                                            double support) {
    const double dx = __dsub_rn(a.x, b.x);
    const double dy = __dsub_rn(a.y, b.y);
    const double dz = __dsub_rn(a.z, b.z);
    const double d2 = __dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)), __dmul_rn(dz, dz));
    const double r = __dadd_rn(a.r, b.r);
    const double rs = __dadd_rn(r, support);
    const double near = __dmul_rn(r, r), far = __dmul_rn(rs, rs);
    const double reach = __dmul_rn(__dmul_rn(theta, theta), d2);
    const double above = 1.0 + WALK_MAC_BAND, below = 1.0 - WALK_MAC_BAND;
    if (reach > __dmul_rn(near, above) && d2 > __dmul_rn(far, above)) return true;
    if (reach < __dmul_rn(near, below) || d2 < __dmul_rn(far, below)) return false;
    const double d = sqrt(d2);
    return r < __dmul_rn(theta, d) && __dsub_rn(d, r) > support;
}

// The key of f64::total_cmp: an integer ordered as total_cmp orders the doubles.
__device__ __forceinline__ long long total_order(double x) {
    long long bits = __double_as_longlong(x);
    return bits ^ (long long)(((unsigned long long)(bits >> 63)) >> 1);
}

// A cell of the own tree with what the walk's decisions read of it: its ball, children
// (count and first) and particles (begin, end). A candidate source's values are loaded
// together, one candidate ahead of their use, so that a target's walk waits on memory once
// per candidate at most, not on a chain of loads (index, then ball, then children, ...).
struct WalkCell {
    unsigned index;
    CellBall ball;
    unsigned children, first_child, begin, end;
};

__device__ __forceinline__ WalkCell walk_cell(const double* m, const unsigned* begin,
                                              const unsigned* end, const unsigned* first_child,
                                              const unsigned* child_count, unsigned c) {
    return WalkCell{c, cell_ball(m, c), child_count[c], first_child[c], begin[c], end[c]};
}

// traversal.rs: open_second for two cells of the own tree.
__device__ __forceinline__ bool open_second(const WalkCell& a, const WalkCell& b) {
    if (a.children == 0) return true;
    if (b.children == 0) return false;
    long long x = total_order(b.ball.r), y = total_order(a.ball.r);
    const double bc[3] = {b.ball.x, b.ball.y, b.ball.z}, ac[3] = {a.ball.x, a.ball.y, a.ball.z};
    for (int k = 0; k < 3 && x == y; ++k) {
        x = total_order(bc[k]);
        y = total_order(ac[k]);
    }
    return x > y;
}

// Where a counting pass keeps a target's entries for its writing pass: each entry is a
// source with its list's tag in the top bits, in the order the walk made them. `room`
// entries at most; `count` may pass it (then they were not all kept).
#define WALK_TAG_SHIFT 30
#define WALK_M2L 0u
#define WALK_P2P 1u
#define WALK_DEFERRED 2u
// cache_len of a target whose entries were not all kept: its writing pass walks again.
#define WALK_UNCACHED 0xffffffffu

struct WalkCache {
    unsigned* out;
    unsigned room;
    unsigned count;
    __device__ void keep(unsigned tag, unsigned s) {
        if (count < room) out[count] = (tag << WALK_TAG_SHIFT) | s;
        ++count;
    }
};

// One list of a target: counted, or written from `out` on; `last` checks increasing order.
struct WalkList {
    unsigned* out;
    unsigned count;
    unsigned last;
    bool sorted;
    __device__ void put(unsigned s) {
        if (count > 0 && s <= last) sorted = false;
        last = s;
        if (out) out[count] = s;
        ++count;
    }
};

// The targets chunk_first .. chunk_first + chunk_count of the level whose cells start at
// level_first, or with `listed` the targets which[chunk_first .. chunk_first + chunk_count].
// Sources handed to target t: `handed[start .. start + len]` with (start, len) =
// unpack(deferred_span[parent[t]]) (the root: itself). counts[i stride + k], k = t -
// level_first: how many M2L sources (i = 0), P2P sources (1) and deferred sources (2) t has
// (each list's counts contiguous, `stride` apart, for the prefix sums); pairs[t]: its P2P
// particle pairs. With `write` (counts now the exclusive prefix sums over the level, per
// list), t's lists go to m2l_out[m2l_base + offset ..], p2p_out[p2p_base + offset ..] and
// deferred_out[offset ..], with their spans. `ring` holds `queue` entries (a power of two)
// per thread of the launch; a target whose ring fills up is appended to `retry`
// (`retry_count` counts them). Without `write`, target t keeps up to `cache_room` entries at
// cache[k cache_room ..] and their number (WALK_UNCACHED if they did not fit) in
// cache_len[k]; with `write`, a target whose entries were kept writes its lists from them
// instead of walking again (the same lists: the entries in the walk's order).
extern "C" __global__ void walk_level(
    unsigned level_first, unsigned chunk_first, unsigned chunk_count, int listed,
    const unsigned* __restrict__ which, int write,
    const double* __restrict__ moments, const unsigned* __restrict__ begin,
    const unsigned* __restrict__ end, const unsigned* __restrict__ first_child,
    const unsigned* __restrict__ child_count, const unsigned* __restrict__ parent,
    const unsigned long long* __restrict__ handed_span, const unsigned* __restrict__ handed,
    double theta, double support, unsigned* __restrict__ ring, unsigned queue,
    unsigned* __restrict__ cache, unsigned cache_room, unsigned* __restrict__ cache_len,
    unsigned stride,
    unsigned* __restrict__ counts,
    unsigned long long* __restrict__ pairs, unsigned m2l_base, unsigned p2p_base,
    unsigned* __restrict__ m2l_out, unsigned long long* __restrict__ m2l_spans,
    unsigned* __restrict__ p2p_out, unsigned long long* __restrict__ p2p_spans,
    unsigned* __restrict__ deferred_out, unsigned long long* __restrict__ deferred_span,
    unsigned* __restrict__ retry, unsigned* __restrict__ retry_count,
    unsigned* __restrict__ problems) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= chunk_count) return;
    const unsigned t = listed ? which[chunk_first + i] : chunk_first + i, k = t - level_first;
    if (write && cache_room > 0 && cache_len[k] != WALK_UNCACHED) {
        // The counting pass kept every entry of the target's lists, in order (and checked
        // that order): they are copied.
        const unsigned* kept = cache + (size_t)k * cache_room;
        const unsigned m2l_at = m2l_base + counts[k], p2p_at = p2p_base + counts[stride + k];
        const unsigned deferred_at = counts[2 * stride + k];
        const unsigned source_mask = (1u << WALK_TAG_SHIFT) - 1;
        unsigned n[3] = {0, 0, 0};
        for (unsigned j = 0, len = cache_len[k]; j < len; ++j) {
            const unsigned tag = kept[j] >> WALK_TAG_SHIFT, s = kept[j] & source_mask;
            if (tag == WALK_M2L) {
                m2l_out[m2l_at + n[0]++] = s;
            } else if (tag == WALK_P2P) {
                p2p_out[p2p_at + n[1]++] = s;
            } else {
                deferred_out[deferred_at + n[2]++] = s;
            }
        }
        m2l_spans[t] = ((unsigned long long)m2l_at << 32) | n[0];
        p2p_spans[t] = ((unsigned long long)p2p_at << 32) | n[1];
        deferred_span[t] = ((unsigned long long)deferred_at << 32) | n[2];
        return;
    }
    unsigned* ring_of_t = ring + (size_t)i * queue;
    const unsigned mask = queue - 1;
    // The root is handed itself (no list: a local one would live in local memory).
    const unsigned* from = nullptr;
    unsigned from_len = 1;
    if (t != 0) {
        const unsigned long long span = handed_span[parent[t]];
        from = handed + (unsigned)(span >> 32);
        from_len = (unsigned)span;
    }
    WalkList m2l{nullptr, 0, 0, true}, p2p{nullptr, 0, 0, true}, deferred{nullptr, 0, 0, true};
    WalkCache kept{cache + (size_t)k * cache_room, cache_room, 0};
    const bool keeping = !write && cache_room > 0;
    // An entry into its list (and, in a counting pass, into the target's kept entries).
    auto put = [&](WalkList& list, unsigned tag, unsigned s) {
        list.put(s);
        if (keeping) kept.keep(tag, s);
    };
    if (write) {
        m2l.out = m2l_out + m2l_base + counts[k];
        p2p.out = p2p_out + p2p_base + counts[stride + k];
        deferred.out = deferred_out + counts[2 * stride + k];
    }
    // The target's own values, read once rather than at every decision.
    auto cell = [&](unsigned c) {
        return walk_cell(moments, begin, end, first_child, child_count, c);
    };
    const WalkCell target = cell(t);
    const bool t_leaf = target.children == 0;
    const unsigned long long t_count = target.end - target.begin;
    unsigned long long near_pairs = 0;
    bool split_self = false, children_placed = false, full = false;
    unsigned next_handed = 0, head = 0, tail = 0;
    // The next handed source and the next opened one (the ring's head), loaded ahead, and
    // the index of the handed source after that.
    WalkCell handed_next = target, opened_next = target;
    if (from_len > 0) handed_next = cell(from ? from[0] : 0u);
    unsigned handed_after = from_len > 1 ? from[1] : 0u;
    while (!full) {
        const bool have_handed = next_handed < from_len, have_opened = head < tail;
        WalkCell source;
        if (have_opened && (!have_handed || opened_next.index < handed_next.index)) {
            source = opened_next;
            ++head;
            if (head < tail) opened_next = cell(ring_of_t[head & mask]);
        } else if (have_handed) {
            source = handed_next;
            ++next_handed;
            if (next_handed < from_len) handed_next = cell(handed_after);
            if (next_handed + 1 < from_len) handed_after = from[next_handed + 1];
        } else {
            break;
        }
        const unsigned s = source.index;
        if (s == t) {
            if (t_leaf) {
                put(p2p, WALK_P2P, t);
                near_pairs += t_count * t_count;
            } else {
                split_self = true;
            }
            continue;
        }
        if (mac_accepts(target.ball, source.ball, theta, support)) {
            put(m2l, WALK_M2L, s);
            continue;
        }
        if (t_leaf && source.children == 0) {
            put(p2p, WALK_P2P, s);
            near_pairs += t_count * (unsigned long long)(source.end - source.begin);
            continue;
        }
        const bool opens_source = target.begin < source.begin ? open_second(target, source)
                                                              : !open_second(source, target);
        if (opens_source) {
            const unsigned c0 = source.first_child, c1 = c0 + source.children;
            const bool was_empty = head == tail;
            for (unsigned c = c0; c < c1; ++c) {
                if (tail - head == queue) {
                    full = true;
                    break;
                }
                ring_of_t[tail++ & mask] = c;
            }
            // An empty ring's new head is the first child: no need to read it back.
            if (was_empty && head < tail) opened_next = cell(c0);
        } else {
            // The target's own children go where the host's partition point puts them:
            // before the first deferred source at or past them.
            if (split_self && !children_placed && s >= target.first_child) {
                for (unsigned c = target.first_child; c < target.first_child + target.children;
                     ++c) {
                    put(deferred, WALK_DEFERRED, c);
                }
                children_placed = true;
            }
            put(deferred, WALK_DEFERRED, s);
        }
    }
    if (full) {
        if (keeping) cache_len[k] = WALK_UNCACHED;
        retry[atomicAdd(retry_count, 1u)] = t;
        return;
    }
    if (split_self && !children_placed) {
        for (unsigned c = target.first_child; c < target.first_child + target.children; ++c) {
            put(deferred, WALK_DEFERRED, c);
        }
    }
    const bool leaf_defers = t_leaf && deferred.count > 0;
    if (leaf_defers || !m2l.sorted || !p2p.sorted || !deferred.sorted) {
        atomicAdd(problems, 1u);
    }
    if (write) {
        const unsigned m2l_start = m2l_base + counts[k], p2p_start = p2p_base + counts[stride + k];
        m2l_spans[t] = ((unsigned long long)m2l_start << 32) | m2l.count;
        p2p_spans[t] = ((unsigned long long)p2p_start << 32) | p2p.count;
        deferred_span[t] = ((unsigned long long)counts[2 * stride + k] << 32) | deferred.count;
    } else {
        if (keeping) cache_len[k] = kept.count <= cache_room ? kept.count : WALK_UNCACHED;
        counts[k] = m2l.count;
        counts[stride + k] = p2p.count;
        counts[2 * stride + k] = deferred.count;
        pairs[t] = near_pairs;
    }
}
