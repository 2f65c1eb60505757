//! Multipole and local expansions in complex solid harmonics (Dehnen's normalisation), real
//! sources only, so coefficients are stored for m >= 0 and m < 0 follows from
//! `C_n^{-m} = (-1)^m conj(C_n^m)`.
//!
//! Regular and irregular solid harmonics:
//!   R_n^m(x) = r^n P_n^m(cos θ) e^{imφ} / (n+m)!,   I_n^m(x) = (n-m)! P_n^m(cos θ) e^{imφ} / r^{n+1}
//! (P_n^m with the Condon–Shortley phase). With them `1/|x-y| = Σ conj(R_n^m(y)) I_n^m(x)` and
//! the translation theorems carry no numerical factors:
//!   multipole  M_n^m = Σ q conj(R_n^m(y)),            Φ(x) = -G Σ M_n^m I_n^m(x)
//!   local      Φ(z + x) = -G Σ conj(R_k^l(x)) L_k^l
//!   M2M        M'_n^m = Σ_{k,l} conj(R_{n-k}^{m-l}(t)) M_k^l
//!   M2L        L_k^l = (-1)^k Σ_{n,m} M_n^m I_{n+k}^{m+l}(R),   truncated at n + k <= p
//!   L2L        L'_j^i = Σ_{k,l} conj(R_{k-j}^{l-i}(s)) L_k^l
//! M2L is done in O(p^3) by rotating the multipole so that R points along z (where only
//! m-preserving terms survive), translating along z, and rotating the local back. The
//! rotation about y is a fixed "swap" rotation, a rotation about z, and the swap undone;
//! the swap matrices are computed once per order.
//!
//! All expansions are G-free; the solver multiplies by G at the end.
//!
//! The lane-batched kernels (the M2L, L2P and P2M the passes call, `M2L_LANES` at once,
//! one build per instruction set) are in `lanes`; the operators, their tables and the swap
//! matrices they share are here.

mod lanes;
mod shift;

pub use lanes::M2L_LANES;
pub(super) use lanes::V;
use lanes::{LaneKernels, select_lane_kernels};
use shift::ShiftTable;

/// Adds lane `w` of the lane rows `rows` (from `Operators::l2l_batch`) to `local`.
pub fn add_lane(rows: &[V], w: usize, local: &mut [f64]) {
    for (sum, row) in local.iter_mut().zip(rows) {
        *sum += row[w];
    }
}

/// Number of stored complex coefficients for order `p` (0 <= m <= n <= p).
pub const fn complex_len(p: usize) -> usize {
    (p + 1) * (p + 2) / 2
}

/// Number of f64 values one expansion of order `p` occupies (re, im pairs).
pub const fn real_len(p: usize) -> usize {
    2 * complex_len(p)
}

/// Complex index of (n, m), m >= 0.
#[inline(always)]
const fn cidx(n: usize, m: usize) -> usize {
    n * (n + 1) / 2 + m
}

/// Coefficient (n, m) for any m in -n..=n, using the real-source symmetry.
#[inline(always)]
fn get(c: &[f64], n: usize, m: isize) -> (f64, f64) {
    let k = cidx(n, m.unsigned_abs());
    let (re, im) = (c[2 * k], c[2 * k + 1]);
    if m >= 0 {
        (re, im)
    } else if m % 2 == 0 {
        (re, -im)
    } else {
        (-re, im)
    }
}

/// Regular solid harmonics R_n^m(x) for n <= p, m >= 0, into `out` (len `real_len(p)`).
pub fn regular(p: usize, x: [f64; 3], out: &mut [f64]) {
    let (xr, xi) = (x[0], x[1]);
    let z = x[2];
    let r2 = x[0] * x[0] + x[1] * x[1] + x[2] * x[2];
    out[0] = 1.0;
    out[1] = 0.0;
    for m in 0..=p {
        let d = cidx(m, m);
        if m > 0 {
            let (pr, pi) = (out[2 * cidx(m - 1, m - 1)], out[2 * cidx(m - 1, m - 1) + 1]);
            let f = -1.0 / (2.0 * m as f64);
            out[2 * d] = f * (xr * pr - xi * pi);
            out[2 * d + 1] = f * (xr * pi + xi * pr);
        }
        if m < p {
            let k = cidx(m + 1, m);
            out[2 * k] = z * out[2 * d];
            out[2 * k + 1] = z * out[2 * d + 1];
        }
        for n in m + 2..=p {
            let k = cidx(n, m);
            let (a, b) = (cidx(n - 1, m), cidx(n - 2, m));
            let inv = 1.0 / (((n - m) * (n + m)) as f64);
            let c1 = (2 * n - 1) as f64 * z;
            out[2 * k] = (c1 * out[2 * a] - r2 * out[2 * b]) * inv;
            out[2 * k + 1] = (c1 * out[2 * a + 1] - r2 * out[2 * b + 1]) * inv;
        }
    }
}

