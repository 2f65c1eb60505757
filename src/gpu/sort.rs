//! The host's side of the device's tree order (kernels/keys.cu) and cell moments
//! (kernels/moments.cu): the launch shapes of the bounds, key, radix-sort and moments
//! kernels, the cube made of the blocks' extremes, and the device memory they keep. Free
//! of CUDA, so the emulation tests use the same functions as the device code.

use crate::fmm::morton::BoundingCube;

/// Values `bounds_blocks` writes per block: three minima, three maxima, a non-finite flag.
pub const BOUNDS_FIELDS: usize = 7;
/// Threads of a `bounds_blocks` block (a power of two, at most `BOUNDS_MAX_THREADS` = 256).
pub const BOUNDS_THREADS: u32 = 256;
/// Blocks of `bounds_blocks` (they stride over the particles): enough to fill a device,
/// few enough to reduce on the host at once.
pub const BOUNDS_BLOCKS: u32 = 1024;
/// Threads of a radix-sort block (`RADIX_THREADS` in keys.cu: one per digit value).
pub const RADIX_THREADS: u32 = 256;
/// Records per radix-sort block (`RADIX_TILE` in keys.cu).
pub const RADIX_TILE: usize = 256 * 16;
/// Bits per radix-sort pass; the passes cover the 64 bits of a key.
pub const RADIX_BITS: u32 = 8;
/// Threads of the one `radix_offsets` block.
pub const OFFSETS_THREADS: u32 = 1024;
/// Threads of an `ancestor_r2` block (`ANCESTOR_THREADS` in moments.cu): consecutive
/// particles going up their ancestors together.
pub const ANCESTOR_THREADS: u32 = 256;
/// Targets of one `walk_level` launch over a level's cells: each thread has a ring of
/// `WALK_SHORT_QUEUE` opened sources (walk.cu). More threads than an H200 holds at once
/// (132 SMs of 4 blocks of 128 at the kernel's 116 registers), and more than the largest
/// level of disk-in-halo at 1e7 (~50000 cells): the walk is latency-bound.
pub const WALK_CHUNK: usize = 131_072;
/// Entries of the ring of a target in a launch over a level's cells. A target that needs
/// more is launched again with `WALK_QUEUE` (1024 was too few for 18 targets of the Milky
/// Way model's first step at 1e7, of 330000).
pub const WALK_SHORT_QUEUE: usize = 1024;
/// Targets of one `walk_level` launch of the targets whose short rings filled up.
pub const WALK_RETRY_CHUNK: usize = 8192;
/// Entries of the ring of a target launched again (4096 was too few for 2 targets of the
/// Milky Way model's fourth step at 1e7); one that needs more is the host's to walk.
pub const WALK_QUEUE: usize = 16384;
/// Entries (M2L, P2P and deferred sources together) the counting pass of a level keeps per
/// target, so that its writing pass copies them instead of walking again; a target with
/// more walks again. Room for a level's targets: 2 KiB each. On disk-in-halo at 1e6
/// (default settings, emulated) 512 keep 99.8% of the targets' entries, 256 89%, 128 50%.
pub const WALK_CACHE: usize = 512;

/// Threads of a `sort_scan` block (`SCAN_THREADS` in split.cu).
pub const SCAN_THREADS: u32 = 256;
/// Blocks of `sort_scan` (they stride over the sorted records).
pub const SCAN_BLOCKS: u32 = 256;
/// Values `sort_scan` writes (`SCAN_VALUES` in split.cu): `SortSummary`'s fields in order.
pub const SCAN_VALUES: usize = 5;

/// Slots for the levels' first cells (levels + 1 values): more than a tree of 21-bit keys
/// can have (22 levels).
pub const LEVEL_SLOTS: usize = 32;

// What the kernels assume of these shapes: a pass sorts on one digit value per thread, and
// the block reductions and scan halve power-of-two blocks of at most 1024 threads.
const _: () = assert!(1 << RADIX_BITS == RADIX_THREADS);
const _: () = assert!(BOUNDS_THREADS.is_power_of_two() && OFFSETS_THREADS.is_power_of_two());
const _: () = assert!(OFFSETS_THREADS <= 1024);
const _: () = assert!(ANCESTOR_THREADS.is_power_of_two() && SCAN_THREADS.is_power_of_two());
const _: () = assert!(WALK_QUEUE.is_power_of_two() && WALK_SHORT_QUEUE.is_power_of_two());

/// Blocks of a radix-sort pass over `n` records.
pub fn sort_blocks(n: usize) -> usize {
    n.div_ceil(RADIX_TILE).max(1)
}

/// The bounding cube of the particles from the extremes `bounds_blocks` wrote
/// (`BOUNDS_FIELDS` per block), the one `Tree::bounding_cube` makes of the same positions;
/// `None` when a block saw a position or mass that is not finite.
pub fn cube_of_bounds(blocks: &[f64]) -> Option<BoundingCube> {
    let (mut lo, mut hi) = ([f64::MAX; 3], [f64::MIN; 3]);
    for block in blocks.chunks_exact(BOUNDS_FIELDS) {
        if block[6] != 0.0 {
            return None;
        }
        for k in 0..3 {
            lo[k] = lo[k].min(block[k]);
            hi[k] = hi[k].max(block[3 + k]);
        }
    }
    Some(BoundingCube::around(lo, hi))
}

