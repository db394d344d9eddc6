/* Kineto events to columns: one pass over a trace document, its "traceEvents" array to columns.
 *
 * The reader of gpuprof.trace.columnar (which documents the contract). It makes no Python
 * object per event: each field gpuprof reads goes into a column buffer (a bytearray), strings
 * and raw JSON values are interned by their bytes (the table of distinct texts is returned as
 * offsets into the input), and everything else is skipped. It is deliberately narrow: whatever
 * it does not understand exactly as msgspec would decode it (a key written with escapes, a
 * duplicated key, a name that is no string, args that are no object, a number it cannot convert
 * exactly) makes it return None, and the caller loads the file the msgspec way instead. Values
 * of the right JSON kind but the wrong type for a column (a string pid, a list as a stream) are
 * not refused here: they set the field's bit in the event's "rare" mask, and the caller decides
 * by the event's bucket whether that field is read.
 *
 * It validates the whole document as it goes, at least as strictly as msgspec's skip (control
 * characters, escapes, the grammar of numbers and literals, trailing commas; more strictly: every
 * surrogate escape and nesting past MAX_DEPTH are refused), since msgspec then decodes only the
 * document with the events array cut out. It never words an error: it refuses, and the msgspec
 * path reads the file and words whatever is wrong with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Numeric columns (float64), in this order; their bit in "rare" is their index. */
enum {
    F_PID, F_TID, F_TS, F_DUR,
    F_EXT, F_EXT_LC, F_CORR, F_STREAM, F_DEVICE, F_REGS, F_SHMEM, F_OCC, F_IN_NEL, F_OUT_NEL,
    F_GROUP, F_SEQ, F_BYTES, F_SEQNUM, F_FWD_TID, F_MEM_BYTES, F_TOT_ALLOC, F_TOT_RES, F_DEV_ID,
    F_DEV_TYPE,
    N_NUM
};
static const char *NUM_NAMES[N_NUM] = {
    "pid", "tid", "ts", "dur",
    "external_id", "external_id_lc", "correlation", "stream", "device", "registers", "shared_memory",
    "occupancy", "in_msg_nelems", "out_msg_nelems", "group_size", "seq", "bytes", "sequence_number",
    "fwd_thread_id", "alloc_bytes", "total_allocated", "total_reserved", "device_id", "device_type",
};
#define BIT_GRID (1u << 24)
#define BIT_BLOCK (1u << 25)

/* Interned columns (int32 ids, -1 absent): strings for kernels' collective fields, raw op args. */
enum { S_COLL, S_DTYPE, S_PG_NAME, S_PG_ID, N_STR };
static const char *STR_NAMES[N_STR] = {"collective_name", "dtype", "pg_name", "pg_id"};
enum { R_DIMS, R_DIMS_LC, R_TYPE, R_STRIDES, R_CONCRETE, N_RAW };
static const char *RAW_NAMES[N_RAW] = {"input_dims", "input_dims_lc", "input_type", "input_strides", "concrete_inputs"};

/* Kineto's categories, in gpuprof.trace.load._BUCKETS order (the code is the index). */
static const char *CATS[] = {
    "Kernel", "Memcpy", "Memset", "Operator", "Runtime", "kernel", "gpu_memcpy", "gpu_memset", "cpu_op",
    "cuda_runtime", "cuda_driver", "user_annotation", "gpu_user_annotation", "python_function",
};
#define N_CATS ((int)(sizeof(CATS) / sizeof(CATS[0])))

typedef struct {
    PyObject *buf; /* bytearray */
    Py_ssize_t item;
} Col;

typedef struct {
    /* open addressing: slot -> id + 1 (0 empty) */
    int32_t *slots;
    size_t mask;
    int64_t *off;
    int32_t *len;
    uint64_t *hash;
    size_t n, cap;
} Table;

typedef struct {
    const unsigned char *base, *p, *end;
    Py_ssize_t n, cap, filled; /* events, rows allocated, rows holding their defaults */
    Col ph, cat, name, rare, grid, block;
    Col num[N_NUM];
    Col str[N_STR];
    Col raw[N_RAW];
    Table names, strs, raws;
    PyThreadState *save; /* while the GIL is released */
} Scan;

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    h ^= h >> 32;
    return h * 0x9E3779B97F4A7C15ULL;
}

static int table_init(Table *t) {
    t->mask = 1023;
    t->slots = calloc(t->mask + 1, sizeof(int32_t));
    t->cap = 256;
    t->n = 0;
    t->off = malloc(t->cap * sizeof(int64_t));
    t->len = malloc(t->cap * sizeof(int32_t));
    t->hash = malloc(t->cap * sizeof(uint64_t));
    return t->slots && t->off && t->len && t->hash ? 0 : -1;
}