/// Irregular solid harmonics I_n^m(x) for n <= p, m >= 0 (x != 0).
pub fn irregular(p: usize, x: [f64; 3], out: &mut [f64]) {
    let (xr, xi) = (x[0], x[1]);
    let z = x[2];
    let r2 = x[0] * x[0] + x[1] * x[1] + x[2] * x[2];
    let inv_r2 = 1.0 / r2;
    out[0] = inv_r2.sqrt();
    out[1] = 0.0;
    for m in 0..=p {
        let d = cidx(m, m);
        if m > 0 {
            let (pr, pi) = (out[2 * cidx(m - 1, m - 1)], out[2 * cidx(m - 1, m - 1) + 1]);
            let f = -((2 * m - 1) as f64) * inv_r2;
            out[2 * d] = f * (xr * pr - xi * pi);
            out[2 * d + 1] = f * (xr * pi + xi * pr);
        }
        if m < p {
            let k = cidx(m + 1, m);
            let f = (2 * m + 1) as f64 * z * inv_r2;
            out[2 * k] = f * out[2 * d];
            out[2 * k + 1] = f * out[2 * d + 1];
        }
        for n in m + 2..=p {
            let k = cidx(n, m);
            let (a, b) = (cidx(n - 1, m), cidx(n - 2, m));
            let c1 = (2 * n - 1) as f64 * z;
            let c2 = ((n - 1) * (n - 1) - m * m) as f64;
            out[2 * k] = (c1 * out[2 * a] - c2 * out[2 * b]) * inv_r2;
            out[2 * k + 1] = (c1 * out[2 * a + 1] - c2 * out[2 * b + 1]) * inv_r2;
        }
    }
}

/// M2M: adds the child multipole `child`, centred at parent centre + `t`, to `parent`.
pub fn m2m(p: usize, t: [f64; 3], child: &[f64], parent: &mut [f64], scratch: &mut [f64]) {
    regular(p, t, scratch);
    for n in 0..=p {
        for m in 0..=n {
            let (mut re, mut im) = (0.0, 0.0);
            for k in 0..=n {
                let j = n - k;
                let lo = (m as isize - j as isize).max(-(k as isize));
                let hi = (m as isize + j as isize).min(k as isize);
                for l in lo..=hi {
                    let (cr, ci) = get(child, k, l);
                    // conj(R_j^{m-l}(t))
                    let (rr, ri) = get(scratch, j, m as isize - l);
                    let (rr, ri) = (rr, -ri);
                    re += cr * rr - ci * ri;
                    im += cr * ri + ci * rr;
                }
            }
            let c = cidx(n, m);
            parent[2 * c] += re;
            parent[2 * c + 1] += im;
        }
    }
}

/// L2L: adds the parent local expansion `parent`, shifted to parent centre + `s`, to `child`.
pub fn l2l(p: usize, s: [f64; 3], parent: &[f64], child: &mut [f64], scratch: &mut [f64]) {
    regular(p, s, scratch);
    for j in 0..=p {
        for i in 0..=j {
            let (mut re, mut im) = (0.0, 0.0);
            for k in j..=p {
                let d = k - j;
                let lo = (i as isize - d as isize).max(-(k as isize));
                let hi = (i as isize + d as isize).min(k as isize);
                for l in lo..=hi {
                    let (lr, li) = get(parent, k, l);
                    let (rr, ri) = get(scratch, d, l - i as isize);
                    let (rr, ri) = (rr, -ri);
                    re += lr * rr - li * ri;
                    im += lr * ri + li * rr;
                }
            }
            let c = cidx(j, i);
            child[2 * c] += re;
            child[2 * c + 1] += im;
        }
    }
}

/// A sparse real matrix acting on one degree's real coefficient vector
/// `[re_0, im_0, re_1, im_1, ..., re_n, im_n]` (im_0 is always zero).
#[derive(Debug, Clone, Default)]
struct SparseBlock {
    /// (row, col, value) triples, rows ascending.
    entries: Vec<(u16, u16, f64)>,
}

/// A block-diagonal sparse matrix over the whole coefficient vector in compressed rows,
/// so each output row is summed in registers and stored once.
#[derive(Debug, Clone, Default)]
struct SparseRows {
    /// Row r's entries are `col[start[r]..start[r + 1]]`, `val[..]`.
    start: Vec<u32>,
    col: Vec<u16>,
    val: Vec<f64>,
}

impl SparseRows {
    fn new(p: usize, blocks: &[SparseBlock]) -> Self {
        let mut rows: Vec<Vec<(u16, f64)>> = vec![Vec::new(); real_len(p)];
        for (n, b) in blocks.iter().enumerate() {
            let base = 2 * cidx(n, 0);
            for &(r, c, a) in &b.entries {
                rows[base + r as usize].push(((base + c as usize) as u16, a));
            }
        }
        let mut m = SparseRows::default();
        m.start.push(0);
        for row in rows {
            for (c, a) in row {
                m.col.push(c);
                m.val.push(a);
            }
            m.start.push(m.col.len() as u32);
        }
        m
    }
}

