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

static PyMethodDef methods[] = {
    {"in_order", in_order, METH_VARARGS, "Solve a replay graph's chains in dependency order (see gpuprof.replay.simulate._in_order)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpuprof.replay.native._solve", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__solve(void) { return PyModule_Create(&module); }