static void table_free(Table *t) {
    free(t->slots); free(t->off); free(t->len); free(t->hash);
}

static int table_grow(Table *t) {
    size_t nm = (t->mask + 1) * 2 - 1;
    int32_t *ns = calloc(nm + 1, sizeof(int32_t));
    if (!ns) return -1;
    for (size_t i = 0; i < t->n; i++) {
        size_t k = t->hash[i] & nm;
        while (ns[k]) k = (k + 1) & nm;
        ns[k] = (int32_t)i + 1;
    }
    free(t->slots);
    t->slots = ns;
    t->mask = nm;
    return 0;
}

/* The id of text s[0:n] (s inside the scanned buffer), adding it if new; -1 on no memory. */
static int32_t intern(Scan *sc, Table *t, const unsigned char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    size_t k = h & t->mask;
    int32_t e;
    while ((e = t->slots[k]) != 0) {
        size_t i = (size_t)e - 1;
        if (t->hash[i] == h && (size_t)t->len[i] == n && memcmp(sc->base + t->off[i], s, n) == 0) return (int32_t)i;
        k = (k + 1) & t->mask;
    }
    if (n > INT32_MAX || t->n >= INT32_MAX - 1) return -1;
    if (t->n == t->cap) {
        size_t nc = t->cap * 2;
        int64_t *o = realloc(t->off, nc * sizeof(int64_t));
        if (!o) return -1;
        t->off = o;
        int32_t *l = realloc(t->len, nc * sizeof(int32_t));
        if (!l) return -1;
        t->len = l;
        uint64_t *hh = realloc(t->hash, nc * sizeof(uint64_t));
        if (!hh) return -1;
        t->hash = hh;
        t->cap = nc;
    }
    size_t id = t->n++;
    t->off[id] = (int64_t)(s - sc->base);
    t->len[id] = (int32_t)n;
    t->hash[id] = h;
    t->slots[k] = (int32_t)id + 1;
    if (t->n * 2 > t->mask && table_grow(t) < 0) return -1;
    return (int32_t)id;
}

static int col_init(Col *c, Py_ssize_t item, Py_ssize_t cap) {
    c->item = item;
    c->buf = PyByteArray_FromStringAndSize(NULL, item * cap);
    return c->buf ? 0 : -1;
}

#define COL(c, T) ((T *)PyByteArray_AS_STRING((c).buf))

/* Rows [a, b) of every column set to an event's defaults (those of gpuprof.trace.load._Event),
 * column by column, a block of FILL_ROWS rows just before the scan reaches them (scan_array): each
 * event then writes only the fields it has, into lines the fill left in cache, and the rows
 * allocated beyond the last event are never touched. */
#define FILL_ROWS 1024
static void fill_defaults(Scan *sc, Py_ssize_t a, Py_ssize_t b) {
    memset(COL(sc->ph, uint8_t) + a, 0, (size_t)(b - a));
    memset(COL(sc->cat, int8_t) + a, 0xFF, (size_t)(b - a));
    for (int f = 0; f < N_NUM; f++) {
        double *c = COL(sc->num[f], double), v = f == F_PID || f == F_TID || f == F_DUR ? 0.0 : NAN;
        for (Py_ssize_t i = a; i < b; i++) c[i] = v;
    }
    for (int s = 0; s < N_STR; s++) memset(COL(sc->str[s], int32_t) + a, 0xFF, (size_t)(b - a) * 4);
    for (int r = 0; r < N_RAW; r++) memset(COL(sc->raw[r], int32_t) + a, 0xFF, (size_t)(b - a) * 4);
    memset(COL(sc->grid, int64_t) + 3 * a, 0xFF, (size_t)(b - a) * 24);
    memset(COL(sc->block, int64_t) + 3 * a, 0xFF, (size_t)(b - a) * 24);
}

static Col *all_cols(Scan *sc, int i) {
    Col *fixed[] = {&sc->ph, &sc->cat, &sc->name, &sc->rare, &sc->grid, &sc->block};
    if (i < 6) return fixed[i];
    i -= 6;
    if (i < N_NUM) return &sc->num[i];
    i -= N_NUM;
    if (i < N_STR) return &sc->str[i];
    i -= N_STR;
    if (i < N_RAW) return &sc->raw[i];
    return NULL;
}

#define Py_BLOCK_THREADS_SC PyEval_RestoreThread(sc->save);
#define Py_UNBLOCK_THREADS_SC sc->save = PyEval_SaveThread();