/// Precomputed operators for one expansion order.
#[derive(Debug, Clone)]
pub struct Operators {
    p: usize,
    /// T(S) per degree: the multipole transform of the fixed swap rotation S.
    swap: Vec<SparseBlock>,
    /// T(S) and T(S^-1), and the local back-transforms W^-1 T(S)^T W and W^-1 T(S^-1)^T W,
    /// The four matrices above over the whole coefficient vector, row by row.
    swap_flat: SparseRows,
    unswap_flat: SparseRows,
    swap_local_flat: SparseRows,
    unswap_local_flat: SparseRows,
    /// (n + k)! for n + k <= p.
    factorial: Vec<f64>,
    /// The lane-batched kernels for this CPU.
    kernels: LaneKernels,
    /// M2M and L2L as lists of their terms.
    m2m_table: ShiftTable,
    l2l_table: ShiftTable,
}

/// The swap rotation S: the cyclic permutation (x, y, z) -> (z, x, y), a proper rotation
/// taking the y axis to the z axis, so that S^-1 Rz(β) S = Ry(β).
fn swap_point(x: [f64; 3]) -> [f64; 3] {
    [x[2], x[0], x[1]]
}

fn unswap_point(x: [f64; 3]) -> [f64; 3] {
    [x[1], x[2], x[0]]
}

impl Operators {
    /// Builds the operators of order `p`, clamped to 1..=MAX_ORDER.
    pub fn new(p: usize) -> Self {
        let p = p.clamp(1, MAX_ORDER);
        let mut factorial = vec![1.0; p + 2];
        for k in 1..factorial.len() {
            factorial[k] = factorial[k - 1] * k as f64;
        }
        let swap: Vec<SparseBlock> = (0..=p).map(|n| rotation_block(p, n, swap_point)).collect();
        let unswap: Vec<SparseBlock> = (0..=p)
            .map(|n| rotation_block(p, n, unswap_point))
            .collect();
        let swap_local: Vec<SparseBlock> = swap.iter().map(local_transpose).collect();
        let unswap_local: Vec<SparseBlock> = unswap.iter().map(local_transpose).collect();
        Operators {
            p,
            swap_flat: SparseRows::new(p, &swap),
            unswap_flat: SparseRows::new(p, &unswap),
            swap_local_flat: SparseRows::new(p, &swap_local),
            unswap_local_flat: SparseRows::new(p, &unswap_local),
            swap,
            factorial,
            kernels: select_lane_kernels(),
            m2m_table: ShiftTable::m2m(p),
            l2l_table: ShiftTable::l2l(p),
        }
    }

    /// Expansion order.
    pub fn order(&self) -> usize {
        self.p
    }

    /// Batched M2M: adds the multipoles `children[w]` (at most `M2L_LANES`), centred at
    /// the parent's centre + `t[w]`, to `parent`, child after child: the bits of `m2m`
    /// called for each in turn, the shifts in whole vectors.
    pub fn m2m_batch(&self, t: &[[f64; 3]; M2L_LANES], children: &[&[f64]], parent: &mut [f64]) {
        let len = real_len(self.p);
        let mut a = [[0.0; M2L_LANES]; real_len(MAX_ORDER)];
        for (w, child) in children.iter().enumerate() {
            for (row, &v) in a.iter_mut().zip(&child[..len]) {
                row[w] = v;
            }
        }
        let mut out = [[0.0; M2L_LANES]; real_len(MAX_ORDER)];
        // SAFETY: the kernels were selected for features this CPU has.
        unsafe { (self.kernels.shift)(&self.m2m_table, t, &a[..len], &mut out[..len], self.p) };
        for (sum, row) in parent[..len].iter_mut().zip(&out[..len]) {
            for v in &row[..children.len()] {
                *sum += v;
            }
        }
    }

    /// Batched L2L: lane w of `rows` (`real_len(p)` lane rows) is set to what `l2l` adds to
    /// a child's local expansion for `parent` shifted by `s[w]` (the same bits); `add_lane`
    /// adds it there.
    pub fn l2l_batch(&self, s: &[[f64; 3]; M2L_LANES], parent: &[f64], rows: &mut [V]) {
        let len = real_len(self.p);
        let mut a = [[0.0; M2L_LANES]; real_len(MAX_ORDER)];
        for (row, &v) in a.iter_mut().zip(&parent[..len]) {
            *row = [v; M2L_LANES];
        }
        // SAFETY: the kernels were selected for features this CPU has.
        unsafe { (self.kernels.shift)(&self.l2l_table, s, &a[..len], &mut rows[..len], self.p) };
    }

    /// Total non-zeros of the swap matrices (for cost reports and tests).
    pub fn swap_nonzeros(&self) -> usize {
        self.swap.iter().map(|b| b.entries.len()).sum()
    }

