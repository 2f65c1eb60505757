// Runs leapfmm's kernels under the CPU emulation (cuda_shim.h) on inputs written by
// tests/gpu_kernels.rs, and writes their outputs back:
//   harness p2p IN OUT        IN: counts, parameters and arrays of a P2P launch; OUT: acc, pot
//   harness integrate IN OUT  IN: n, block, dt, pos, vel, acc, h (n), count, rows (count),
//                             steps (count); OUT: vel after kick, pos after drift, vel after
//                             kick_each of everybody by h (from the kicked vel), then after
//                             kick_each of the rows listed by their steps
//   harness state IN OUT      IN: n, block, order_of, pos, mass, acc (tree order), pot (tree order),
//                             component bytes; OUT: gathered pos and mass, scattered acc and pot,
//                             per-block maxima of |a|^2 by component (of the scattered acc)
//   harness payload IN OUT    IN: rows, cells, width, particles, n, block, rows (cells), particles,
//                             table (cells x width), pos, mass; OUT: the gathered rows, then
//                             positions and masses of the particles (gather_rows and
//                             gather_tree_order: what a rank's device sends another)
//   harness conserved IN OUT  IN: n, block, pos, vel, mass, pot; OUT: the per-chunk conserved sums
//   harness external IN OUT   IN: n, block, terms count, pos, mass, acc, terms
//                             (EXTERNAL_TERM each); OUT: acc after add_external of all, then
//                             the per-chunk energies (external_energy_chunks)
//   harness p2m IN OUT        IN: n, leaves, p, pos, mass, leaf ranges and centres; OUT: multipoles
//   harness l2p IN OUT        IN: n, leaves, p, block, g, pos, leaf_of, centres, locals; OUT: acc, pot
//   harness m2m IN OUT        IN: cells, parents, p, centres, first_child, child_count,
//                             parents, multipoles; OUT: multipoles
//   harness l2l IN OUT        IN: cells, children, p, centres, parent, children, locals;
//                             OUT: locals
//   harness fmm IN OUT        IN: a whole device plan (tests/gpu_kernels.rs: fmm_input); OUT: acc, pot
//                             of the own particles from the pass sequence P2M, M2M (unless the
//                             plan gives the multipoles and leaves none to the device), M2L,
//                             L2L, L2P, P2P
//   harness upward IN OUT     IN: as fmm; OUT: the multipoles after P2M and M2M
//   harness bounds IN OUT     IN: n, blocks, block, pos, mass; OUT: the blocks' extremes (7 each)
//   harness sort IN OUT       IN: n, block, cube corner, scale, pos; OUT: the Morton keys, then
//                             the keys and particle indices after the radix sort's 8 passes
//   harness m2l IN OUT        IN: cells, targets, list length, p, direct (1: the direct
//                             form, 0: the kernel the device takes), centres, targets,
//                             spans (per cell), list, multipoles; OUT: locals (zero before)
//   harness moments IN OUT    IN: n, cells, levels, leaves, block, pos, mass (tree order),
//                             begin, end, first_child, child_count, parent (per cell),
//                             level_start (levels + 1), leaves; OUT: leaf_of, then mass,
//                             centre and r_max of each cell (5 values)
//   harness flags IN OUT      IN: n, cells, leaves, block, count, begin, end, parent (per
//                             cell), leaves, order (n), rows (count); OUT: the flags of the
//                             cells holding the rows (mark_rows, flag_cells_holding), a byte
//                             each
//   harness walk IN OUT       IN: cells, levels, chunk, retry chunk, short ring, long ring,
//                             block, entries kept per target, theta, support, moments (5 per
//                             cell), begin, end, first_child, child_count, parent (per
//                             cell), level_start; OUT: problems, targets launched
//                             again with long rings, M2L and P2P totals, targets whose
//                             entries were kept, M2L spans, P2P spans, P2P pairs (per
//                             cell), M2L list, P2P list
//   harness runs IN OUT       IN: n, block, sorted keys, ids (by particle), particle indices;
//                             OUT: problems, the indices with runs of equal keys ordered by id
//   harness split IN OUT      IN: n, leaf size, block, scan blocks, sorted keys, particle
//                             indices; OUT: sort_scan's 5 values, levels, cells, level_start
//                             (levels + 1), begin, end, first_child, child_count, parent
#include "cuda_shim.h"
#include "../p2p.cu"
#include "../integrate.cu"
#include "../expansions.cu"
#include "../m2l_rotated.cu"
#include "../keys.cu"
#include "../moments.cu"
#include "../walk.cu"
#include "../external.cu"
#include "../split.cu"
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