/// Bytes of device memory the tree-order sort of `particles` particles keeps between
/// steps: keys and indices twice (the radix sort's two sides), the positions and masses in
/// sorted order, the digit counts of a pass, the blocks' extremes, the checks' sums and a
/// count of runs of equal keys too long to order.
pub fn sort_bytes(particles: usize) -> usize {
    let n = particles;
    2 * (8 + 4) * n
        + (3 + 1) * 8 * n
        + 4 * RADIX_THREADS as usize * sort_blocks(n)
        + 8 * BOUNDS_FIELDS * BOUNDS_BLOCKS as usize
        + 8 * SCAN_VALUES
        + 4
}

/// Bytes of device memory the cell moments (`GpuFmm::cell_moments`) keep for a tree of
/// `cells` cells over `particles` particles: the leaf of each particle; per cell its
/// particle range, first child, child count, parent, a leaf slot and a count of the split
/// (u32 each), its mass, centre, squared radius and the five values that go back (f64
/// each); the levels' first cells; and for block steps (`GpuFmm::cells_holding`, made only
/// for them, so the figure is a bound) at most a row and a mark per particle and a flag
/// per cell.
pub fn moments_bytes(particles: usize, cells: usize) -> usize {
    (4 + 4 + 1) * particles + (7 * 4 + 1 + (1 + 3 + 1 + 5) * 8) * cells + 4 * LEVEL_SLOTS
}

/// Bytes of device memory the rings of the `walk_level` launches take at the most (512 MiB:
/// a launch of `WALK_CHUNK` targets; a smaller tree's launches take less): launches run one
/// after another, so they share them.
pub const WALK_RING_BYTES: usize =
    4 * max(WALK_CHUNK * WALK_SHORT_QUEUE, WALK_RETRY_CHUNK * WALK_QUEUE);

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// Bytes of device memory the walk (`GpuFmm::walk`) keeps per tree of `cells` cells besides
/// its lists (which replace the evaluation's), the sources handed from level to level and
/// the rings (`WALK_RING_BYTES`): per cell its P2P pairs, two spans of deferred sources,
/// three counts, two slots of the lists of targets launched again and one of the list of
/// targets a block sub-step walks for; and, at most (they are sized for the largest
/// level), its `WALK_CACHE` kept entries and their number.
pub fn walk_bytes(cells: usize) -> usize {
    (8 + 2 * 8 + 3 * 4 + 3 * 4 + 4 * WALK_CACHE + 4) * cells
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME value` in the embedded kernel file `file`.
    fn define<T: std::str::FromStr>(file: &str, name: &str) -> T {
        let (_, text) = crate::gpu::SOURCES
            .iter()
            .find(|(f, _)| *f == file)
            .expect("an embedded kernel file");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no numeric #define {name} in {file}"))
    }

    #[test]
    fn launch_shapes_match_the_kernels_constants() {
        assert_eq!(
            u64::from(RADIX_THREADS),
            define::<u64>("keys.cu", "RADIX_THREADS")
        );
        assert_eq!(
            RADIX_TILE as u64,
            define::<u64>("keys.cu", "RADIX_THREADS") * define::<u64>("keys.cu", "RADIX_ITEMS")
        );
        assert!(u64::from(BOUNDS_THREADS) <= define::<u64>("keys.cu", "BOUNDS_MAX_THREADS"));
        assert_eq!(
            u64::from(crate::gpu::memory::M2L_THREADS),
            define::<u64>("expansions.cu", "M2L_THREADS")
        );
        assert_eq!(
            u64::from(crate::gpu::memory::TRANSLATE_THREADS),
            define::<u64>("expansions.cu", "TRANSLATE_THREADS")
        );
        assert!(
            u64::from(crate::gpu::memory::P2P_THREADS) <= define::<u64>("p2p.cu", "P2P_MAX_BLOCK")
                && crate::gpu::memory::P2P_THREADS.is_power_of_two()
        );
        assert_eq!(
            crate::gpu::memory::M2L_SMALL_ORDER as u64,
            define::<u64>("expansions.cu", "M2L_SMALL_ORDER")
        );
        assert_eq!(
            crate::gpu::memory::M2L_ROTATED_ORDER as u64,
            define::<u64>("m2l_rotated.cu", "M2L_ROTATED_ORDER")
        );
        assert_eq!(
            u64::from(crate::gpu::memory::M2L_ROTATED_THREADS),
            define::<u64>("m2l_rotated.cu", "M2L_ROTATED_THREADS")
        );
        assert_eq!(
            u64::from(ANCESTOR_THREADS),
            define::<u64>("moments.cu", "ANCESTOR_THREADS")
        );
        assert_eq!(
            u64::from(SCAN_THREADS),
            define::<u64>("split.cu", "SCAN_THREADS")
        );
        assert_eq!(SCAN_VALUES as u64, define::<u64>("split.cu", "SCAN_VALUES"));
        assert_eq!(
            u64::from(crate::fmm::morton::MAX_LEVEL),
            define::<String>("split.cu", "SPLIT_MAX_LEVEL")
                .trim_end_matches('u')
                .parse::<u64>()
                .unwrap()
        );
        assert_eq!(
            crate::fmm::traversal::MAC_BAND,
            define::<f64>("walk.cu", "WALK_MAC_BAND")
        );
    }
}