static int grow(Scan *sc) {
    Py_ssize_t nc = sc->cap * 2;
    Col *c;
    for (int i = 0; (c = all_cols(sc, i)) != NULL; i++)
        if (PyByteArray_Resize(c->buf, c->item * nc) < 0) return -1;
    sc->cap = nc;
    return 0;
}

static inline void ws(Scan *sc) {
    while (sc->p < sc->end && (*sc->p == ' ' || *sc->p == '\n' || *sc->p == '\r' || *sc->p == '\t')) sc->p++;
}

/* Past a string whose opening quote is at p, validated as msgspec's skip validates it, or more
 * strictly: no control character, only JSON's escapes, and no \u escape of a surrogate at all
 * (msgspec refuses lone ones; a pair is rare enough to leave to it). Sets *esc when the string
 * holds a backslash. 0, or -1 (refused). */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t has_byte(uint64_t w, uint64_t c) {
    uint64_t x = w ^ c;
    return (x - ONES) & ~x & HIGHS;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int skip_string(Scan *sc, int *esc) {
    const unsigned char *p = sc->p + 1, *end = sc->end;
    for (;;) {
#if defined(__SSE2__)
        /* 16 bytes at a time: the first quote, backslash or control character (<= 0x1F) */
        while (end - p >= 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                                    _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                                       _mm_cmpeq_epi8(_mm_max_epu8(x, _mm_set1_epi8(0x1F)), _mm_set1_epi8(0x1F)));
            int mask = _mm_movemask_epi8(hit);
            if (mask) { p += __builtin_ctz((unsigned)mask); break; }
            p += 16;
        }
#endif
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (has_byte(w, 0x2222222222222222ULL) | has_byte(w, 0x5C5C5C5C5C5C5C5CULL) |
                ((w - 0x2020202020202020ULL) & ~w & HIGHS)) break;
            p += 8;
        }
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
        if (p >= end) return -1;
        if (*p == '"') { sc->p = p + 1; return 0; }
        if (*p < 0x20) return -1;
        *esc = 1;
        if (end - p < 2) return -1;
        switch (p[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't': p += 2; break;
        case 'u': {
            if (end - p < 6) return -1;
            int v = 0;
            for (int i = 2; i < 6; i++) {
                int h = hexval(p[i]);
                if (h < 0) return -1;
                v = v * 16 + h;
            }
            if (v >= 0xD800 && v <= 0xDFFF) return -1;
            p += 6;
            break;
        }
        default: return -1;
        }
    }
}

enum { K_OK, K_OTHER, K_RANGE, K_REFUSE };
static int parse_number(Scan *sc, double *out, int *is_int, int64_t *iv);
#define MAX_DEPTH 64

/* Past any JSON value, validated (see skip_string); nesting beyond MAX_DEPTH is refused. */
static int skip_any(Scan *sc, int depth) {
    if (sc->p >= sc->end) return -1;
    unsigned char c = *sc->p;
    if (c == '"') { int esc = 0; return skip_string(sc, &esc); }
    if (c == '{' || c == '[') {
        if (depth >= MAX_DEPTH) return -1;
        unsigned char close = c == '{' ? '}' : ']';
        sc->p++;
        ws(sc);
        if (sc->p < sc->end && *sc->p == close) { sc->p++; return 0; }
        for (;;) {
            ws(sc);
            if (c == '{') {
                int esc = 0;
                if (sc->p >= sc->end || *sc->p != '"' || skip_string(sc, &esc) < 0) return -1;
                ws(sc);
                if (sc->p >= sc->end || *sc->p != ':') return -1;
                sc->p++;
                ws(sc);
            }
            if (skip_any(sc, depth + 1) < 0) return -1;
            ws(sc);
            if (sc->p >= sc->end) return -1;
            if (*sc->p == ',') { sc->p++; continue; }
            if (*sc->p == close) { sc->p++; return 0; }
            return -1;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        double d; int is_int; int64_t iv;
        return parse_number(sc, &d, &is_int, &iv) == K_REFUSE ? -1 : 0;
    }
    if (c == 't' && sc->end - sc->p >= 4 && memcmp(sc->p, "true", 4) == 0) { sc->p += 4; return 0; }
    if (c == 'f' && sc->end - sc->p >= 5 && memcmp(sc->p, "false", 5) == 0) { sc->p += 5; return 0; }
    if (c == 'n' && sc->end - sc->p >= 4 && memcmp(sc->p, "null", 4) == 0) { sc->p += 4; return 0; }
    return -1;
}

static int skip_value(Scan *sc) { return skip_any(sc, 0); }

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};


