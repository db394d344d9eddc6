/* The rounds of gpuprof.replay.simulate._in_order, in C (the replay's solver in dependency order).
 *
 * _in_order solves each chain of the graph (a rank's host calls, a stream's activities, as
 * half-items: an item's start, then its end) as far as its outside inputs are final, one stretch
 * at a time, round after round. In numpy each stretch costs a dozen calls whatever its length, and
 * a sync-heavy rank takes thousands of rounds (a 100k-kernel GPT with an `.item()` every few
 * layers: 4,051 rounds, ~60 ms a replay). This file runs the same rounds over the same values
 * with the same floating-point operations in the same order (a max, a subtraction and an addition
 * per value; no multiplication, so nothing to contract), so it gives the floats the numpy loop
 * gives, bit for bit (tests/test_replay_solve.py holds the two equal).
 *
 * The graph comes as half-item arrays, one set per side (host calls H, activities A), in the
 * layout of hv / av (item k's start at 2k, its end at 2k + 1, one last slot holding -inf: "no
 * edge"):
 *
 *   hv, av            the half values, written in place (their traced times on entry)
 *   h_bounds, a_bounds  the chains' first half on each side, and the side's end (chains are
 *                     contiguous; chain c counts host chains first, then the streams)
 *   acc_h, acc_a      per half: the cumulative weight along its chain less the chain's first
 *   const_h, const_a  per half: its constant bound (-inf where none)
 *   src_h, w_h        K_H rows of one half each (the host's inputs: a full queue's slot, a
 *                     wait), the global half each comes from (the last slot where none) and the
 *                     weight; from_h[k] says whether row k reads hv (else av)
 *   src_a, w_a, from_a  the same for the activities (a launch, a wait on another stream)
 *
 * A chain goes on from where it is up to its first half whose inputs are not all final (a source
 * half not yet solved on its own chain): the stretch numpy's searchsorted over the cumulative
 * needs finds. Returns the number of rounds, or -1 when a round moves nothing (a cycle: the
 * caller falls back to the windowed passes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

enum { HV, AV, H_BOUNDS, A_BOUNDS, ACC_H, ACC_A, CONST_H, CONST_A, SRC_H, W_H, FROM_H, SRC_A, W_A, FROM_A, N_BUF };

/* numpy's maximum: NaN propagates, the first operand kept on ties */
static inline double np_max(double a, double b) { return (a >= b || isnan(a)) ? a : b; }

typedef struct {
    double *vals;               /* this side's half values (hv or av) */
    Py_ssize_t n;               /* halves, without the last slot */
    const int64_t *bounds;      /* chain bounds in halves */
    Py_ssize_t n_chains, first_chain;
    const double *acc, *cst;
    const int64_t *src, *from;  /* K rows of n */
    const double *w;
    Py_ssize_t k;
    int64_t *chain_of;          /* per half: its chain (global index) */
} Side;

static int side_of(Side *sd, Py_buffer *b, int vals, int bounds, int acc, int cst, int src, int w, int from) {
    sd->vals = (double *)b[vals].buf;
    sd->n = b[vals].len / 8 - 1;
    sd->bounds = (const int64_t *)b[bounds].buf;
    sd->n_chains = b[bounds].len / 8 - 1;
    sd->acc = (const double *)b[acc].buf;
    sd->cst = (const double *)b[cst].buf;
    sd->src = (const int64_t *)b[src].buf;
    sd->w = (const double *)b[w].buf;
    sd->from = (const int64_t *)b[from].buf;
    sd->k = b[from].len / 8;
    sd->chain_of = NULL;
    if (sd->n < 0 || sd->n_chains < 0 || b[acc].len / 8 != sd->n || b[cst].len / 8 != sd->n
        || b[src].len / 8 != sd->k * sd->n || b[w].len / 8 != sd->k * sd->n)
        return 0;
    if (sd->n_chains == 0) return sd->n == 0;
    if (sd->bounds[0] != 0 || sd->bounds[sd->n_chains] != sd->n) return 0;
    for (Py_ssize_t c = 0; c < sd->n_chains; c++)
        if (sd->bounds[c] >= sd->bounds[c + 1]) return 0;
    return 1;
}