    /// The swap matrices as CUDA code: kernels/rotations.cuh is this text at order
    /// `gpu::memory::M2L_ROTATED_ORDER` (tests/gpu_kernels.rs checks that it is current). For
    /// each degree n, `Rotation<n>` has `swap`, `unswap`, `swap_local` and `unswap_local`,
    /// each mapping the degree's 2n + 2 values (re, im of m = 0..n) `v` to `o` in
    /// straight-line code: each row's non-zeros fused in column order from zero, as
    /// `apply_lanes` sums them (an entry of ±1 as an exact sum or difference), so the device
    /// does the CPU's rotation with no zero term. The other entries' values, each distinct
    /// one once, are a `__constant__` table: the device's multiply-adds read them from
    /// there (a 64-bit literal would take two instructions to load each time).
    pub fn rotation_source(&self) -> String {
        use std::fmt::Write;
        let matrices = [
            ("swap", &self.swap_flat),
            ("unswap", &self.unswap_flat),
            ("swap_local", &self.swap_local_flat),
            ("unswap_local", &self.unswap_local_flat),
        ];
        let mut values: Vec<f64> = Vec::new();
        let mut slot = |v: f64| match values.iter().position(|x| x.to_bits() == v.to_bits()) {
            Some(i) => i,
            None => {
                values.push(v);
                values.len() - 1
            }
        };
        let mut body = String::new();
        for n in 0..=self.p {
            let base = 2 * cidx(n, 0);
            let _ = writeln!(body, "\ntemplate <>\nstruct Rotation<{n}> {{");
            for (name, m) in matrices {
                let _ = writeln!(
                    body,
                    "    static __device__ __forceinline__ void {name}(const double* v, double* o) {{"
                );
                for row in 0..2 * n + 2 {
                    let r = base + row;
                    let mut expr = String::from("0.0");
                    for e in m.start[r] as usize..m.start[r + 1] as usize {
                        let col = m.col[e] as usize - base;
                        let first = expr == "0.0";
                        expr = match m.val[e] {
                            1.0 if first => format!("v[{col}]"),
                            -1.0 if first => format!("-v[{col}]"),
                            1.0 => format!("({expr} + v[{col}])"),
                            -1.0 => format!("({expr} - v[{col}])"),
                            a => format!("fma(ROTATION_VALUES[{}], v[{col}], {expr})", slot(a)),
                        };
                    }
                    let _ = writeln!(body, "        o[{row}] = {expr};");
                }
                let _ = writeln!(body, "    }}");
            }
            let _ = writeln!(body, "}};");
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "// The swap rotations of the rotation-based M2L (kernels/m2l_rotated.cu), degrees 0 to {}:\n\
             // GENERATED by Operators::rotation_source (src/fmm/expansion.rs), do not edit by hand;\n\
             // LEAPFMM_BLESS=1 cargo test --release --test gpu_kernels rotations rewrites it.\n\
             #pragma once\n\n\
             // The matrices' entries other than ±1, each distinct value once.\n\
             __constant__ double ROTATION_VALUES[{}] = {{",
            self.p,
            values.len()
        );
        for chunk in values.chunks(4) {
            let line: Vec<String> = chunk.iter().map(|v| format!("{v:e}")).collect();
            let _ = writeln!(s, "    {},", line.join(", "));
        }
        let _ = writeln!(s, "}};\n\ntemplate <int N>\nstruct Rotation;");
        s + &body
    }

    /// The swap matrices degree by degree as straight-line Rust: `d{n}_{name}(v, o)` maps
    /// the degree's `2n + 2` lane rows, and `apply_degree::<N>` picks one by degree and
    /// matrix (a rotation keeps the degree, and a degree's block is the same at any order).
    fn degree_source(&self) -> String {
        use std::fmt::Write;
        let matrices = [
            ("Swap", "swap", &self.swap_flat),
            ("Unswap", "unswap", &self.unswap_flat),
            ("SwapLocal", "swap_local", &self.swap_local_flat),
            ("UnswapLocal", "unswap_local", &self.unswap_local_flat),
        ];
        let mut s = String::from(
            "\n/// `o = M v` lane by lane for matrix `which` on the rows of degree `N`, in\n\
             /// straight-line code; false when degree `N` has none here.\n\
             #[inline(always)]\n\
             pub(super) fn apply_degree<const N: usize>(which: SwapMatrix, v: &[V], o: &mut [V]) -> bool {\n    \
             match (N, which) {\n",
        );
        for n in 0..=self.p {
            for (variant, name, _) in matrices {
                let _ = writeln!(
                    s,
                    "        ({n}, SwapMatrix::{variant}) => d{n}_{name}(v, o),"
                );
            }
        }
        s.push_str("        _ => return false,\n    }\n    true\n}\n");
        for n in 0..=self.p {
            let base = 2 * cidx(n, 0);
            let dim = 2 * n + 2;
            for (_, name, m) in matrices {
                let _ = writeln!(
                    s,
                    "\n#[inline(always)]\nfn d{n}_{name}(v: &[V], o: &mut [V]) {{\n    \
                     let v: &[V; {dim}] = v[..{dim}].try_into().expect(\"{dim} rows\");\n    \
                     let o: &mut [V; {dim}] = (&mut o[..{dim}]).try_into().expect(\"{dim} rows\");\n    \
                     for w in 0..M2L_LANES {{"
                );
                for r in 0..dim {
                    let mut expr = String::from("0.0");
                    for e in m.start[base + r] as usize..m.start[base + r + 1] as usize {
                        expr = format!(
                            "f64::mul_add({:?}, v[{}][w], {expr})",
                            m.val[e],
                            m.col[e] as usize - base
                        );
                    }
                    let _ = writeln!(s, "        o[{r}][w] = {expr};");
                }
                let _ = writeln!(s, "    }}\n}}");
            }
        }
        s
    }

