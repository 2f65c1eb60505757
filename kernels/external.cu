// Rigid external potentials on the device (src/gravity/external.rs, whose host code they
// follow operation for operation): each term's acceleration added to the particles' and
// the energy Σ m Φ_ext summed per chunk as the diagnostics' sums are. f64, one thread per
// particle (per chunk for the energy).
//
// A term is EXTERNAL_TERM doubles: its form (0 NFW, 1 Hernquist, 2 Plummer,
// 3 Miyamoto–Nagai, 4 logarithmic), three parameters (G M, scale, second scale; for the
// logarithmic form v0², r_c², q²) and its centre at the evaluation's time
// (`ExternalPotential::device_terms` writes them, the host having moved the centres).

#define EXTERNAL_TERM 7

// Acceleration and potential of the terms at x.
__device__ inline void external_at(const double* __restrict__ terms, unsigned count,
                                   const double x[3], double a[3], double* phi) {
    a[0] = a[1] = a[2] = 0.0;
    *phi = 0.0;
    for (unsigned k = 0; k < count; ++k) {
        const double* term = terms + EXTERNAL_TERM * k;
        const int form = (int)term[0];
        const double p0 = term[1], p1 = term[2], p2 = term[3];
        double d[3];
        for (int c = 0; c < 3; ++c) d[c] = __dsub_rn(x[c], term[4 + c]);
        const double r2 = __dadd_rn(__dadd_rn(__dmul_rn(d[0], d[0]), __dmul_rn(d[1], d[1])),
                                    __dmul_rn(d[2], d[2]));
        double g_over_r = 0.0, pot = 0.0;
        double z_factor = 1.0;
        if (form == 2) {  // Plummer: p0 = G M, p1 = a.
            const double s2 = __dadd_rn(r2, __dmul_rn(p1, p1));
            const double s = sqrt(s2);
            g_over_r = p0 / __dmul_rn(s2, s);
            pot = -p0 / s;
        } else if (form == 1) {  // Hernquist.
            const double r = sqrt(r2);
            const double ra = __dadd_rn(r, p1);
            g_over_r = r > 0.0 ? p0 / __dmul_rn(__dmul_rn(r, ra), ra) : 0.0;
            pot = -p0 / ra;
        } else if (form == 0) {  // NFW: p1 = r_s.
            const double r = sqrt(r2);
            const double xs = r / p1;
            if (xs < 1e-4) {
                const double enclosed =
                    __dmul_rn(__dmul_rn(xs, xs),
                              __dsub_rn(0.5, __dmul_rn(xs, __dsub_rn(2.0 / 3.0, __dmul_rn(0.75, xs)))));
                g_over_r = r > 0.0 ? __dmul_rn(p0, enclosed) / __dmul_rn(r2, r) : 0.0;
                pot = __dmul_rn(-p0 / p1, __dsub_rn(1.0, __dmul_rn(xs, __dsub_rn(0.5, xs / 3.0))));
            } else {
                const double l = log1p(xs);
                const double enclosed = __dsub_rn(l, xs / __dadd_rn(1.0, xs));
                g_over_r = __dmul_rn(p0, enclosed) / __dmul_rn(r2, r);
                pot = __dmul_rn(-p0, l) / r;
            }
        } else if (form == 3) {  // Miyamoto–Nagai: p1 = a, p2 = b.
            const double zeta = sqrt(__dadd_rn(__dmul_rn(d[2], d[2]), __dmul_rn(p2, p2)));
            const double az = __dadd_rn(p1, zeta);
            const double s2 = __dadd_rn(__dadd_rn(__dmul_rn(d[0], d[0]), __dmul_rn(d[1], d[1])),
                                        __dmul_rn(az, az));
            const double s = sqrt(s2);
            g_over_r = p0 / __dmul_rn(s2, s);
            z_factor = az / zeta;
            pot = -p0 / s;
        } else {  // Logarithmic: p0 = v0², p1 = r_c², p2 = q².
            const double s = __dadd_rn(__dadd_rn(__dadd_rn(p1, __dmul_rn(d[0], d[0])),
                                                 __dmul_rn(d[1], d[1])),
                                       __dmul_rn(d[2], d[2]) / p2);
            g_over_r = p0 / s;
            pot = __dmul_rn(__dmul_rn(0.5, p0), log(s));
        }
        a[0] = __dadd_rn(a[0], -__dmul_rn(g_over_r, d[0]));
        a[1] = __dadd_rn(a[1], -__dmul_rn(g_over_r, d[1]));
        // Miyamoto–Nagai and the logarithmic form pull along z by their own factor.
        double az_term = __dmul_rn(g_over_r, d[2]);
        if (form == 3) az_term = __dmul_rn(az_term, z_factor);
        if (form == 4) az_term = az_term / p2;
        a[2] = __dadd_rn(a[2], -az_term);
        *phi = __dadd_rn(*phi, pot);
    }
}

// acc[i] += the terms' acceleration at pos[i], for the k-th of `count` particles:
// the particle of row rows[k] when `listed` (a block sub-step's active ones), else the k-th.
extern "C" __global__ void add_external(const double* __restrict__ pos, double* __restrict__ acc,
                                        const double* __restrict__ terms, unsigned term_count,
                                        const unsigned* __restrict__ rows,
                                        unsigned listed, unsigned count) {
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < count) {
        const unsigned i = listed ? rows[k] : k;
        const double x[3] = {pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]};
        double a[3], phi;
        external_at(terms, term_count, x, a, &phi);
        for (int c = 0; c < 3; ++c) acc[3 * i + c] = __dadd_rn(acc[3 * i + c], a[c]);
    }
}

// Particles per chunk of the energy sum (src/sum.rs: CHUNK).
#define EXTERNAL_SUM_CHUNK 4096

// partial[c]: Σ m Φ_ext over chunk c's particles, summed in order as sum_indexed does on
// the host; the host adds the chunks in order.
extern "C" __global__ void external_energy_chunks(const double* __restrict__ pos,
                                                  const double* __restrict__ mass, unsigned n,
                                                  const double* __restrict__ terms,
                                                  unsigned term_count,
                                                  double* __restrict__ partial) {
    const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lo = c * EXTERNAL_SUM_CHUNK;
    if (lo >= n) return;
    const unsigned hi = min(lo + EXTERNAL_SUM_CHUNK, n);
    double sum = 0.0;
    for (unsigned i = lo; i < hi; ++i) {
        const double x[3] = {pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]};
        double a[3], phi;
        external_at(terms, term_count, x, a, &phi);
        sum = __dadd_rn(sum, __dmul_rn(mass[i], phi));
    }
    partial[c] = sum;
}