/* A JSON number at p as msgspec decodes it, converted as numpy converts the Python value to
 * float64: integers of at most 18 digits exactly then rounded once; other numbers correctly
 * rounded (an exact fast path, else strtod). *is_int and *iv: an integer literal and its value.
 * K_OTHER: a number no column holds exactly (more digits, subnormal); K_RANGE: a float beyond
 * float range, which msgspec refuses wherever it decodes the value ("Number out of range"). */
static int parse_number(Scan *sc, double *out, int *is_int, int64_t *iv) {
    const unsigned char *s = sc->p, *p = sc->p, *end = sc->end;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end || *p < '0' || *p > '9') return K_REFUSE;
    uint64_t m = 0;
    int digits = 0, frac = 0, exp = 0, lead = 1;
    if (*p == '0') { p++; if (p < end && *p >= '0' && *p <= '9') return K_REFUSE; }
    else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 19) m = m * 10 + (uint64_t)(*p - '0');
            digits++; p++;
        }
    }
    lead = 0;
    int isint = 1;
    if (p < end && *p == '.') {
        isint = 0; p++;
        if (p >= end || *p < '0' || *p > '9') return K_REFUSE;
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits == 0 && *p == '0') { frac++; p++; continue; } /* leading zeros of 0.000x */
            if (digits < 19) { m = m * 10 + (uint64_t)(*p - '0'); frac++; }
            digits++; p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        isint = 0; p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= end || *p < '0' || *p > '9') return K_REFUSE;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp < 100000) exp = exp * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp = -exp;
    }
    (void)lead;
    sc->p = p;
    *is_int = isint;
    if (isint) {
        if (digits > 18) { *out = NAN; return K_OTHER; }
        int64_t v = neg ? -(int64_t)m : (int64_t)m;
        *iv = v;
        *out = (double)v;
        return K_OK;
    }
    if (digits > 19) goto slow;
    {
        int e10 = exp - frac;
        if (m < (1ULL << 53) && e10 >= -22 && e10 <= 22) {
            double d = (double)m;
            d = e10 >= 0 ? d * POW10[e10] : d / POW10[-e10];
            *out = neg ? -d : d;
            return K_OK;
        }
    }
slow:
    {
        size_t n = (size_t)(p - s);
        char tmp[128];
        if (n >= sizeof(tmp)) { *out = NAN; return K_RANGE; } /* (not judged: refused where it matters) */
        memcpy(tmp, s, n);
        tmp[n] = 0;
        double d = strtod(tmp, NULL);
        if (!isfinite(d)) { *out = NAN; return K_RANGE; }
        if ((d != 0.0 && fabs(d) < 2.2250738585072014e-308) || (d == 0.0 && m != 0)) {
            *out = NAN;
            return K_OTHER;
        }
        *out = d;
        return K_OK;
    }
}

/* Whether s[0:n] is plain ASCII without a backslash: text msgspec decodes as it reads. */
static int plain(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80 || s[i] == '\\') return 0;
    return 1;
}

/* An event-level value that is not a number (ph, cat, pid, tid, ts, dur): msgspec decodes it
 * (into Any) in every event, bucket or not, so whatever it could refuse there (invalid UTF-8, a
 * bad escape, a float beyond range inside a list) is refused here too: strings must be plain,
 * lists and objects are refused outright (never seen in a real trace). */
static int event_value(Scan *sc) {
    unsigned char c = *sc->p;
    if (c == '[' || c == '{') return -1;
    const unsigned char *start = sc->p;
    if (skip_value(sc) < 0) return -1;
    return plain(start, (size_t)(sc->p - start)) ? 0 : -1;
}

/* A numeric field's value: number, null (NaN), or anything else (NaN and its rare bit).
 * ``strict``: an event-level field (see event_value). */
static int num_field(Scan *sc, int f, uint32_t *rare, int strict) {
    double *col = COL(sc->num[f], double);
    unsigned char c = *sc->p;
    if (c == '-' || (c >= '0' && c <= '9')) {
        int is_int; int64_t iv;
        int k = parse_number(sc, &col[sc->n], &is_int, &iv);
        if (k == K_REFUSE || (k == K_RANGE && strict)) return -1;
        if (k != K_OK) { col[sc->n] = NAN; *rare |= 1u << f; }
        return 0;
    }
    if (c == 'n' && sc->end - sc->p >= 4 && memcmp(sc->p, "null", 4) == 0) {
        sc->p += 4;
        col[sc->n] = NAN;
        return 0;
    }
    col[sc->n] = NAN;
    *rare |= 1u << f;
    return strict ? event_value(sc) : skip_value(sc);
}