    /// Batched M2L: adds to `local` the local expansions, about one target centre, of up to
    /// `M2L_LANES` multipoles at offsets `r[i]` = target centre − source centre (truncated
    /// at total order p). Every lane runs the same operation sequence, so the batch
    /// vectorises across lanes; unused lanes must have an all-zero multipole.
    pub fn m2l_batch(
        &self,
        r: &[[f64; 3]; M2L_LANES],
        multipoles: &[&[f64]; M2L_LANES],
        local: &mut [f64],
    ) {
        // SAFETY: the kernels were selected for features this CPU has.
        unsafe { (self.kernels.m2l)(self, r, multipoles, local, self.p) }
    }

    /// Batched L2P: for each of `M2L_LANES` offsets `x` from the expansion centre, the
    /// potential factor and acceleration factors `[pot, ax, ay, az]` (potential `-G pot`,
    /// acceleration `G a`). Unused lanes may hold any finite offset.
    pub fn l2p_batch(&self, x: &[[f64; 3]; M2L_LANES], local: &[f64]) -> [[f64; 4]; M2L_LANES] {
        // SAFETY: the kernels were selected for features this CPU has.
        unsafe { (self.kernels.l2p)(x, local, self.p) }
    }

    /// Batched P2M: adds the multipole of up to `M2L_LANES` point masses `q` at offsets `y`
    /// from the expansion centre (unused lanes: `q = 0`).
    pub fn p2m_batch(
        &self,
        y: &[[f64; 3]; M2L_LANES],
        q: &[f64; M2L_LANES],
        multipole: &mut [f64],
    ) {
        // SAFETY: the kernels were selected for features this CPU has.
        unsafe { (self.kernels.p2m)(y, q, multipole, self.p) }
    }
}

/// The four swap matrices of the rotation-based M2L.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SwapMatrix {
    /// T(S).
    Swap,
    /// T(S^-1).
    Unswap,
    /// W^-1 T(S)^T W (on local coefficients).
    SwapLocal,
    /// W^-1 T(S^-1)^T W.
    UnswapLocal,
}

/// Degrees whose swap matrices `swap_lanes` holds as straight-line code (past it,
/// `swap_degree` goes through the sparse rows; the code grows as the degree squared).
pub const STRAIGHT_LINE_ORDER: usize = 9;

/// The text of src/fmm/swap_lanes.rs: `Operators::degree_source` for degrees 0 to
/// `STRAIGHT_LINE_ORDER`.
pub fn swap_lanes_source() -> String {
    let mut s = String::from(
        "//! The swap rotations of the CPU's M2L (`expansion::lanes`) as straight-line code,\n\
         //! degree by degree, their values inline: GENERATED by `expansion::swap_lanes_source`,\n\
         //! do not edit by hand; `LEAPFMM_BLESS=1 cargo test --release --lib swap_lanes` rewrites it.\n\
         // Generated literals: the rotations' values to the last bit, some of them close to\n\
         // named constants.\n\
         #![allow(clippy::approx_constant, clippy::excessive_precision)]\n\n\
         use super::expansion::{M2L_LANES, SwapMatrix, V};\n",
    );
    s.push_str(&Operators::new(STRAIGHT_LINE_ORDER).degree_source());
    s
}

/// Largest supported expansion order.
pub const MAX_ORDER: usize = 12;

