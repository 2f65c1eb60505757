//! M2M and L2L as tables of their terms: `expansion::m2m` and `expansion::l2l` walk the
//! same sums with index arithmetic and a branch per coefficient for the real-source
//! symmetry of negative orders; here each term's two coefficient indices and sign changes
//! are listed once per order, so the loop is two sign flips and two complex multiply–adds,
//! on `M2L_LANES` expansions at once (a parent's children, or one parent's local for its
//! children). The same products are added in the same order (a sign change is exact), so
//! the bits are those of the free functions (a test in `lanes` checks every build).

use super::{M2L_LANES, V, cidx};

/// Negate the real part of a coefficient.
const NEG_RE: u8 = 1;
/// Negate the imaginary part.
const NEG_IM: u8 = 2;

/// One term `a(k, l) · conj(R(d, l'))` of a shift: the complex indices of the two
/// coefficients (of order |l| and |l'|) and the sign changes that give the negative orders
/// and the conjugate.
#[derive(Debug, Clone, Copy)]
struct Term {
    a: u16,
    r: u16,
    a_signs: u8,
    r_signs: u8,
}

/// The terms of one shift operator at one order, output coefficient by output coefficient.
#[derive(Debug, Clone, Default)]
pub(super) struct ShiftTable {
    terms: Vec<Term>,
    /// One past each output coefficient's last term, in coefficient order.
    ends: Vec<u32>,
}

/// The signs `expansion::get` applies to coefficient (n, m) for m < 0.
fn symmetry(m: isize) -> u8 {
    match (m >= 0, m % 2 == 0) {
        (true, _) => 0,
        (false, true) => NEG_IM,
        (false, false) => NEG_RE,
    }
}

fn term(k: usize, l: isize, d: usize, l_r: isize) -> Term {
    Term {
        a: cidx(k, l.unsigned_abs()) as u16,
        r: cidx(d, l_r.unsigned_abs()) as u16,
        a_signs: symmetry(l),
        // The regular harmonic is conjugated.
        r_signs: symmetry(l_r) ^ NEG_IM,
    }
}

impl ShiftTable {
    /// M2M of order `p`: output (n, m) sums child (k, l) · conj(R(n − k, m − l)).
    pub(super) fn m2m(p: usize) -> Self {
        Self::build(p, |n, m, terms| {
            for k in 0..=n {
                let j = n - k;
                let lo = (m as isize - j as isize).max(-(k as isize));
                let hi = (m as isize + j as isize).min(k as isize);
                terms.extend((lo..=hi).map(|l| term(k, l, j, m as isize - l)));
            }
        })
    }

    /// L2L of order `p`: output (j, i) sums parent (k, l) · conj(R(k − j, l − i)).
    pub(super) fn l2l(p: usize) -> Self {
        Self::build(p, |j, i, terms| {
            for k in j..=p {
                let d = k - j;
                let lo = (i as isize - d as isize).max(-(k as isize));
                let hi = (i as isize + d as isize).min(k as isize);
                terms.extend((lo..=hi).map(|l| term(k, l, d, l - i as isize)));
            }
        })
    }

    fn build(p: usize, mut terms_of: impl FnMut(usize, usize, &mut Vec<Term>)) -> Self {
        let mut table = ShiftTable::default();
        for n in 0..=p {
            for m in 0..=n {
                terms_of(n, m, &mut table.terms);
                table.ends.push(table.terms.len() as u32);
            }
        }
        table
    }

    /// The shift of `M2L_LANES` expansions at once: lane w of `out` (lane rows, as `a` and
    /// `r`: row k holds coefficient k of every lane) is set to the shift of lane w's
    /// expansion in `a` by the offset whose regular harmonics are lane w of `r` — what the
    /// free function adds, the same products summed in the same order, lane by lane in
    /// whole vectors.
    #[inline(always)]
    pub(super) fn apply_lanes(&self, a: &[V], r: &[V], out: &mut [V]) {
        const W: usize = M2L_LANES;
        let sign = |signs: u8, bit: u8| u64::from(signs & bit != 0) << 63;
        let flip = |x: f64, mask: u64| f64::from_bits(x.to_bits() ^ mask);
        let mut first = 0;
        for (c, &end) in self.ends.iter().enumerate() {
            let (mut re, mut im) = ([0.0; W], [0.0; W]);
            for t in &self.terms[first..end as usize] {
                let (ka, kr) = (2 * t.a as usize, 2 * t.r as usize);
                let (a_re, a_im) = (sign(t.a_signs, NEG_RE), sign(t.a_signs, NEG_IM));
                let (r_re, r_im) = (sign(t.r_signs, NEG_RE), sign(t.r_signs, NEG_IM));
                let (ar, ai, rr, ri) = (&a[ka], &a[ka + 1], &r[kr], &r[kr + 1]);
                for w in 0..W {
                    let (ar, ai) = (flip(ar[w], a_re), flip(ai[w], a_im));
                    let (rr, ri) = (flip(rr[w], r_re), flip(ri[w], r_im));
                    re[w] += ar * rr - ai * ri;
                    im[w] += ar * ri + ai * rr;
                }
            }
            out[2 * c] = re;
            out[2 * c + 1] = im;
            first = end as usize;
        }
    }
}
