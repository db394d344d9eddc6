/* The rounds of gpuprof.replay.simulate._in_order, in C (the replay's solver in dependency order).
 *
 * _in_order solves each chain of the graph (a rank's host calls, a stream's activities, as
 * half-items: an item's start, then its end) as far as its outside inputs are final, one stretch
 * at a time, round after round. In numpy each stretch costs a dozen calls whatever its length, and
 * a sync-heavy rank takes thousands of rounds (a 100k-kernel GPT with an `.item()` every few
 * layers: 4,051 rounds, ~60 ms a replay). This file runs the same rounds on the same values with
 * the same floating-point operations in the same order: each chain's cumulative weights summed one
 * after the other as numpy's cumsum sums them, less the chain's first weight; per half a max over
 * its bounds, a subtraction, a running max and an addition (no multiplication, so nothing to
 * contract). It gives the floats the numpy loop gives, bit for bit (tests/test_replay_solve.py
 * holds the two equal). An edge a half does not have is numpy's "no edge" slot there (-inf, which
 * leaves a max as it is), so it is skipped here.
 *
 * Arguments (the Graph's own arrays, float64 / int64, a_first one byte per item):
 *   hv, av       2 n_host + 1 and 2 n_acts + 1 half values, written in place
 *   h_bounds, a_bounds   first item of each chain on its side, then the side's item count
 *   h_gap, h_dur, h_ts, h_bp, h_bpw, h_wait, h_tail           the host calls
 *   a_sgap, a_dur, a_ts, a_launch, a_lat, a_dep, a_depw, a_first   the activities
 * Chains count host chains first, then the streams (simulate._chains's order). Returns the number
 * of rounds, or -1 when a round moves nothing (a cycle: the caller falls back to the windowed
 * passes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { HV, AV, H_BOUNDS, A_BOUNDS, H_GAP, H_DUR, H_TS, H_BP, H_BPW, H_WAIT, H_TAIL,
       A_SGAP, A_DUR, A_TS, A_LAUNCH, A_LAT, A_DEP, A_DEPW, A_FIRST, N_BUF };

/* numpy's maximum: NaN propagates, the first operand kept on ties */
static inline double np_max(double a, double b) { return (a >= b || isnan(a)) ? a : b; }