/* grid / block: a list of exactly three integers, else -1s (null) or the rare bit. */
static int xyz_field(Scan *sc, Col *c, uint32_t bit, uint32_t *rare) {
    int64_t *out = COL(*c, int64_t) + 3 * sc->n;
    if (*sc->p == 'n' && sc->end - sc->p >= 4 && memcmp(sc->p, "null", 4) == 0) { sc->p += 4; return 0; }
    const unsigned char *start = sc->p;
    if (*sc->p == '[') {
        sc->p++;
        int i = 0;
        for (;;) {
            ws(sc);
            if (sc->p >= sc->end) return -1;
            if (*sc->p == ']') { sc->p++; break; }
            if (i > 0) {
                if (*sc->p != ',') return -1;
                sc->p++; ws(sc);
            }
            unsigned char ch = sc->p < sc->end ? *sc->p : 0;
            if (i >= 3 || !(ch == '-' || (ch >= '0' && ch <= '9'))) goto other;
            double d; int is_int; int64_t iv;
            int k = parse_number(sc, &d, &is_int, &iv);
            if (k == K_REFUSE) return -1;
            if (k != K_OK || !is_int) goto other;
            out[i++] = iv;
        }
        if (i == 3) return 0;
    }
other:
    out[0] = out[1] = out[2] = -1;
    *rare |= bit;
    sc->p = start;
    return skip_value(sc);
}

/* An interned value: the raw JSON text of the value (quotes included), any kind. */
static int raw_field(Scan *sc, Table *t, int32_t *slot) {
    const unsigned char *start = sc->p;
    if (skip_value(sc) < 0) return -1;
    int32_t id = intern(sc, t, start, (size_t)(sc->p - start));
    if (id < 0) return -1;
    *slot = id;
    return 0;
}

#define KEY(lit) (klen == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

/* One key of an object and its ':', the value's first byte next: the key's bytes in *k, *klen.
   A key written with escapes, or one msgspec would have to decode, is not ours to match (-1). */
static int object_key(Scan *sc, const unsigned char **k, size_t *klen) {
    ws(sc);
    if (sc->p >= sc->end || *sc->p != '"') return -1;
    *k = sc->p + 1;
    int esc = 0;
    if (skip_string(sc, &esc) < 0 || esc) return -1;
    *klen = (size_t)(sc->p - 1 - *k);
    if (!plain(*k, *klen)) return -1;
    ws(sc);
    if (sc->p >= sc->end || *sc->p != ':') return -1;
    sc->p++;
    ws(sc);
    return sc->p < sc->end ? 0 : -1;
}

static int parse_args(Scan *sc, uint32_t *rare) {
    /* at '{' */
    sc->p++;
    uint64_t seen = 0;
    ws(sc);
    if (sc->p < sc->end && *sc->p == '}') { sc->p++; return 0; }
    for (;;) {
        const unsigned char *k;
        size_t klen;
        if (object_key(sc, &k, &klen) < 0) return -1;
        int f = -1, s = -1, r = -1, xyz = 0;
        switch (k[0]) {
        case 'E': if (KEY("External id")) f = F_EXT; break;
        case 'e': if (KEY("external id")) f = F_EXT_LC; else if (KEY("est. achieved occupancy %")) f = F_OCC; break;
        case 'c': if (KEY("correlation")) f = F_CORR; break;
        case 's': if (KEY("stream")) f = F_STREAM; else if (KEY("shared memory")) f = F_SHMEM; break;
        case 'd': if (KEY("device")) f = F_DEVICE; else if (KEY("dtype")) s = S_DTYPE; break;
        case 'g': if (KEY("grid")) xyz = 1; break;
        case 'b': if (KEY("block")) xyz = 2; else if (KEY("bytes")) f = F_BYTES; break;
        case 'r': if (KEY("registers per thread")) f = F_REGS; break;
        case 'C': if (KEY("Collective name")) s = S_COLL; else if (KEY("Concrete Inputs")) r = R_CONCRETE; break;
        case 'I':
            if (KEY("In msg nelems")) f = F_IN_NEL;
            else if (KEY("Input Dims")) r = R_DIMS;
            else if (KEY("Input dims")) r = R_DIMS_LC;
            else if (KEY("Input type")) r = R_TYPE;
            else if (KEY("Input Strides")) r = R_STRIDES;
            break;
        case 'O': if (KEY("Out msg nelems")) f = F_OUT_NEL; break;
        case 'G': if (KEY("Group size")) f = F_GROUP; break;
        case 'P': if (KEY("Process Group Name")) s = S_PG_NAME; else if (KEY("Process Group ID")) s = S_PG_ID; break;
        case 'S': if (KEY("Seq")) f = F_SEQ; else if (KEY("Sequence number")) f = F_SEQNUM; break;
        case 'F': if (KEY("Fwd thread id")) f = F_FWD_TID; break;
        case 'B': if (KEY("Bytes")) f = F_MEM_BYTES; break;
        case 'T': if (KEY("Total Allocated")) f = F_TOT_ALLOC; else if (KEY("Total Reserved")) f = F_TOT_RES; break;
        case 'D': if (KEY("Device Id")) f = F_DEV_ID; else if (KEY("Device Type")) f = F_DEV_TYPE; break;
        default: break;
        }
        int slot = f >= 0 ? f : s >= 0 ? N_NUM + s : r >= 0 ? N_NUM + N_STR + r : xyz ? N_NUM + N_STR + N_RAW + xyz : -1;
        if (slot >= 0) {
            if (seen & (1ULL << slot)) return -1; /* a duplicated key: msgspec's choice is not ours to guess */
            seen |= 1ULL << slot;
        }
        int rc;
        if (f >= 0) rc = num_field(sc, f, rare, 0);
        else if (s >= 0) {
            if (*sc->p == 'n' && sc->end - sc->p >= 4 && memcmp(sc->p, "null", 4) == 0) { sc->p += 4; rc = 0; }
            else rc = raw_field(sc, &sc->strs, &COL(sc->str[s], int32_t)[sc->n]);
        }
        else if (r >= 0) rc = raw_field(sc, &sc->raws, &COL(sc->raw[r], int32_t)[sc->n]);
        else if (xyz) rc = xyz_field(sc, xyz == 1 ? &sc->grid : &sc->block, xyz == 1 ? BIT_GRID : BIT_BLOCK, rare);
        else rc = skip_value(sc);
        if (rc < 0) return -1;
        ws(sc);
        if (sc->p >= sc->end) return -1;
        if (*sc->p == ',') { sc->p++; continue; }
        if (*sc->p == '}') { sc->p++; return 0; }
        return -1;
    }
}