static PyObject *in_order(PyObject *self, PyObject *args) {
    Py_buffer b[N_BUF];
    PyObject *result = NULL;
    Side side[2];
    side[0].chain_of = side[1].chain_of = NULL;
    int64_t *done = NULL;
    double *top = NULL, *tmp = NULL;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*y*y*y*y*y*y*y*y*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6],
                          &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13]))
        return NULL;
    int ok = 1;
    for (int i = 0; i < N_BUF; i++) ok = ok && b[i].len % 8 == 0;
    ok = ok && side_of(&side[0], b, HV, H_BOUNDS, ACC_H, CONST_H, SRC_H, W_H, FROM_H)
         && side_of(&side[1], b, AV, A_BOUNDS, ACC_A, CONST_A, SRC_A, W_A, FROM_A);
    if (ok) {
        side[0].first_chain = 0;
        side[1].first_chain = side[0].n_chains;
        /* every source is a half of its side or that side's last slot */
        for (int s = 0; ok && s < 2; s++)
            for (Py_ssize_t k = 0; ok && k < side[s].k; k++) {
                Py_ssize_t limit = side[side[s].from[k] ? 0 : 1].n;
                ok = side[s].from[k] == 0 || side[s].from[k] == 1;
                for (Py_ssize_t j = 0; ok && j < side[s].n; j++) {
                    int64_t x = side[s].src[k * side[s].n + j];
                    ok = x >= 0 && x <= limit;
                }
            }
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_solve.in_order: inconsistent graph arrays");
        goto done;
    }
    Py_ssize_t n_chains = side[0].n_chains + side[1].n_chains, max_n = 1;
    int64_t left = side[0].n + side[1].n, rounds = 0;
    for (int s = 0; s < 2; s++)
        for (Py_ssize_t c = 0; c < side[s].n_chains; c++)
            if (side[s].bounds[c + 1] - side[s].bounds[c] > max_n) max_n = side[s].bounds[c + 1] - side[s].bounds[c];
    done = calloc((size_t)(n_chains ? n_chains : 1), sizeof(int64_t));
    top = malloc((size_t)(n_chains ? n_chains : 1) * sizeof(double));
    tmp = malloc((size_t)max_n * sizeof(double));
    side[0].chain_of = malloc((size_t)(side[0].n ? side[0].n : 1) * sizeof(int64_t));
    side[1].chain_of = malloc((size_t)(side[1].n ? side[1].n : 1) * sizeof(int64_t));
    if (!done || !top || !tmp || !side[0].chain_of || !side[1].chain_of) {
        PyErr_NoMemory();
        goto done;
    }
    for (int s = 0; s < 2; s++)
        for (Py_ssize_t c = 0; c < side[s].n_chains; c++)
            for (int64_t j = side[s].bounds[c]; j < side[s].bounds[c + 1]; j++) side[s].chain_of[j] = side[s].first_chain + c;
    for (Py_ssize_t c = 0; c < n_chains; c++) top[c] = -INFINITY;

    Py_BEGIN_ALLOW_THREADS
    while (left) {
        int moved = 0;
        rounds++;
        for (Py_ssize_t c = 0; c < n_chains; c++) {
            Side *sd = &side[c < side[0].n_chains ? 0 : 1];
            Py_ssize_t local = c - sd->first_chain;
            int64_t lo = sd->bounds[local], n = sd->bounds[local + 1] - lo, p = done[c], q = p;
            if (p == n) continue;
            /* up to the first half with an input not yet final on its own chain */
            for (; q < n; q++) {
                int ready = 1;
                for (Py_ssize_t k = 0; ready && k < sd->k; k++) {
                    Side *from = &side[sd->from[k] ? 0 : 1];
                    int64_t x = sd->src[k * sd->n + lo + q];
                    if (x == from->n) continue; /* no edge */
                    int64_t d = from->chain_of[x];
                    ready = x - from->bounds[d - from->first_chain] < done[d];
                }
                if (!ready) break;
            }
            if (q <= p) continue;
            const double *cst = sd->cst + lo, *acc = sd->acc + lo;
            for (int64_t j = p; j < q; j++) tmp[j - p] = cst[j];
            for (Py_ssize_t k = 0; k < sd->k; k++) {
                const double *vals = side[sd->from[k] ? 0 : 1].vals;
                const int64_t *src = sd->src + k * sd->n + lo;
                const double *w = sd->w + k * sd->n + lo;
                for (int64_t j = p; j < q; j++) tmp[j - p] = np_max(tmp[j - p], vals[src[j]] + w[j]);
            }
            for (int64_t j = p; j < q; j++) tmp[j - p] = tmp[j - p] - acc[j];
            if (top[c] > tmp[0]) tmp[0] = top[c]; /* Python's max(b[0], top): top only when greater */
            double *out = sd->vals + lo;
            double run = tmp[0];
            out[p] = acc[p] + run;
            for (int64_t j = p + 1; j < q; j++) {
                run = np_max(run, tmp[j - p]);
                out[j] = acc[j] + run;
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
done:
    free(done); free(top); free(tmp);
    free(side[0].chain_of); free(side[1].chain_of);
    for (int i = 0; i < N_BUF; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"in_order", in_order, METH_VARARGS, "Solve a replay graph's chains in dependency order (see gpuprof.replay.simulate._in_order)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpuprof.replay.native._solve", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__solve(void) { return PyModule_Create(&module); }