// The M2L launch the device makes for order p (src/gpu/device.rs: run_passes): the
// rotation-based kernel up to its largest order, unless `direct` asks for the direct form.
template <class... A>
void launch_m2l(unsigned count, int p, bool direct, A... args) {
    static_assert(M2L_ROTATED_ORDER == 8, "a rotated kernel per order");
    void (*rotated[])(const unsigned*, unsigned, const unsigned long long*, const unsigned*,
                      const double*, const double*, int, double*) = {
        m2l_rotated_1, m2l_rotated_2, m2l_rotated_3, m2l_rotated_4,
        m2l_rotated_5, m2l_rotated_6, m2l_rotated_7, m2l_rotated_8};
    if (!direct && p <= M2L_ROTATED_ORDER) {
        launch(count, M2L_ROTATED_THREADS, rotated[p - 1], args...);
    } else {
        launch(count, M2L_THREADS, p <= M2L_SMALL_ORDER ? m2l_cells_p8 : m2l_cells, args...);
    }
}

struct Reader {
    std::vector<char> bytes;
    size_t at = 0;
    template <class T>
    T one() {
        T v;
        std::memcpy(&v, bytes.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    template <class T>
    std::vector<T> many(size_t n) {
        std::vector<T> v(n);
        if (n) std::memcpy(v.data(), bytes.data() + at, n * sizeof(T));
        at += n * sizeof(T);
        return v;
    }
};

std::vector<char> slurp(const char* path) {
    std::vector<char> out;
    FILE* f = std::fopen(path, "rb");
    if (!f) return out;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
    std::fclose(f);
    return out;
}

template <class T>
void put(FILE* f, const std::vector<T>& v) {
    std::fwrite(v.data(), sizeof(T), v.size(), f);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: harness MODE IN OUT (modes: see the top of harness.cpp)\n");
        return 2;
    }
    Reader in{slurp(argv[2])};
    if (in.bytes.empty()) {
        std::fprintf(stderr, "harness: cannot read %s\n", argv[2]);
        return 1;
    }
    FILE* out = std::fopen(argv[3], "wb");
    if (!out) return 1;
    std::string mode = argv[1];
    if (mode == "p2p") {
        auto n = in.one<uint32_t>(), leaves = in.one<uint32_t>(), targets = in.one<uint32_t>();
        auto list_len = in.one<uint32_t>();
        auto kernel = in.one<int32_t>();
        auto block = in.one<uint32_t>();
        auto eps2 = in.one<float>(), h = in.one<float>();
        auto p0 = in.one<double>();
        auto g = in.one<double>();
        auto pos = in.many<double>(3 * n);
        auto mass = in.many<double>(n);
        auto begin = in.many<uint32_t>(leaves), end = in.many<uint32_t>(leaves);
        auto centre = in.many<double>(3 * leaves);
        auto target = in.many<uint32_t>(targets);
        auto spans = in.many<uint64_t>(leaves);
        auto list = in.many<uint32_t>(list_len);
        std::vector<double> acc(3 * n, 0.0), pot(n, 0.0);
        launch(targets, block, p2p_leaves, pos.data(), mass.data(), begin.data(), end.data(),
               centre.data(), target.data(), (const unsigned long long*)spans.data(),
               list.data(), (int)kernel, eps2, h, p0, g, acc.data(), pot.data());
        put(out, acc);
        put(out, pot);
    } else if (mode == "integrate") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto dt = in.one<double>();
        auto pos = in.many<double>(3 * n), vel = in.many<double>(3 * n), acc = in.many<double>(3 * n);
        auto h = in.many<double>(n);
        auto count = in.one<uint32_t>();
        auto rows = in.many<uint32_t>(count);
        auto steps = in.many<double>(count);
        unsigned grid = (n + block - 1) / block;
        launch(grid, block, kick, vel.data(), (const double*)acc.data(), dt, (unsigned)n);
        launch(grid, block, drift, pos.data(), (const double*)vel.data(), dt, (unsigned)n);
        put(out, vel);
        put(out, pos);
        launch(grid, block, kick_each, vel.data(), (const double*)acc.data(),
               (const unsigned*)rows.data(), 0u, (const double*)h.data(), (unsigned)n);
        put(out, vel);
        launch(std::max(1u, (count + block - 1) / block), block, kick_each, vel.data(),
               (const double*)acc.data(), (const unsigned*)rows.data(), 1u,
               (const double*)steps.data(), (unsigned)count);
        put(out, vel);
    } else if (mode == "state") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto order_of = in.many<uint32_t>(n);
        auto pos = in.many<double>(3 * n), mass = in.many<double>(n);
        auto acc_sorted = in.many<double>(3 * n), pot_sorted = in.many<double>(n);
        auto component = in.many<unsigned char>(n);
        unsigned grid = (n + block - 1) / block;
        std::vector<double> pos_sorted(3 * n), mass_sorted(n), acc(3 * n), pot(n);
        std::vector<double> block_max(4 * grid);
        launch(grid, block, gather_tree_order, (const double*)pos.data(),
               (const double*)mass.data(), (const unsigned*)order_of.data(), (unsigned)n,
               pos_sorted.data(), mass_sorted.data());
        launch(grid, block, scatter_forces, (const double*)acc_sorted.data(),
               (const double*)pot_sorted.data(), (const unsigned*)order_of.data(), (unsigned)n,
               acc.data(), pot.data());
        launch(grid, block, max_acceleration_blocks, (const double*)acc.data(),
               (const unsigned char*)component.data(), (unsigned)n, block_max.data());
        put(out, pos_sorted);
        put(out, mass_sorted);
        put(out, acc);
        put(out, pot);
        put(out, block_max);
    } else if (mode == "payload") {
        auto count = in.one<uint32_t>(), cells = in.one<uint32_t>(), width = in.one<uint32_t>();
        auto np = in.one<uint32_t>(), n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto rows = in.many<uint32_t>(count), particles = in.many<uint32_t>(np);
        auto table = in.many<double>((size_t)cells * width);
        auto pos = in.many<double>(3 * (size_t)n), mass = in.many<double>(n);
        std::vector<double> out_rows((size_t)count * width), out_pos(3 * (size_t)np), out_mass(np);
        size_t values = (size_t)count * width;
        launch((unsigned)((values + block - 1) / block), block, gather_rows,
               (const double*)table.data(), (const unsigned*)rows.data(), (unsigned)count,
               (unsigned)width, out_rows.data());
        launch((np + block - 1) / block, block, gather_tree_order, (const double*)pos.data(),
               (const double*)mass.data(), (const unsigned*)particles.data(), (unsigned)np,
               out_pos.data(), out_mass.data());
        put(out, out_rows);
        put(out, out_pos);
        put(out, out_mass);
    } else if (mode == "conserved") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto pos = in.many<double>(3 * n), vel = in.many<double>(3 * n);
        auto mass = in.many<double>(n), pot = in.many<double>(n);
        unsigned chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
        std::vector<double> partial(CONSERVED_SUMS * chunks);
        launch((chunks + block - 1) / block, block, conserved_chunks, (const double*)pos.data(),
               (const double*)vel.data(), (const double*)mass.data(), (const double*)pot.data(),
               (unsigned)n, partial.data());
        put(out, partial);
    } else if (mode == "external") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>(), terms = in.one<uint32_t>();
        auto pos = in.many<double>(3 * n), mass = in.many<double>(n);
        auto acc = in.many<double>(3 * n), term = in.many<double>(EXTERNAL_TERM * terms);
        std::vector<unsigned> no_rows(1);
        launch((n + block - 1) / block, block, add_external, (const double*)pos.data(),
               acc.data(), (const double*)term.data(), (unsigned)terms,
               (const unsigned*)no_rows.data(), 0u, (unsigned)n);
        unsigned chunks = (n + EXTERNAL_SUM_CHUNK - 1) / EXTERNAL_SUM_CHUNK;
        std::vector<double> partial(chunks);
        launch((chunks + block - 1) / block, block, external_energy_chunks,
               (const double*)pos.data(), (const double*)mass.data(), (unsigned)n,
               (const double*)term.data(), (unsigned)terms, partial.data());
        put(out, acc);
        put(out, partial);
    } else if (mode == "p2m") {
        auto n = in.one<uint32_t>(), leaves = in.one<uint32_t>(), p = in.one<uint32_t>();
        auto pos = in.many<double>(3 * n);
        auto mass = in.many<double>(n);
        auto begin = in.many<uint32_t>(leaves), end = in.many<uint32_t>(leaves);
        auto centre = in.many<double>(3 * leaves);
        std::vector<double> multipoles((size_t)leaves * (p + 1) * (p + 2), -1.0);
        std::vector<unsigned> which(leaves);
        for (unsigned k = 0; k < leaves; ++k) which[k] = k;
        launch(leaves, TRANSLATE_THREADS, p2m_leaves, (const double*)pos.data(),
               (const double*)mass.data(), (const unsigned*)which.data(), (unsigned)leaves,
               (const unsigned*)begin.data(), (const unsigned*)end.data(),
               (const double*)centre.data(), (int)p, multipoles.data());
        put(out, multipoles);
    } else if (mode == "l2p") {
        auto n = in.one<uint32_t>(), leaves = in.one<uint32_t>(), p = in.one<uint32_t>();
        auto block = in.one<uint32_t>();
        auto g = in.one<double>();
        auto pos = in.many<double>(3 * n);
        auto leaf_of = in.many<uint32_t>(n);
        auto centre = in.many<double>(3 * leaves);
        auto locals = in.many<double>((size_t)leaves * (p + 1) * (p + 2));
        std::vector<double> acc(3 * n, 0.0), pot(n, 0.0);
        launch((n + block - 1) / block, block, l2p_particles, (const double*)pos.data(),
               (const unsigned*)leaf_of.data(), (const double*)centre.data(),
               (const double*)locals.data(), (unsigned)n, (int)p, g, acc.data(), pot.data());
        put(out, acc);
        put(out, pot);
    } else if (mode == "m2m" || mode == "l2l") {
        // One block of TRANSLATE_THREADS per cell, as on the GPU.
        auto cells = in.one<uint32_t>(), count = in.one<uint32_t>(), p = in.one<uint32_t>();
        auto centre = in.many<double>(3 * cells);
        if (mode == "m2m") {
            auto first = in.many<uint32_t>(cells), counts = in.many<uint32_t>(cells);
            auto parents = in.many<uint32_t>(count);
            auto m = in.many<double>((size_t)cells * (p + 1) * (p + 2));
            launch(count, TRANSLATE_THREADS, m2m_cells, (const unsigned*)parents.data(), (unsigned)count,
                   (const unsigned*)first.data(), (const unsigned*)counts.data(),
                   (const double*)centre.data(), (int)p, m.data());
            put(out, m);
        } else {
            auto parent = in.many<uint32_t>(cells), which = in.many<uint32_t>(count);
            auto l = in.many<double>((size_t)cells * (p + 1) * (p + 2));
            launch(count, TRANSLATE_THREADS, l2l_cells, (const unsigned*)which.data(), (unsigned)count,
                   (const unsigned*)parent.data(), (const double*)centre.data(), (int)p, l.data());
            put(out, l);
        }
    } else if (mode == "bounds") {
        auto n = in.one<uint32_t>(), blocks = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto pos = in.many<double>(3 * n), mass = in.many<double>(n);
        std::vector<double> bounds(7 * blocks);
        launch(blocks, block, bounds_blocks, (const double*)pos.data(), (const double*)mass.data(),
               (unsigned)n, bounds.data());
        put(out, bounds);
    } else if (mode == "sort") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto lo = in.many<double>(3);
        auto scale = in.one<double>();
        auto pos = in.many<double>(3 * n);
        std::vector<uint64_t> keys(n), keys_b(n);
        std::vector<uint32_t> index(n), index_b(n);
        launch((n + block - 1) / block, block, morton_keys, (const double*)pos.data(), (unsigned)n,
               lo[0], lo[1], lo[2], scale, (unsigned long long*)keys.data(), (unsigned*)index.data());
        put(out, keys);
        unsigned tiles = (n + RADIX_TILE - 1) / RADIX_TILE;
        std::vector<uint32_t> counts(RADIX_THREADS * tiles);
        for (unsigned shift = 0; shift < 64; shift += 8) {
            launch(tiles, RADIX_THREADS, radix_count, (const unsigned long long*)keys.data(),
                   (unsigned)n, shift, (unsigned*)counts.data());
            launch(1, 64, radix_offsets, (unsigned*)counts.data(), (unsigned)counts.size());
            launch(tiles, RADIX_THREADS, radix_scatter, (const unsigned long long*)keys.data(),
                   (const unsigned*)index.data(), (unsigned)n, shift,
                   (const unsigned*)counts.data(), (unsigned long long*)keys_b.data(),
                   (unsigned*)index_b.data());
            keys.swap(keys_b);
            index.swap(index_b);
        }
        put(out, keys);
        put(out, index);
    } else if (mode == "m2l") {
        auto cells = in.one<uint32_t>(), count = in.one<uint32_t>(), n_list = in.one<uint32_t>();
        auto p = in.one<uint32_t>(), direct = in.one<uint32_t>();
        auto centre = in.many<double>(3 * cells);
        auto which = in.many<uint32_t>(count);
        auto spans = in.many<uint64_t>(cells);
        auto list = in.many<uint32_t>(n_list);
        size_t len = (size_t)(p + 1) * (p + 2);
        auto m = in.many<double>(cells * len);
        std::vector<double> l(cells * len, 0.0);
        launch_m2l(count, (int)p, direct != 0, (const unsigned*)which.data(), (unsigned)count,
                   (const unsigned long long*)spans.data(), (const unsigned*)list.data(),
                   (const double*)centre.data(), (const double*)m.data(), (int)p, l.data());
        put(out, l);
    } else if (mode == "fmm" || mode == "upward") {
        auto n = in.one<uint32_t>(), cells = in.one<uint32_t>(), levels = in.one<uint32_t>();
        auto n_leaves = in.one<uint32_t>(), m2l_len = in.one<uint32_t>(), p2p_len = in.one<uint32_t>();
        auto p = in.one<uint32_t>();
        // Own particles and cells (the first ones; the rest came from other ranks), whether
        // the multipoles are given (a distributed plan), and whether the own ones are
        // computed here all the same (the plan's are placeholders).
        auto own_n = in.one<uint32_t>(), own_cells = in.one<uint32_t>();
        auto given = in.one<uint32_t>(), upward = in.one<uint32_t>();
        auto kernel = in.one<int32_t>();
        auto block = in.one<uint32_t>();
        auto eps2 = in.one<float>(), h = in.one<float>();
        auto p0 = in.one<double>();
        auto g = in.one<double>();
        auto pos = in.many<double>(3 * n);
        auto mass = in.many<double>(n);
        auto centre = in.many<double>(3 * cells);
        auto begin = in.many<uint32_t>(cells), end = in.many<uint32_t>(cells);
        auto first = in.many<uint32_t>(cells), counts = in.many<uint32_t>(cells);
        auto parent = in.many<uint32_t>(cells);
        auto level_start = in.many<uint32_t>(levels);
        auto leaves = in.many<uint32_t>(n_leaves);
        auto leaf_of = in.many<uint32_t>(own_n);
        auto m2l_spans = in.many<uint64_t>(own_cells);
        auto m2l_list = in.many<uint32_t>(m2l_len);
        auto p2p_spans = in.many<uint64_t>(own_cells);
        auto p2p_list = in.many<uint32_t>(p2p_len);
        size_t len = (size_t)(p + 1) * (p + 2);
        std::vector<double> multipoles(cells * len, 0.0), locals(cells * len, 0.0);
        if (given) multipoles = in.many<double>(cells * len);
        std::vector<double> acc(3 * own_n, 0.0), pot(own_n, 0.0);
        auto grid = [&](size_t count) { return (unsigned)((count + block - 1) / block); };
        if (upward) {
            launch(n_leaves, TRANSLATE_THREADS, p2m_leaves, (const double*)pos.data(),
                   (const double*)mass.data(), (const unsigned*)leaves.data(), (unsigned)n_leaves,
                   (const unsigned*)begin.data(), (const unsigned*)end.data(),
                   (const double*)centre.data(), (int)p, multipoles.data());
            // Upward: the parents of each level, deepest first.
            for (int l = (int)levels - 2; l >= 0; --l) {
                std::vector<unsigned> parents;
                for (unsigned c = level_start[l]; c < level_start[l + 1]; ++c)
                    if (counts[c] > 0) parents.push_back(c);
                if (parents.empty()) continue;
                launch((unsigned)parents.size(), TRANSLATE_THREADS, m2m_cells, (const unsigned*)parents.data(),
                       (unsigned)parents.size(), (const unsigned*)first.data(),
                       (const unsigned*)counts.data(), (const double*)centre.data(), (int)p,
                       multipoles.data());
            }
        }
        if (mode == "upward") {
            put(out, multipoles);
            std::fclose(out);
            return 0;
        }
        std::vector<unsigned> all(cells);
        for (unsigned c = 0; c < cells; ++c) all[c] = c;
        launch_m2l(own_cells, (int)p, false, (const unsigned*)all.data(), (unsigned)own_cells,
                   (const unsigned long long*)m2l_spans.data(), (const unsigned*)m2l_list.data(),
                   (const double*)centre.data(), (const double*)multipoles.data(), (int)p,
                   locals.data());
        // Downward: every level below the root, top first.
        for (unsigned l = 1; l + 1 < levels; ++l) {
            unsigned count = level_start[l + 1] - level_start[l];
            launch(count, TRANSLATE_THREADS, l2l_cells, (const unsigned*)(all.data() + level_start[l]),
                   count, (const unsigned*)parent.data(), (const double*)centre.data(), (int)p,
                   locals.data());
        }
        launch(grid(own_n), block, l2p_particles, (const double*)pos.data(),
               (const unsigned*)leaf_of.data(), (const double*)centre.data(),
               (const double*)locals.data(), (unsigned)own_n, (int)p, g, acc.data(), pot.data());
        launch((unsigned)n_leaves, block, p2p_leaves, (const double*)pos.data(),
               (const double*)mass.data(), (const unsigned*)begin.data(),
               (const unsigned*)end.data(), (const double*)centre.data(),
               (const unsigned*)leaves.data(), (const unsigned long long*)p2p_spans.data(),
               (const unsigned*)p2p_list.data(), (int)kernel, eps2, h, p0, g, acc.data(), pot.data());
        put(out, acc);
        put(out, pot);
    } else if (mode == "flags") {
        auto n = in.one<uint32_t>(), cells = in.one<uint32_t>(), n_leaves = in.one<uint32_t>();
        auto block = in.one<uint32_t>(), count = in.one<uint32_t>();
        auto begin = in.many<uint32_t>(cells), end = in.many<uint32_t>(cells);
        auto parent = in.many<uint32_t>(cells);
        auto leaves = in.many<uint32_t>(n_leaves);
        auto order = in.many<uint32_t>(n);
        auto rows = in.many<uint32_t>(count);
        auto grid = [&](unsigned items) { return std::max(1u, (items + block - 1) / block); };
        std::vector<unsigned char> marked(n, 0), flags(cells, 0);
        launch(grid(count), block, mark_rows, (const unsigned*)rows.data(), (unsigned)count,
               marked.data());
        launch(grid(n_leaves), block, flag_cells_holding, (const unsigned*)leaves.data(),
               (unsigned)n_leaves, (const unsigned*)begin.data(), (const unsigned*)end.data(),
               (const unsigned*)parent.data(), (const unsigned*)order.data(),
               (const unsigned char*)marked.data(), flags.data());
        put(out, flags);
    } else if (mode == "moments") {
        auto n = in.one<uint32_t>(), cells = in.one<uint32_t>(), levels = in.one<uint32_t>();
        auto n_leaves = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto pos = in.many<double>(3 * n), mass = in.many<double>(n);
        auto begin = in.many<uint32_t>(cells), end = in.many<uint32_t>(cells);
        auto first_child = in.many<uint32_t>(cells), child_count = in.many<uint32_t>(cells);
        auto parent = in.many<uint32_t>(cells);
        auto level_start = in.many<uint32_t>(levels + 1);
        auto leaves = in.many<uint32_t>(n_leaves);
        auto grid = [&](unsigned count) { return std::max(1u, (count + block - 1) / block); };
        std::vector<uint32_t> leaf_of(n);
        std::vector<double> cell_mass(cells), centre(3 * cells), moments(5 * cells);
        std::vector<uint64_t> r2(cells, ~0ull);  // level_moments must set every one
        launch(grid(n_leaves), block, leaf_of_particles, (const unsigned*)leaves.data(),
               (unsigned)n_leaves, (const unsigned*)begin.data(), (const unsigned*)end.data(),
               (unsigned*)leaf_of.data());
        for (int l = (int)levels - 1; l >= 0; --l) {
            unsigned first = level_start[l], count = level_start[l + 1] - first;
            launch(grid(count), block, level_moments, first, count, (const unsigned*)begin.data(),
                   (const unsigned*)end.data(), (const unsigned*)first_child.data(),
                   (const unsigned*)child_count.data(), (const double*)pos.data(),
                   (const double*)mass.data(), cell_mass.data(), centre.data(),
                   (unsigned long long*)r2.data());
        }
        launch((n + ANCESTOR_THREADS - 1) / ANCESTOR_THREADS, ANCESTOR_THREADS, ancestor_r2,
               (const double*)pos.data(), (unsigned)n, (const unsigned*)leaf_of.data(),
               (const unsigned*)parent.data(), (const unsigned*)level_start.data(),
               (unsigned)levels, (const double*)centre.data(), (unsigned long long*)r2.data());
        launch(grid(cells), block, finish_moments, (unsigned)cells, (const double*)cell_mass.data(),
               (const double*)centre.data(), (const unsigned long long*)r2.data(), moments.data());
        put(out, leaf_of);
        put(out, moments);
    } else if (mode == "walk") {
        // As GpuFmm::walk: each pass of a level launches its targets `chunk` at a time with
        // rings of `short_queue` entries, then the targets whose rings filled up `retry_chunk`
        // at a time with rings of `long_queue`; a target that fills those is a problem.
        auto cells = in.one<uint32_t>(), levels = in.one<uint32_t>();
        auto chunk = in.one<uint32_t>(), retry_chunk = in.one<uint32_t>();
        auto short_queue = in.one<uint32_t>(), long_queue = in.one<uint32_t>();
        auto block = in.one<uint32_t>(), cache_room = in.one<uint32_t>();
        auto theta = in.one<double>(), support = in.one<double>();
        auto moments = in.many<double>(5 * cells);
        auto begin = in.many<uint32_t>(cells), end = in.many<uint32_t>(cells);
        auto first_child = in.many<uint32_t>(cells), child_count = in.many<uint32_t>(cells);
        auto parent = in.many<uint32_t>(cells);
        auto level_start = in.many<uint32_t>(levels + 1);
        std::vector<uint64_t> m2l_spans(cells), p2p_spans(cells), pairs(cells), deferred_span[2];
        // No launch has more targets than there are cells.
        std::vector<uint32_t> m2l_list, p2p_list, deferred[2],
            ring(std::max((size_t)std::min(chunk, cells) * short_queue,
                          (size_t)std::min(retry_chunk, cells) * long_queue)),
            retry[2];
        retry[0].resize(cells);
        retry[1].resize(cells);
        deferred_span[0].resize(cells);
        deferred_span[1].resize(cells);
        deferred[0].resize(1);
        deferred[1].resize(1);
        unsigned problems = 0, m2l_base = 0, p2p_base = 0, retried = 0, kept = 0;
        std::vector<uint32_t> cache, cache_len;
        for (unsigned l = 0; l < levels; ++l) {
            unsigned first = level_start[l], count = level_start[l + 1] - first, stride = count + 1;
            std::vector<uint32_t> counts(3 * stride, 0);
            cache.assign(std::max(1u, count * cache_room), 0);
            cache_len.assign(std::max(1u, count), 0);
            // Level l hands on what level l - 1 deferred, in the other buffers.
            const std::vector<uint32_t>& handed = deferred[(l + 1) % 2];
            const std::vector<uint64_t>& handed_span = deferred_span[(l + 1) % 2];
            std::vector<uint32_t>& next = deferred[l % 2];
            std::vector<uint64_t>& next_span = deferred_span[l % 2];
            auto pass = [&](int write) {
                unsigned listed[2] = {0, 0};
                auto walk = [&](int from_list, unsigned c, unsigned len, unsigned queue) {
                    launch((len + block - 1) / block, block, walk_level, first, c, len, from_list,
                           (const unsigned*)retry[1 - from_list].data(), write,
                           (const double*)moments.data(), (const unsigned*)begin.data(),
                           (const unsigned*)end.data(), (const unsigned*)first_child.data(),
                           (const unsigned*)child_count.data(), (const unsigned*)parent.data(),
                           (const unsigned long long*)handed_span.data(),
                           (const unsigned*)handed.data(), theta, support,
                           (unsigned*)ring.data(), queue, (unsigned*)cache.data(), cache_room,
                           (unsigned*)cache_len.data(), stride, (unsigned*)counts.data(),
                           (unsigned long long*)pairs.data(), m2l_base, p2p_base,
                           (unsigned*)m2l_list.data(), (unsigned long long*)m2l_spans.data(),
                           (unsigned*)p2p_list.data(), (unsigned long long*)p2p_spans.data(),
                           (unsigned*)next.data(), (unsigned long long*)next_span.data(),
                           (unsigned*)retry[from_list].data(), &listed[from_list], &problems);
                };
                for (unsigned c = first; c < first + count; c += chunk) {
                    walk(0, c, std::min(chunk, first + count - c), short_queue);
                }
                retried += listed[0];
                for (unsigned c = 0; c < listed[0]; c += retry_chunk) {
                    walk(1, c, std::min(retry_chunk, listed[0] - c), long_queue);
                }
                problems += listed[1];
            };
            pass(0);
            if (cache_room > 0) {
                kept += (unsigned)std::count_if(cache_len.begin(), cache_len.begin() + count,
                                                [](uint32_t n) { return n != WALK_UNCACHED; });
            }
            for (unsigned i = 0; i < 3; ++i) {
                launch(1, 64, radix_offsets, (unsigned*)counts.data() + i * stride, stride);
            }
            m2l_list.resize(m2l_base + counts[count]);
            p2p_list.resize(p2p_base + counts[stride + count]);
            next.resize(std::max(1u, counts[2 * stride + count]));
            pass(1);
            m2l_base += counts[count];
            p2p_base += counts[stride + count];
        }
        uint32_t totals[5] = {problems, retried, m2l_base, p2p_base, kept};
        std::fwrite(totals, 4, 5, out);
        put(out, m2l_spans);
        put(out, p2p_spans);
        put(out, pairs);
        put(out, m2l_list);
        put(out, p2p_list);
    } else if (mode == "runs") {
        auto n = in.one<uint32_t>(), block = in.one<uint32_t>();
        auto keys = in.many<uint64_t>(n);
        auto id = in.many<uint64_t>(n);
        auto index = in.many<uint32_t>(n);
        uint32_t problems = 0;
        launch(std::max(1u, (n + block - 1) / block), block, order_equal_runs,
               (const unsigned long long*)keys.data(), (const unsigned long long*)id.data(),
               (unsigned)n, (unsigned*)index.data(), (unsigned*)&problems);
        std::fwrite(&problems, 4, 1, out);
        put(out, index);
    } else if (mode == "split") {
        auto n = in.one<uint32_t>(), leaf_size = in.one<uint32_t>();
        auto block = in.one<uint32_t>(), scan_blocks = in.one<uint32_t>();
        auto keys = in.many<uint64_t>(n);
        auto order = in.many<uint32_t>(n);
        std::vector<uint64_t> scan(SCAN_VALUES, 0);
        launch(scan_blocks, SCAN_THREADS, sort_scan, (const unsigned long long*)keys.data(),
               (const unsigned*)order.data(), (unsigned)n, (unsigned long long*)scan.data());
        // The root; the columns grow level by level as the device's buffers do.
        std::vector<uint32_t> begin{0}, end{n}, first_child{0}, child_count{0}, parent{0};
        std::vector<uint32_t> level_start{0};
        unsigned first = 0, level = 0;
        for (;;) {
            unsigned count = (unsigned)begin.size() - first;
            std::vector<uint32_t> counts(count + 1, 0);
            unsigned grid = std::max(1u, (count + block - 1) / block);
            launch(grid, block, split_count, first, count, level, leaf_size,
                   (const unsigned long long*)keys.data(), (const unsigned*)begin.data(),
                   (const unsigned*)end.data(), (unsigned*)counts.data());
            launch(1, 64, radix_offsets, (unsigned*)counts.data(), count + 1);
            unsigned children = counts[count];
            size_t cells = begin.size() + children;
            for (auto* column : {&begin, &end, &first_child, &child_count, &parent}) {
                column->resize(cells, 0xdeadbeefu);  // split_write must set every one
            }
            launch(grid, block, split_write, first, count, level, leaf_size,
                   (const unsigned long long*)keys.data(), (const unsigned*)counts.data(),
                   (unsigned*)begin.data(), (unsigned*)end.data(), (unsigned*)first_child.data(),
                   (unsigned*)child_count.data(), (unsigned*)parent.data());
            if (children == 0) break;
            first += count;
            level_start.push_back(first);
            ++level;
        }
        level_start.push_back((uint32_t)begin.size());
        uint32_t sizes[2] = {(uint32_t)level_start.size() - 1, (uint32_t)begin.size()};
        put(out, scan);
        std::fwrite(sizes, 4, 2, out);
        put(out, level_start);
        put(out, begin);
        put(out, end);
        put(out, first_child);
        put(out, child_count);
        put(out, parent);
    } else {
        std::fprintf(stderr, "harness: unknown mode %s\n", argv[1]);
        return 2;
    }
    std::fclose(out);
    return 0;
}