static int parse_event(Scan *sc) {
    Py_ssize_t i = sc->n; /* the row's defaults were written by fill_defaults */
    uint32_t rare = 0;
    int32_t name = -2;
    unsigned seen = 0;

    if (sc->p >= sc->end || *sc->p != '{') return -1;
    sc->p++;
    ws(sc);
    if (sc->p < sc->end && *sc->p == '}') { sc->p++; goto done; }
    for (;;) {
        const unsigned char *k;
        size_t klen;
        if (object_key(sc, &k, &klen) < 0) return -1;
        int which = -1;
        if (KEY("ph")) which = 0;
        else if (KEY("cat")) which = 1;
        else if (KEY("name")) which = 2;
        else if (KEY("pid")) which = 3;
        else if (KEY("tid")) which = 4;
        else if (KEY("ts")) which = 5;
        else if (KEY("dur")) which = 6;
        else if (KEY("args")) which = 7;
        if (which >= 0) {
            if (seen & (1u << which)) return -1;
            seen |= 1u << which;
        }
        int rc = 0;
        switch (which) {
        case 0: /* ph: "X", "i" or anything else */
        case 1: { /* cat: one of CATS, else -1 */
            if (*sc->p != '"') {
                if (*sc->p == '-' || (*sc->p >= '0' && *sc->p <= '9')) {
                    double d; int is_int; int64_t iv;
                    int k = parse_number(sc, &d, &is_int, &iv);
                    rc = k == K_REFUSE || k == K_RANGE ? -1 : 0;
                } else rc = event_value(sc);
                break;
            }
            const unsigned char *v = sc->p + 1;
            int e = 0;
            if (skip_string(sc, &e) < 0) return -1;
            size_t vl = (size_t)(sc->p - 1 - v);
            if (e || !plain(v, vl)) return -1;
            if (which == 0) {
                COL(sc->ph, uint8_t)[i] = vl == 1 && v[0] == 'X' ? 1 : vl == 1 && v[0] == 'i' ? 2 : 0;
            } else {
                for (int c = 0; c < N_CATS; c++)
                    if (strlen(CATS[c]) == vl && memcmp(CATS[c], v, vl) == 0) { COL(sc->cat, int8_t)[i] = (int8_t)c; break; }
            }
            break;
        }
        case 2: { /* name: a string (msgspec refuses others: so do we) */
            if (*sc->p != '"') return -1;
            const unsigned char *v = sc->p + 1;
            int e = 0;
            if (skip_string(sc, &e) < 0) return -1;
            name = intern(sc, &sc->names, v, (size_t)(sc->p - 1 - v));
            if (name < 0) return -1;
            break;
        }
        case 3: rc = num_field(sc, F_PID, &rare, 1); break;
        case 4: rc = num_field(sc, F_TID, &rare, 1); break;
        case 5: rc = num_field(sc, F_TS, &rare, 1); break;
        case 6: rc = num_field(sc, F_DUR, &rare, 1); break;
        case 7:
            if (*sc->p == '{') rc = parse_args(sc, &rare);
            else if (*sc->p == 'n' && sc->end - sc->p >= 4 && memcmp(sc->p, "null", 4) == 0) sc->p += 4;
            else return -1; /* args that are no object: msgspec's error, worded by the msgspec path */
            break;
        default: rc = skip_value(sc);
        }
        if (rc < 0) return -1;
        ws(sc);
        if (sc->p >= sc->end) return -1;
        if (*sc->p == ',') { sc->p++; continue; }
        if (*sc->p == '}') { sc->p++; break; }
        return -1;
    }
done:
    if (name == -2) { /* no name: "" (the struct's default) */
        name = intern(sc, &sc->names, sc->base, 0);
        if (name < 0) return -1;
    }
    COL(sc->name, int32_t)[i] = name;
    COL(sc->rare, uint32_t)[i] = rare;
    return 0;
}