/// The real matrix of degree `n` mapping the multipole coefficients of a point to those of
/// the rotated point (`a(rot x) = T a(x)`, `a(x) = conj R_n(x)`), found by solving with
/// 2n+1 sample points and cleaned of rounding-level entries.
fn rotation_block(p: usize, n: usize, rot: fn([f64; 3]) -> [f64; 3]) -> SparseBlock {
    let dim = 2 * n + 1;
    // Real coordinates of degree n: re_0, then (re_m, im_m) for m >= 1.
    let coords = |x: [f64; 3]| -> Vec<f64> {
        let mut r = vec![0.0; real_len(p)];
        regular(p, x, &mut r);
        let base = 2 * cidx(n, 0);
        let mut v = vec![r[base]];
        for m in 1..=n {
            v.push(r[base + 2 * m]);
            v.push(-r[base + 2 * m + 1]); // conj
        }
        v
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    // Solve A^T X = B^T, columns of A = a(x_j), of B = a(rot x_j); then T = X^T.
    let points: Vec<[f64; 3]> = (0..dim).map(|_| [rnd(), rnd(), rnd()]).collect();
    let a_t: Vec<Vec<f64>> = points.iter().map(|&x| coords(x)).collect();
    let b_t: Vec<Vec<f64>> = points.iter().map(|&x| coords(rot(x))).collect();
    let x = solve(a_t, b_t);
    // Map from the (2n+1) coordinates to positions in the (re, im) block of length 2n+2.
    let pos = |i: usize| if i == 0 { 0 } else { i + 1 };
    let mut entries = Vec::new();
    for row in 0..dim {
        for col in 0..dim {
            let t = x[col][row]; // T = X^T
            if t.abs() > 1e-13 {
                entries.push((pos(row) as u16, pos(col) as u16, t));
            }
        }
    }
    SparseBlock { entries }
}

/// Solves `A X = B` (A square, dense) by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let piv = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, piv);
        b.swap(col, piv);
        for row in col + 1..n {
            let f = a[row][col] / a[col][col];
            for k in col..n {
                a[row][k] -= f * a[col][k];
            }
            for k in 0..b[row].len() {
                b[row][k] -= f * b[col][k];
            }
        }
    }
    for col in (0..n).rev() {
        for k in 0..b[col].len() {
            let mut s = b[col][k];
            for j in col + 1..n {
                s -= a[col][j] * b[j][k];
            }
            b[col][k] = s / a[col][col];
        }
    }
    b
}