static PyObject *in_order(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[N_BUF];
    PyObject *result = NULL;
    double *acc = NULL, *tmp = NULL, *top = NULL;
    int64_t *chain_of = NULL, *done = NULL;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
                          &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14], &b[15], &b[16], &b[17],
                          &b[18]))
        return NULL;
    double *hv = (double *)b[HV].buf, *av = (double *)b[AV].buf;
    const int64_t *hb = (const int64_t *)b[H_BOUNDS].buf, *ab = (const int64_t *)b[A_BOUNDS].buf;
    const double *h_gap = b[H_GAP].buf, *h_dur = b[H_DUR].buf, *h_ts = b[H_TS].buf, *h_bpw = b[H_BPW].buf;
    const double *h_tail = b[H_TAIL].buf, *a_sgap = b[A_SGAP].buf, *a_dur = b[A_DUR].buf, *a_ts = b[A_TS].buf;
    const double *a_lat = b[A_LAT].buf, *a_depw = b[A_DEPW].buf;
    const int64_t *h_bp = b[H_BP].buf, *h_wait = b[H_WAIT].buf, *a_launch = b[A_LAUNCH].buf, *a_dep = b[A_DEP].buf;
    const unsigned char *a_first = b[A_FIRST].buf;
    Py_ssize_t nh = b[H_TS].len / 8, na = b[A_TS].len / 8;
    Py_ssize_t n_hc = b[H_BOUNDS].len / 8 - 1, n_ac = b[A_BOUNDS].len / 8 - 1;

    /* every length and index checked once, so the rounds read and write in bounds */
    int ok = b[HV].len == (2 * nh + 1) * 8 && b[AV].len == (2 * na + 1) * 8 && n_hc >= 0 && n_ac >= 0
             && b[A_FIRST].len == na && b[A_FIRST].itemsize == 1;
    const int hf[] = {H_GAP, H_DUR, H_BP, H_BPW, H_WAIT, H_TAIL}, af[] = {A_SGAP, A_DUR, A_LAUNCH, A_LAT, A_DEP, A_DEPW};
    for (int i = 0; ok && i < 6; i++) ok = b[hf[i]].len == nh * 8 && b[af[i]].len == na * 8;
    ok = ok && (n_hc ? hb[0] == 0 && hb[n_hc] == nh : nh == 0) && (n_ac ? ab[0] == 0 && ab[n_ac] == na : na == 0);
    for (Py_ssize_t c = 0; ok && c < n_hc; c++) ok = hb[c] < hb[c + 1];
    for (Py_ssize_t c = 0; ok && c < n_ac; c++) ok = ab[c] < ab[c + 1];
    for (Py_ssize_t i = 0; ok && i < nh; i++) ok = h_bp[i] < na && h_wait[i] < na;
    for (Py_ssize_t i = 0; ok && i < na; i++) ok = a_launch[i] < nh && a_dep[i] < na;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_solve.in_order: inconsistent graph arrays");
        goto done_;
    }
    {
        Py_ssize_t n_chains = n_hc + n_ac, max_n = 1;
        acc = malloc((size_t)(2 * (nh + na) + 1) * sizeof(double));
        chain_of = malloc((size_t)(nh + na + 1) * sizeof(int64_t)); /* per item, host items first */
        done = calloc((size_t)n_chains + 1, sizeof(int64_t));
        top = malloc(((size_t)n_chains + 1) * sizeof(double));
        for (Py_ssize_t c = 0; c < n_hc; c++) if (2 * (hb[c + 1] - hb[c]) > max_n) max_n = 2 * (hb[c + 1] - hb[c]);
        for (Py_ssize_t c = 0; c < n_ac; c++) if (2 * (ab[c + 1] - ab[c]) > max_n) max_n = 2 * (ab[c + 1] - ab[c]);
        tmp = malloc((size_t)max_n * sizeof(double));
        if (!acc || !chain_of || !done || !top || !tmp) {
            PyErr_NoMemory();
            goto done_;
        }
        double *acc_h = acc, *acc_a = acc + 2 * nh;
        /* per chain: the cumulative sum of its interleaved (gap, dur) weights, less the first, as
           np.cumsum(w) - w[0] gives it */
        for (Py_ssize_t c = 0; c < n_chains; c++) {
            int host = c < n_hc;
            int64_t lo = host ? hb[c] : ab[c - n_hc], hi = host ? hb[c + 1] : ab[c - n_hc + 1];
            const double *gap = host ? h_gap : a_sgap, *dur = host ? h_dur : a_dur;
            double *out = host ? acc_h : acc_a, run = 0.0, w0 = gap[lo];
            for (int64_t i = lo; i < hi; i++) {
                run = i == lo ? gap[i] : run + gap[i];
                out[2 * i] = run;
                run = run + dur[i];
                out[2 * i + 1] = run;
            }
            for (int64_t j = 2 * lo; j < 2 * hi; j++) out[j] = out[j] - w0;
            for (int64_t i = lo; i < hi; i++) chain_of[(host ? 0 : nh) + i] = c;
            top[c] = -INFINITY;
        }
        int64_t left = 2 * (nh + na), rounds = 0;

        Py_BEGIN_ALLOW_THREADS
        while (left) {
            int moved = 0;
            rounds++;
            for (Py_ssize_t c = 0; c < n_chains; c++) {
                int host = c < n_hc;
                int64_t lo = host ? hb[c] : ab[c - n_hc], n = 2 * ((host ? hb[c + 1] : ab[c - n_hc + 1]) - lo);
                int64_t p = done[c], q = p;
                if (p == n) continue;
                /* on to the first half with an input not yet final on its own chain (what numpy's
                   searchsorted over the cumulative needs finds) */
                for (; q < n; q++) {
                    int64_t i = lo + q / 2, src[2], d;
                    int k = 0;
                    if (host) {
                        if (q % 2 == 0 && h_bp[i] >= 0) src[k++] = nh + h_bp[i];
                        if (q % 2 == 1 && h_wait[i] >= 0) src[k++] = nh + h_wait[i];
                    } else if (q % 2 == 0) {
                        if (a_launch[i] >= 0) src[k++] = a_launch[i];
                        if (a_dep[i] >= 0) src[k++] = nh + a_dep[i];
                    }
                    int ready = 1;
                    for (int m = 0; ready && m < k; m++) {
                        /* a source's half: an activity's end, a launch call's start */
                        d = chain_of[src[m]];
                        int64_t first = d < n_hc ? hb[d] : nh + ab[d - n_hc];
                        int64_t half = 2 * (src[m] - first) + (src[m] >= nh ? 1 : 0);
                        ready = half < done[d];
                    }
                    if (!ready) break;
                }
                if (q <= p) continue;
                const double *a_ = (host ? acc_h : acc_a) + 2 * lo;
                for (int64_t j = p; j < q; j++) {
                    int64_t i = lo + j / 2;
                    double v;
                    if (host) {
                        v = (j == 0) ? h_ts[i] : -INFINITY; /* the first call of a rank starts as traced */
                        if (j % 2 == 0 && h_bp[i] >= 0) v = np_max(v, av[2 * h_bp[i] + 1] + h_bpw[i]);
                        if (j % 2 == 1 && h_wait[i] >= 0) v = np_max(v, av[2 * h_wait[i] + 1] + h_tail[i]);
                    } else if (j % 2 == 0) {
                        v = (a_first[i] && a_launch[i] < 0 && a_dep[i] < 0) ? a_ts[i] : -INFINITY;
                        if (a_launch[i] >= 0) v = np_max(v, hv[2 * a_launch[i]] + a_lat[i]);
                        if (a_dep[i] >= 0) v = np_max(v, av[2 * a_dep[i] + 1] + a_depw[i]);
                    } else {
                        v = -INFINITY;
                    }
                    tmp[j - p] = v - a_[j];
                }
                if (top[c] > tmp[0]) tmp[0] = top[c]; /* Python's max(b[0], top): top only when greater */
                double *out = (host ? hv : av) + 2 * lo;
                double run = tmp[0];
                out[p] = a_[p] + run;
                for (int64_t j = p + 1; j < q; j++) {
                    run = np_max(run, tmp[j - p]);
                    out[j] = a_[j] + run;
                }
                top[c] = run;
                done[c] = q;
                left -= q - p;
                moved = 1;
            }
            if (!moved) {
                rounds = -1;
                break;
            }
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong(rounds);
    }
done_:
    free(acc); free(chain_of); free(done); free(top); free(tmp);
    for (int i = 0; i < N_BUF; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* The passes of gpuprof.replay.simulate (_as_traced: whole-graph passes from the traced times;
 * _by_passes: windowed passes, for graphs whose collectives couple the ranks) in C. A pass is a host
 * pass (simulate._State.host: each host chain stretch's bounds from the GPU ends so far, then each
 * stretch scanned) and a GPU pass (simulate._State.gpu: bounds from the host starts just found and,
 * for a matched collective, its last rank's start; every bound gathered before any stream is
 * scanned). A stretch is scanned as simulate._scan scans it, the same floats: per half a cumulative
 * sum of the weights (one after the other, as np.cumsum sums), less the first, the running max of
 * the bounds less that (numpy's maximum, NaN propagating), added back; a stretch that continues its
 * chain starts after the item before it (Python's max: that only when greater). The numpy passes
 * skip a stretch whose bounds did not change since the pass before over the same stretches;
 * scanned again here, it gives the same floats back. Whether a pass moved a time: by more than
 * `settled` µs. */
typedef struct {
    double *hs, *he, *as, *ae, *bs, *be, *last;
    const double *h_gap, *h_dur, *h_ts, *h_bpw, *h_tail, *a_sgap, *a_dur, *a_ts, *a_lat, *a_depw;
    const int64_t *h_bp, *h_wait, *a_launch, *a_dep, *a_coll, *coll_members, *coll_bounds, *coll_ids;
    const unsigned char *h_first, *a_first;
    Py_ssize_t nh, na, n_members, n_groups, n_coll;
    double settled;
} passes_t;

/* items [lo, hi) of one chain scanned (see above), written to `starts`/`ends`: whether one moved */
static int scan_stretch(int64_t lo, int64_t hi, const double *gap, const double *dur, const unsigned char *first,
                        const double *bs, const double *be, double *starts, double *ends, double settled, int early) {
    double run = 0.0, w0 = gap[lo], top = 0.0;
    int moved = 0;
    for (int64_t i = lo; i < hi; i++) {
        for (int half = 0; half < 2; half++) {
            double w = half ? dur[i] : gap[i];
            run = (i == lo && !half) ? w : run + w;
            double acc = run - w0;
            double b = half ? be[i] : bs[i];
            if (i == lo && !half && !first[lo]) {
                double x = ends[lo - 1] + gap[lo];
                if (x > b) b = x;
            }
            double x = b - acc;
            top = (i == lo && !half) ? x : np_max(top, x);
            double v = acc + top;
            double *out = half ? ends + i : starts + i;
            if (fabs(v - *out) > settled) {
                moved = 1;
                if (early) return 1; /* the caller discards the times */
            }
            *out = v;
        }
    }
    return moved;
}

/* `early`: stop at the first time that moves (the caller then discards every time) */
static int host_pass(passes_t *p, const int64_t *ranges, Py_ssize_t n, int early) {
    for (Py_ssize_t r = 0; r < n; r++)
        for (int64_t i = ranges[2 * r]; i < ranges[2 * r + 1]; i++) {
            double s = p->h_first[i] ? p->h_ts[i] : -INFINITY;
            if (p->h_bp[i] >= 0) s = np_max(s, p->ae[p->h_bp[i]] + p->h_bpw[i]);
            p->bs[i] = s;
            p->be[i] = p->h_wait[i] >= 0 ? p->ae[p->h_wait[i]] + p->h_tail[i] : -INFINITY;
        }
    int moved = 0;
    for (Py_ssize_t r = 0; r < n && !(early && moved); r++)
        if (ranges[2 * r + 1] > ranges[2 * r])
            moved |= scan_stretch(ranges[2 * r], ranges[2 * r + 1], p->h_gap, p->h_dur, p->h_first, p->bs, p->be,
                                  p->hs, p->he, p->settled, early);
    return moved;
}

static int gpu_pass(passes_t *p, const int64_t *ranges, Py_ssize_t n, int early) {
    if (p->n_coll) { /* each matched collective's last arrival (np.maximum.reduceat over its members) */
        for (Py_ssize_t c = 0; c < p->n_coll; c++) p->last[c] = -INFINITY;
        for (Py_ssize_t k = 0; k < p->n_groups; k++) {
            Py_ssize_t lo = p->coll_bounds[k], hi = k + 1 < p->n_groups ? p->coll_bounds[k + 1] : p->n_members;
            double m = p->as[p->coll_members[lo]];
            for (Py_ssize_t j = lo + 1; j < hi; j++) m = np_max(m, p->as[p->coll_members[j]]);
            p->last[p->coll_ids[k]] = m;
        }
    }
    for (Py_ssize_t r = 0; r < n; r++)
        for (int64_t i = ranges[2 * r]; i < ranges[2 * r + 1]; i++) {
            double s = -INFINITY;
            if (p->a_launch[i] >= 0) s = p->hs[p->a_launch[i]] + p->a_lat[i];
            if (p->a_dep[i] >= 0) s = np_max(s, p->ae[p->a_dep[i]] + p->a_depw[i]);
            if (p->a_first[i] && p->a_launch[i] < 0 && p->a_dep[i] < 0) s = p->a_ts[i];
            p->bs[i] = s;
            p->be[i] = (p->n_coll && p->a_coll[i] >= 0) ? p->last[p->a_coll[i]] + p->a_dur[i] : -INFINITY;
        }
    int moved = 0;
    for (Py_ssize_t r = 0; r < n && !(early && moved); r++)
        if (ranges[2 * r + 1] > ranges[2 * r])
            moved |= scan_stretch(ranges[2 * r], ranges[2 * r + 1], p->a_sgap, p->a_dur, p->a_first, p->bs, p->be,
                                  p->as, p->ae, p->settled, early);
    return moved;
}

/* np.array_equal: every element equal (NaN never is) */
static int all_equal(const double *x, const double *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!(x[i] == y[i])) return 0;
    return 1;
}

/* passes(mode, hs, he, as, ae, h_ranges, a_ranges, h_gap, h_dur, h_ts, h_first, h_bp, h_bpw, h_wait,
 *        h_tail, a_sgap, a_dur, a_ts, a_first, a_launch, a_lat, a_dep, a_depw, a_coll, coll_members,
 *        coll_bounds, coll_ids, n_coll, settled, max_passes)
 * hs, he, as, ae: the times so far, written in place; h_ranges, a_ranges: the stretches passed over
 * ((lo, hi) pairs of int64, disjoint); h_first, a_first one byte per item; a_coll and the collectives'
 * members (by collective), the first member of each group and its id: as simulate._State holds them
 * (n_coll 0: none). mode 0 (_as_traced): at most max_passes passes, given up at the first time that
 * moves (returns 0; the times are left half written then, and the caller discards them), else ended
 * at the first pass that changes not a bit (returns the passes made). mode 1 (_by_passes): passes
 * until one moves nothing, at most max_passes; returns the passes made, negated where none settled. */
enum { T_HS, T_HE, T_AS, T_AE, T_H_RANGES, T_A_RANGES, T_H_GAP, T_H_DUR, T_H_TS, T_H_FIRST, T_H_BP, T_H_BPW,
       T_H_WAIT, T_H_TAIL, T_A_SGAP, T_A_DUR, T_A_TS, T_A_FIRST, T_A_LAUNCH, T_A_LAT, T_A_DEP, T_A_DEPW, T_A_COLL,
       T_MEMBERS, T_BOUNDS, T_IDS, T_N_BUF };

static PyObject *passes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[T_N_BUF];
    int mode, max_passes;
    Py_ssize_t n_coll;
    double settled;
    PyObject *result = NULL;
    double *before = NULL;
    passes_t p = {0};
    if (!PyArg_ParseTuple(args, "iw*w*w*w*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*ndi", &mode, &b[0], &b[1],
                          &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13],
                          &b[14], &b[15], &b[16], &b[17], &b[18], &b[19], &b[20], &b[21], &b[22], &b[23], &b[24],
                          &b[25], &n_coll, &settled, &max_passes))
        return NULL;
    Py_ssize_t nh = b[T_H_TS].len / 8, na = b[T_A_TS].len / 8;
    Py_ssize_t n_hr = b[T_H_RANGES].len / 16, n_ar = b[T_A_RANGES].len / 16;
    const int64_t *hr = b[T_H_RANGES].buf, *ar = b[T_A_RANGES].buf;
    p.hs = b[T_HS].buf; p.he = b[T_HE].buf; p.as = b[T_AS].buf; p.ae = b[T_AE].buf;
    p.h_gap = b[T_H_GAP].buf; p.h_dur = b[T_H_DUR].buf; p.h_ts = b[T_H_TS].buf; p.h_bpw = b[T_H_BPW].buf;
    p.h_tail = b[T_H_TAIL].buf; p.a_sgap = b[T_A_SGAP].buf; p.a_dur = b[T_A_DUR].buf; p.a_ts = b[T_A_TS].buf;
    p.a_lat = b[T_A_LAT].buf; p.a_depw = b[T_A_DEPW].buf;
    p.h_bp = b[T_H_BP].buf; p.h_wait = b[T_H_WAIT].buf; p.a_launch = b[T_A_LAUNCH].buf; p.a_dep = b[T_A_DEP].buf;
    p.a_coll = b[T_A_COLL].buf; p.coll_members = b[T_MEMBERS].buf; p.coll_bounds = b[T_BOUNDS].buf;
    p.coll_ids = b[T_IDS].buf;
    p.h_first = b[T_H_FIRST].buf; p.a_first = b[T_A_FIRST].buf;
    p.nh = nh; p.na = na; p.n_members = b[T_MEMBERS].len / 8; p.n_groups = b[T_BOUNDS].len / 8; p.n_coll = n_coll;
    p.settled = settled;

    /* every length and index checked once, so the passes read and write in bounds */
    int ok = b[T_H_FIRST].len == nh && b[T_A_FIRST].len == na && max_passes >= 1 && (mode == 0 || mode == 1)
             && n_coll >= 0 && b[T_IDS].len == b[T_BOUNDS].len && b[T_H_RANGES].len % 16 == 0
             && b[T_A_RANGES].len % 16 == 0;
    const int hf[] = {T_HS, T_HE, T_H_GAP, T_H_DUR, T_H_BP, T_H_BPW, T_H_WAIT, T_H_TAIL};
    const int af[] = {T_AS, T_AE, T_A_SGAP, T_A_DUR, T_A_LAUNCH, T_A_LAT, T_A_DEP, T_A_DEPW, T_A_COLL};
    for (int i = 0; ok && i < 8; i++) ok = b[hf[i]].len == nh * 8;
    for (int i = 0; ok && i < 9; i++) ok = b[af[i]].len == na * 8;
    for (Py_ssize_t r = 0; ok && r < n_hr; r++)
        ok = hr[2 * r] >= 0 && hr[2 * r] <= hr[2 * r + 1] && hr[2 * r + 1] <= nh
             && (hr[2 * r] == hr[2 * r + 1] || p.h_first[hr[2 * r]] || hr[2 * r] > 0);
    for (Py_ssize_t r = 0; ok && r < n_ar; r++)
        ok = ar[2 * r] >= 0 && ar[2 * r] <= ar[2 * r + 1] && ar[2 * r + 1] <= na
             && (ar[2 * r] == ar[2 * r + 1] || p.a_first[ar[2 * r]] || ar[2 * r] > 0);
    for (Py_ssize_t i = 0; ok && i < nh; i++) ok = p.h_bp[i] < na && p.h_wait[i] < na;
    for (Py_ssize_t i = 0; ok && i < na; i++)
        ok = p.a_launch[i] < nh && p.a_dep[i] < na && (p.a_coll[i] < 0 || p.a_coll[i] < n_coll);
    for (Py_ssize_t k = 0; ok && k < p.n_groups; k++)
        ok = p.coll_bounds[k] >= 0 && p.coll_bounds[k] < p.n_members && (k == 0 || p.coll_bounds[k - 1] < p.coll_bounds[k])
             && p.coll_ids[k] >= 0 && p.coll_ids[k] < n_coll;
    for (Py_ssize_t j = 0; ok && j < p.n_members; j++) ok = p.coll_members[j] >= 0 && p.coll_members[j] < na;
    ok = ok && (p.n_groups == 0 || p.coll_bounds[0] == 0);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_solve.passes: inconsistent graph arrays");
        goto done_;
    }
    Py_ssize_t n_max = nh > na ? nh : na;
    p.bs = malloc((size_t)n_max * sizeof(double) + 8);
    p.be = malloc((size_t)n_max * sizeof(double) + 8);
    p.last = malloc((size_t)n_coll * sizeof(double) + 8);
    before = mode == 0 ? malloc((size_t)(2 * (nh + na)) * sizeof(double) + 8) : NULL;
    if (!p.bs || !p.be || !p.last || (mode == 0 && !before)) {
        PyErr_NoMemory();
        goto done_;
    }
    long made = 0;
    Py_BEGIN_ALLOW_THREADS
    if (mode == 0) {
        for (int pass = 1; pass <= max_passes; pass++) {
            memcpy(before, p.hs, (size_t)nh * sizeof(double));
            memcpy(before + nh, p.he, (size_t)nh * sizeof(double));
            memcpy(before + 2 * nh, p.as, (size_t)na * sizeof(double));
            memcpy(before + 2 * nh + na, p.ae, (size_t)na * sizeof(double));
            if (host_pass(&p, hr, n_hr, 1) || gpu_pass(&p, ar, n_ar, 1)) { /* a host that moved needs no GPU pass */
                made = 0;
                break;
            }
            made = pass;
            if (all_equal(before, p.hs, nh) && all_equal(before + nh, p.he, nh) && all_equal(before + 2 * nh, p.as, na)
                && all_equal(before + 2 * nh + na, p.ae, na))
                break;
        }
    } else {
        made = -(long)max_passes;
        for (int pass = 1; pass <= max_passes; pass++) {
            int moved = host_pass(&p, hr, n_hr, 0);
            moved = gpu_pass(&p, ar, n_ar, 0) || moved;
            if (!moved) {
                made = pass;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(made);
done_:
    free(p.bs); free(p.be); free(p.last); free(before);
    for (int i = 0; i < T_N_BUF; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"in_order", in_order, METH_VARARGS, "Solve a replay graph's chains in dependency order (see gpuprof.replay.simulate._in_order)."},
    {"passes", passes, METH_VARARGS, "A replay graph's passes over stretches of its chains (see gpuprof.replay.simulate._as_traced and _by_passes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpuprof.replay.native._solve", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__solve(void) { return PyModule_Create(&module); }