static PyObject *table_out(Table *t) {
    PyObject *off = PyBytes_FromStringAndSize((const char *)t->off, (Py_ssize_t)(t->n * sizeof(int64_t)));
    PyObject *len = PyBytes_FromStringAndSize((const char *)t->len, (Py_ssize_t)(t->n * sizeof(int32_t)));
    if (!off || !len) { Py_XDECREF(off); Py_XDECREF(len); return NULL; }
    return Py_BuildValue("(NN)", off, len);
}

/* The events array at sc->p ('['), scanned to its closing bracket. 0, 1 (refused) or 2 (no memory). */
static int scan_array(Scan *sc) {
    sc->p++;
    ws(sc);
    if (sc->p < sc->end && *sc->p == ']') { sc->p++; return 0; }
    for (;;) {
        if (sc->n == sc->cap) {
            Py_BLOCK_THREADS_SC
            int g = grow(sc);
            Py_UNBLOCK_THREADS_SC
            if (g < 0) return 2;
        }
        if (sc->n == sc->filled) {
            Py_ssize_t b = sc->filled + FILL_ROWS < sc->cap ? sc->filled + FILL_ROWS : sc->cap;
            fill_defaults(sc, sc->filled, b);
            sc->filled = b;
        }
        ws(sc);
        if (parse_event(sc) < 0) return 1;
        sc->n++;
        ws(sc);
        if (sc->p >= sc->end) return 1;
        if (*sc->p == ',') { sc->p++; continue; }
        if (*sc->p == ']') { sc->p++; return 0; }
        return 1;
    }
}

/* The whole document: a bare event array, or an object whose one "traceEvents" key holds the
 * array; every other value is skipped (validated: msgspec decodes that part again, see
 * columnar.scan). Sets *a and *b to the array's span. 0, 1 (refused) or 2 (no memory). */