/// The local back-transform W^-1 T^T W of a multipole transform T. W is the real form of
/// the pairing Σ_m a_m L_m over all m: 1 for m = 0, and for m > 0 +2 on real parts and -2
/// on imaginary parts (the ±m terms add up to 2 Re(a L)).
fn local_transpose(block: &SparseBlock) -> SparseBlock {
    let weight = |i: u16| match i {
        0 | 1 => 1.0,
        i if i % 2 == 0 => 2.0,
        _ => -2.0,
    };
    let mut entries: Vec<(u16, u16, f64)> = block
        .entries
        .iter()
        .map(|&(r, c, a)| (c, r, a * weight(r) / weight(c)))
        .collect();
    entries.sort_by_key(|e| (e.0, e.1));
    SparseBlock { entries }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Scalar reference implementations of the batched kernels.

    /// P2M: adds the multipole of point masses `q` at offsets `y` (from the expansion centre).
    /// `scratch` has length `real_len(p)`.
    pub(super) fn p2m_reference(
        p: usize,
        y: [f64; 3],
        q: f64,
        multipole: &mut [f64],
        scratch: &mut [f64],
    ) {
        regular(p, y, scratch);
        for k in 0..complex_len(p) {
            multipole[2 * k] += q * scratch[2 * k];
            multipole[2 * k + 1] -= q * scratch[2 * k + 1];
        }
    }

    /// L2P: potential factor and acceleration factor at offset `x` from the expansion centre:
    /// the potential is `-G * pot` and the acceleration `G * acc`.
    pub(super) fn l2p_reference(
        p: usize,
        x: [f64; 3],
        local: &[f64],
        scratch: &mut [f64],
    ) -> (f64, [f64; 3]) {
        regular(p, x, scratch);
        // Φ/(-G) = Σ conj(R_k^l) L_k^l over all l; pairs ±l give 2 Re(conj(R) L).
        let mut pot = 0.0;
        for k in 0..=p {
            for l in 0..=k {
                let c = cidx(k, l);
                let v = scratch[2 * c] * local[2 * c] + scratch[2 * c + 1] * local[2 * c + 1];
                pot += if l == 0 { v } else { 2.0 * v };
            }
        }
        // L'_1^i = Σ_{k>=1} Σ_l conj(R_{k-1}^{l-i}(x)) L_k^l for i = 0, 1.
        let mut l10 = 0.0;
        let (mut l11r, mut l11i) = (0.0, 0.0);
        for k in 1..=p {
            let d = k - 1;
            for l in -(k as isize)..=(k as isize) {
                let (lr, li) = get(local, k, l);
                if l.unsigned_abs() <= d {
                    let (rr, ri) = get(scratch, d, l);
                    l10 += lr * rr + li * ri;
                }
                if (l - 1).unsigned_abs() <= d {
                    let (rr, ri) = get(scratch, d, l - 1);
                    l11r += lr * rr + li * ri;
                    l11i += li * rr - lr * ri;
                }
            }
        }
        (pot, [-l11r, -l11i, l10])
    }

    fn cloud(n: usize, scale: f64, seed: u64) -> Vec<([f64; 3], f64)> {
        let mut s = seed;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        (0..n)
            .map(|_| ([scale * rnd(), scale * rnd(), scale * rnd()], 0.5 + rnd()))
            .collect()
    }

    fn direct(sources: &[([f64; 3], f64)], x: [f64; 3]) -> (f64, [f64; 3]) {
        let mut pot = 0.0;
        let mut acc = [0.0; 3];
        for &(y, q) in sources {
            let d = [y[0] - x[0], y[1] - x[1], y[2] - x[2]];
            let r = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
            pot -= q / r;
            for k in 0..3 {
                acc[k] += q * d[k] / (r * r * r);
            }
        }
        (pot, acc)
    }

    fn multipole(p: usize, src: &[([f64; 3], f64)], centre: [f64; 3]) -> Vec<f64> {
        let mut m = vec![0.0; real_len(p)];
        let mut s = vec![0.0; real_len(p)];
        for &(y, q) in src {
            p2m_reference(
                p,
                [y[0] - centre[0], y[1] - centre[1], y[2] - centre[2]],
                q,
                &mut m,
                &mut s,
            );
        }
        m
    }

    /// M2L of one multipole through the batched kernel (other lanes empty).
    fn m2l_one(ops: &Operators, r: [f64; 3], m: &[f64], local: &mut [f64]) {
        let zero = vec![0.0; m.len()];
        let mut rs = [[0.0, 0.0, 1.0]; M2L_LANES];
        rs[0] = r;
        let mut ms: [&[f64]; M2L_LANES] = [&zero; M2L_LANES];
        ms[0] = m;
        ops.m2l_batch(&rs, &ms, local);
    }

    #[test]
    fn a_full_batch_equals_the_sum_of_single_lanes() {
        let p = 5;
        let ops = Operators::new(p);
        let len = real_len(p);
        let ms: Vec<Vec<f64>> = (0..M2L_LANES)
            .map(|i| multipole(p, &cloud(6, 1.0, 10 + i as u64), [0.0; 3]))
            .collect();
        let rs: Vec<[f64; 3]> = (0..M2L_LANES)
            .map(|i| [3.0 + i as f64, -2.0 * i as f64, 4.0 - i as f64])
            .collect();
        let mut batch = vec![0.0; len];
        let refs: [&[f64]; M2L_LANES] = std::array::from_fn(|i| ms[i].as_slice());
        let rr: [[f64; 3]; M2L_LANES] = std::array::from_fn(|i| rs[i]);
        ops.m2l_batch(&rr, &refs, &mut batch);
        let mut single = vec![0.0; len];
        for i in 0..M2L_LANES {
            m2l_one(&ops, rs[i], &ms[i], &mut single);
        }
        let scale = single.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        for c in 0..len {
            assert!(
                (batch[c] - single[c]).abs() < 1e-13 * scale,
                "coefficient {c}"
            );
        }
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    #[test]
    fn multipole_potential_converges() {
        let src = cloud(20, 1.0, 1);
        let x = [3.0, -2.0, 2.5];
        let (exact, _) = direct(&src, x);
        let mut last = f64::MAX;
        for p in [2, 4, 6, 8] {
            let m = multipole(p, &src, [0.0; 3]);
            let mut i = vec![0.0; real_len(p)];
            irregular(p, x, &mut i);
            let mut pot = 0.0;
            for n in 0..=p {
                for mm in -(n as isize)..=(n as isize) {
                    let (a, b) = get(&m, n, mm);
                    let (c, d) = get(&i, n, mm);
                    pot -= a * c - b * d;
                }
            }
            let e = rel(pot, exact);
            assert!(e < last * 0.5, "p={p}: {e} vs previous {last}");
            last = e;
        }
        assert!(last < 1e-6, "{last}");
    }

    #[test]
    fn full_pipeline_matches_direct_and_converges() {
        // Sources around (0,0,0) via two children (M2M), targets around R via L2L and L2P.
        let src = cloud(30, 1.0, 2);
        let targets = cloud(5, 0.8, 3);
        let centre_b = [2.5, 3.1, -2.2];
        let mut last = f64::MAX;
        for p in 1..=10 {
            let ops = Operators::new(p);
            let len = real_len(p);
            let mut scratch = vec![0.0; len];
            // Two child multipoles shifted into the parent at the origin.
            let ca = [0.25, -0.2, 0.1];
            let cb = [-0.2, 0.25, -0.15];
            let (s1, s2) = src.split_at(15);
            let mut parent = vec![0.0; len];
            m2m(p, ca, &multipole(p, s1, ca), &mut parent, &mut scratch);
            m2m(p, cb, &multipole(p, s2, cb), &mut parent, &mut scratch);
            let mut local = vec![0.0; len];
            m2l_one(&ops, centre_b, &parent, &mut local);
            // Shift the local to a child centre, then evaluate.
            let shift = [0.1, -0.1, 0.2];
            let cc = [
                centre_b[0] + shift[0],
                centre_b[1] + shift[1],
                centre_b[2] + shift[2],
            ];
            let mut child = vec![0.0; len];
            l2l(p, shift, &local, &mut child, &mut scratch);
            let mut worst: f64 = 0.0;
            for &(t, _) in &targets {
                let x = [t[0] + cc[0], t[1] + cc[1], t[2] + cc[2]];
                let (pot, acc) = l2p_reference(p, t, &child, &mut scratch);
                let (ep, ea) = direct(&src, x);
                let an = (ea[0] * ea[0] + ea[1] * ea[1] + ea[2] * ea[2]).sqrt();
                let err = ((acc[0] - ea[0]).powi(2)
                    + (acc[1] - ea[1]).powi(2)
                    + (acc[2] - ea[2]).powi(2))
                .sqrt()
                    / an;
                worst = worst.max(err).max(rel(-pot, ep));
            }
            assert!(
                worst < last,
                "p={p}: error {worst} did not fall below {last}"
            );
            last = worst;
        }
        assert!(last < 1e-5, "p=10 error {last}");
    }

    #[test]
    fn m2l_matches_unrotated_sum() {
        // The rotated O(p^3) M2L equals the plain O(p^4) double sum with n + k <= p.
        for p in [1, 3, 6, 9] {
            let ops = Operators::new(p);
            let len = real_len(p);
            let m = multipole(p, &cloud(10, 1.0, 4), [0.0; 3]);
            for r in [
                [3.0, 1.0, -2.0],
                [0.0, 0.0, 4.0],
                [0.0, 0.0, -4.0],
                [-2.0, 0.0, 0.0],
            ] {
                let mut rotated = vec![0.0; len];
                m2l_one(&ops, r, &m, &mut rotated);
                let mut i = vec![0.0; real_len(2 * p)];
                irregular(2 * p, r, &mut i);
                let mut plain = vec![0.0; len];
                for k in 0..=p {
                    for l in 0..=k {
                        let (mut re, mut im) = (0.0, 0.0);
                        for n in 0..=p - k {
                            for mm in -(n as isize)..=(n as isize) {
                                let idx = mm + l as isize;
                                if idx.unsigned_abs() > n + k {
                                    continue;
                                }
                                let (a, b) = get(&m, n, mm);
                                let (c, d) = get(&i, n + k, idx);
                                re += a * c - b * d;
                                im += a * d + b * c;
                            }
                        }
                        let s = if k % 2 == 0 { 1.0 } else { -1.0 };
                        plain[2 * cidx(k, l)] = s * re;
                        plain[2 * cidx(k, l) + 1] = s * im;
                    }
                }
                let scale = plain.iter().fold(0.0f64, |a, x| a.max(x.abs()));
                for c in 0..len {
                    assert!(
                        (rotated[c] - plain[c]).abs() < 1e-12 * scale,
                        "p={p} r={r:?} coefficient {c}: {} vs {}",
                        rotated[c],
                        plain[c]
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;

    #[test]
    fn swap_lanes_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fmm/swap_lanes.rs");
        let text = swap_lanes_source();
        if std::env::var_os("LEAPFMM_BLESS").is_some() {
            std::fs::write(&path, &text).expect("src/fmm/swap_lanes.rs is writable");
        }
        let on_disk = std::fs::read_to_string(&path).expect("src/fmm/swap_lanes.rs exists");
        assert!(
            on_disk == text,
            "src/fmm/swap_lanes.rs is not the CPU's swap matrices; regenerate it with \
             LEAPFMM_BLESS=1 cargo test --release --lib swap_lanes"
        );
    }

    #[test]
    fn batched_p2m_and_l2p_match_the_scalar_references() {
        for p in [1, 4, 7, 12] {
            let ops = Operators::new(p);
            let len = real_len(p);
            let pts: [[f64; 3]; M2L_LANES] = std::array::from_fn(|w| {
                [
                    0.1 * w as f64 - 0.3,
                    0.05 * (w * w) as f64 - 0.2,
                    0.3 - 0.07 * w as f64,
                ]
            });
            let q: [f64; M2L_LANES] = std::array::from_fn(|w| 0.5 + 0.1 * w as f64);
            let mut batched = vec![0.0; len];
            ops.p2m_batch(&pts, &q, &mut batched);
            let mut scalar = vec![0.0; len];
            let mut scratch = vec![0.0; len];
            for w in 0..M2L_LANES {
                tests::p2m_reference(p, pts[w], q[w], &mut scalar, &mut scratch);
            }
            let scale = scalar.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            for c in 0..len {
                assert!(
                    (batched[c] - scalar[c]).abs() <= 1e-14 * scale,
                    "p={p} P2M coefficient {c}"
                );
            }
            let out = ops.l2p_batch(&pts, &scalar);
            for w in 0..M2L_LANES {
                let (pot, a) = tests::l2p_reference(p, pts[w], &scalar, &mut scratch);
                let want = [pot, a[0], a[1], a[2]];
                for k in 0..4 {
                    assert!(
                        (out[w][k] - want[k]).abs() <= 1e-13 * want[k].abs().max(1e-3),
                        "p={p} L2P lane {w} component {k}"
                    );
                }
            }
        }
    }
}