static int scan_document(Scan *sc, Py_ssize_t *a, Py_ssize_t *b, int *bare) {
    ws(sc);
    if (sc->p >= sc->end) return 1;
    if (*sc->p == '[') {
        *bare = 1;
        *a = sc->p - sc->base;
        int r = scan_array(sc);
        if (r) return r;
        *b = sc->p - sc->base;
    } else if (*sc->p == '{') {
        int found = 0;
        sc->p++;
        for (;;) {
            ws(sc);
            if (sc->p >= sc->end || *sc->p != '"') return 1;
            const unsigned char *k = sc->p + 1;
            int esc = 0;
            if (skip_string(sc, &esc) < 0 || esc) return 1;
            size_t klen = (size_t)(sc->p - 1 - k);
            ws(sc);
            if (sc->p >= sc->end || *sc->p != ':') return 1;
            sc->p++;
            ws(sc);
            if (sc->p >= sc->end) return 1;
            if (KEY("traceEvents")) {
                if (found || *sc->p != '[') return 1;
                found = 1;
                *a = sc->p - sc->base;
                int r = scan_array(sc);
                if (r) return r;
                *b = sc->p - sc->base;
            } else if (skip_value(sc) < 0) return 1;
            ws(sc);
            if (sc->p >= sc->end) return 1;
            if (*sc->p == ',') { sc->p++; continue; }
            if (*sc->p == '}') { sc->p++; break; }
            return 1;
        }
        if (!found) return 1;
    } else return 1;
    ws(sc);
    return sc->p == sc->end ? 0 : 1;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    Scan sc;
    memset(&sc, 0, sizeof(sc));
    sc.base = (const unsigned char *)view.buf;
    sc.p = sc.base;
    sc.end = sc.base + view.len;
    sc.cap = view.len / 256 + 64;
    Py_ssize_t a = 0, b = 0;
    int bare = 0;
    PyObject *result = NULL;
    int ok = 1;
    if (table_init(&sc.names) < 0 || table_init(&sc.strs) < 0 || table_init(&sc.raws) < 0) { PyErr_NoMemory(); goto out; }
    ok = col_init(&sc.ph, 1, sc.cap) == 0 && col_init(&sc.cat, 1, sc.cap) == 0 && col_init(&sc.name, 4, sc.cap) == 0 &&
         col_init(&sc.rare, 4, sc.cap) == 0 && col_init(&sc.grid, 24, sc.cap) == 0 && col_init(&sc.block, 24, sc.cap) == 0;
    for (int f = 0; ok && f < N_NUM; f++) ok = col_init(&sc.num[f], 8, sc.cap) == 0;
    for (int s = 0; ok && s < N_STR; s++) ok = col_init(&sc.str[s], 4, sc.cap) == 0;
    for (int r = 0; ok && r < N_RAW; r++) ok = col_init(&sc.raw[r], 4, sc.cap) == 0;
    if (!ok) goto out;

    int refused;
    Py_BEGIN_ALLOW_THREADS
    sc.save = _save;
    refused = scan_document(&sc, &a, &b, &bare);
    _save = sc.save;
    Py_END_ALLOW_THREADS
    if (refused == 2) goto out; /* MemoryError set */
    if (refused) { result = Py_None; Py_INCREF(result); goto out; }

    Col *c;
    for (int i = 0; (c = all_cols(&sc, i)) != NULL; i++)
        if (PyByteArray_Resize(c->buf, c->item * sc.n) < 0) goto out;
    PyObject *d = PyDict_New();
    if (!d) goto out;
#define PUT(key, obj) do { if (PyDict_SetItemString(d, key, obj) < 0) { Py_DECREF(d); goto out; } } while (0)
    PUT("ph", sc.ph.buf); PUT("cat", sc.cat.buf); PUT("name", sc.name.buf); PUT("rare", sc.rare.buf);
    PUT("grid", sc.grid.buf); PUT("block", sc.block.buf);
    for (int f = 0; f < N_NUM; f++) PUT(NUM_NAMES[f], sc.num[f].buf);
    for (int s = 0; s < N_STR; s++) PUT(STR_NAMES[s], sc.str[s].buf);
    for (int r = 0; r < N_RAW; r++) PUT(RAW_NAMES[r], sc.raw[r].buf);
    Table *tabs[] = {&sc.names, &sc.strs, &sc.raws};
    const char *tnames[] = {"names_table", "strs_table", "raws_table"};
    for (int t = 0; t < 3; t++) {
        PyObject *o = table_out(tabs[t]);
        if (!o) { Py_DECREF(d); goto out; }
        int rc = PyDict_SetItemString(d, tnames[t], o);
        Py_DECREF(o);
        if (rc < 0) { Py_DECREF(d); goto out; }
    }
    PyObject *span = Py_BuildValue("(nni)", a, b, bare);
    if (!span) { Py_DECREF(d); goto out; }
    int rs = PyDict_SetItemString(d, "span", span);
    Py_DECREF(span);
    if (rs < 0) { Py_DECREF(d); goto out; }
    PyObject *n = PyLong_FromSsize_t(sc.n);
    if (!n) { Py_DECREF(d); goto out; }
    int rc = PyDict_SetItemString(d, "events", n);
    Py_DECREF(n);
    if (rc < 0) { Py_DECREF(d); goto out; }
    result = d;
out:
    {
        Col *cc;
        for (int i = 0; (cc = all_cols(&sc, i)) != NULL; i++) Py_XDECREF(cc->buf);
    }
    table_free(&sc.names); table_free(&sc.strs); table_free(&sc.raws);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(document) -> dict | None: the columns of the events of a Kineto JSON document."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__columns(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "BIT_GRID", BIT_GRID) < 0 || PyModule_AddIntConstant(m, "BIT_BLOCK", BIT_BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *names = PyTuple_New(N_NUM);
    if (!names) { Py_DECREF(m); return NULL; }
    for (int f = 0; f < N_NUM; f++) PyTuple_SET_ITEM(names, f, PyUnicode_FromString(NUM_NAMES[f]));
    if (PyModule_AddObject(m, "NUMERIC", names) < 0) { Py_DECREF(names); Py_DECREF(m); return NULL; }
    return m;
}
