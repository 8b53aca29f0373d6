/* The exact search over executed sets of roam_cli/order/ideals.py (`below`), in C.
 *
 * ideals.py is the reference: this is the same search, state for state (same moves in the same
 * order, same forced blocks, same visited sets and counts), so the tests compare the two, and
 * ideals.py documents the algorithm. What the C version does differently to get the same result:
 *
 * - Sets of nodes are fixed-width bitsets of W 64-bit words instead of Python integers; the
 *   visited sets live in an open-addressing hash table over their words.
 * - The depth-first stack is flat arrays indexed by depth (done set, ready set, live bytes, the
 *   run that led there); a frame's moves sit in one growable stack above its parent's and are
 *   popped from its end, so a move is generated once and tested against the visited sets when
 *   popped (the reference also filters when generating, which skips the same moves).
 * - Out of budget (visited sets or deadline) is a return code, not an exception.
 *
 * The inputs come from ideals.Space.arrays() as int64 buffers (array('q')); see below(). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int64_t i64;
typedef uint64_t u64;

/* must equal ideals.py's constants of the same names */
#define BLOCK_NODES 24
#define BLOCK_IDEALS 256

enum { EXHAUSTED = 0, FOUND = 1, OUT_OF_BUDGET = -1, NO_MEMORY = -2, INTERRUPTED = -3 };

typedef struct {
    Py_ssize_t n, W, B;
    u64 *pred_mask, *near, *alloc_mask, *reader_mask, *sources, *full; /* n*W, n*W, B*W, B*W, W, W */
    char *alloc_empty;
    const i64 *size, *to_end, *touch_start, *touch, *succ_start, *succ;
    i64 start_live;
} Space;

static inline int has(const u64 *m, i64 v) { return (int)((m[v >> 6] >> (v & 63)) & 1); }
static inline void set(u64 *m, i64 v) { m[v >> 6] |= (u64)1 << (v & 63); }
static inline void clear(u64 *m, i64 v) { m[v >> 6] &= ~((u64)1 << (v & 63)); }

static inline int subset(const u64 *a, const u64 *b, Py_ssize_t W) {
    for (Py_ssize_t i = 0; i < W; i++)
        if (a[i] & ~b[i]) return 0;
    return 1;
}

static inline int meets(const u64 *a, const u64 *b, Py_ssize_t W) {
    for (Py_ssize_t i = 0; i < W; i++)
        if (a[i] & b[i]) return 1;
    return 0;
}

/* Space.step: (live bytes at v's step, live bytes after it) when v runs after `done`. */
static void step(const Space *S, const u64 *done, i64 v, i64 live, i64 *at, i64 *after) {
    const Py_ssize_t W = S->W;
    i64 grown = 0, freed = 0;
    for (i64 k = S->touch_start[v]; k < S->touch_start[v + 1]; k++) {
        const i64 b = S->touch[k];
        const u64 *m = S->alloc_mask + b * W, *r = S->reader_mask + b * W;
        const int fresh = has(m, v) && !meets(m, done, W);
        if (fresh) grown += S->size[b];
        if (S->to_end[b] || !(fresh || S->alloc_empty[b] || meets(m, done, W))) continue;
        int all_read = 1; /* every reader in done + {v} */
        for (Py_ssize_t i = 0; i < W && all_read; i++) {
            u64 x = r[i] & ~done[i];
            if (i == (v >> 6)) x &= ~((u64)1 << (v & 63));
            all_read = !x;
        }
        if (all_read && (has(r, v) || fresh)) freed += S->size[b];
    }
    *at = live + grown;
    *after = live + grown - freed;
}

/* The ready set after `run` took done to nxt (Space.ready_after), in place. */
static void ready_after(const Space *S, u64 *ready, const u64 *nxt, const i64 *run, i64 len) {
    for (i64 k = 0; k < len; k++) clear(ready, run[k]);
    for (i64 k = 0; k < len; k++)
        for (i64 j = S->succ_start[run[k]]; j < S->succ_start[run[k] + 1]; j++) {
            const i64 w = S->succ[j];
            if (!has(nxt, w) && subset(S->pred_mask + w * S->W, nxt, S->W)) set(ready, w);
        }
}

typedef struct {
    u64 *keys;  /* (2 * BLOCK_IDEALS + 2) * W: the block's own down-sets */
    i64 *lives; /* live bytes after done + each of them */
    u64 *now, *near, *tmp;
} BlockScratch;

/* Space.block: a forced block from `done` starting with v, into run/len, *now and *lv; 0 if none. */
static int block(const Space *S, BlockScratch *X, const u64 *done, i64 live, i64 v, i64 after, i64 limit,
                 i64 *run, i64 *len, i64 *left) {
    const Py_ssize_t W = S->W;
    Py_ssize_t count = 2;
    i64 lv = after, rl = 1;
    run[0] = v;
    memcpy(X->now, done, W * sizeof(u64));
    set(X->now, v);
    memset(X->keys, 0, 2 * W * sizeof(u64));
    set(X->keys + W, v);
    X->lives[0] = live;
    X->lives[1] = after;
    memcpy(X->near, S->near + v * W, W * sizeof(u64));
    for (;;) {
        i64 least = X->lives[0];
        for (Py_ssize_t j = 1; j < count; j++)
            if (X->lives[j] < least) least = X->lives[j];
        if (lv <= least) break;
        if (rl == BLOCK_NODES) return 0;
        int found = 0;
        i64 best_left = 0, best_at = 0, best_w = 0;
        for (Py_ssize_t i = 0; i < W; i++) {
            u64 rest = X->near[i] & ~X->now[i];
            while (rest) {
                const i64 w = (i64)i * 64 + __builtin_ctzll(rest);
                rest &= rest - 1;
                if (!subset(S->pred_mask + w * W, X->now, W)) continue;
                i64 at, left;
                step(S, X->now, w, lv, &at, &left);
                if (at <= limit && (!found || left < best_left || (left == best_left && at < best_at))) {
                    found = 1; /* w ascending: the first of equal (left, at) is the least w */
                    best_left = left, best_at = at, best_w = w;
                }
            }
        }
        if (!found) return 0;
        lv = best_left;
        const i64 w = best_w;
        const Py_ssize_t before = count;
        for (Py_ssize_t j = 0; j < before; j++) {
            for (Py_ssize_t i = 0; i < W; i++) X->tmp[i] = done[i] | X->keys[j * W + i];
            if (!subset(S->pred_mask + w * W, X->tmp, W)) continue;
            i64 at_unused;
            step(S, X->tmp, w, X->lives[j], &at_unused, &X->lives[count]);
            memcpy(X->keys + count * W, X->keys + j * W, W * sizeof(u64));
            set(X->keys + count * W, w);
            count++;
        }
        if (count > BLOCK_IDEALS) return 0;
        run[rl++] = w;
        set(X->now, w);
        for (Py_ssize_t i = 0; i < W; i++) X->near[i] |= S->near[w * W + i];
    }
    *len = rl;
    *left = lv;
    return 1;
}

/* visited down-sets: open addressing over their words */
typedef struct {
    u64 *keys;
    i64 *slots; /* index into keys, -1 empty */
    Py_ssize_t W, count, cap;
} Seen;

static u64 hash_words(const u64 *k, Py_ssize_t W) {
    u64 h = 0x9E3779B97F4A7C15ull;
    for (Py_ssize_t i = 0; i < W; i++) {
        h ^= k[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

static int seen_grow(Seen *s) {
    Py_ssize_t cap = s->cap ? s->cap * 2 : 1024;
    i64 *slots = malloc(cap * sizeof(i64));
    u64 *keys = realloc(s->keys, (cap / 2 + 1) * s->W * sizeof(u64));
    if (!slots || !keys) {
        free(slots);
        if (keys) s->keys = keys;
        return 0;
    }
    s->keys = keys;
    for (Py_ssize_t i = 0; i < cap; i++) slots[i] = -1;
    for (Py_ssize_t k = 0; k < s->count; k++) {
        Py_ssize_t i = hash_words(keys + k * s->W, s->W) & (cap - 1);
        while (slots[i] >= 0) i = (i + 1) & (cap - 1);
        slots[i] = k;
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return 1;
}

/* 1 if `key` was already there, 0 if added, -1 out of memory */
static int seen_add(Seen *s, const u64 *key) {
    if (2 * (s->count + 1) > s->cap && !seen_grow(s)) return -1;
    Py_ssize_t i = hash_words(key, s->W) & (s->cap - 1);
    while (s->slots[i] >= 0) {
        if (!memcmp(s->keys + s->slots[i] * s->W, key, s->W * sizeof(u64))) return 1;
        i = (i + 1) & (s->cap - 1);
    }
    memcpy(s->keys + s->count * s->W, key, s->W * sizeof(u64));
    s->slots[i] = s->count++;
    return 0;
}

typedef struct {
    i64 after, v, len; /* len 0: node v alone; else the frame's forced block of len nodes, stored at its depth */
} Move;

typedef struct {
    u64 *done, *ready;       /* (n + 1) * W: per depth */
    i64 *live, *lo, *hi;     /* per depth: live bytes, the frame's moves [lo, hi) */
    char *generated;         /* per depth */
    i64 *path_lo, *path_len; /* per depth >= 1: the run that led there, in path */
    i64 *path, *blocks;      /* n; (n + 1) * BLOCK_NODES */
    Move *moves;
    Py_ssize_t moves_cap;
    struct {
        i64 after, at, v;
    } *options;              /* n */
} Stack;

static int cmp_option(const void *a, const void *b) {
    const i64 *x = a, *y = b;
    for (int i = 0; i < 3; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

static int push_move(Stack *T, Py_ssize_t at, Move m) {
    if (at >= T->moves_cap) {
        Py_ssize_t cap = T->moves_cap * 2;
        Move *moves = realloc(T->moves, cap * sizeof(Move));
        if (!moves) return 0;
        T->moves = moves, T->moves_cap = cap;
    }
    T->moves[at] = m;
    return 1;
}

/* moves_from: the frame at depth d gets its moves, least live after on top */
static int moves_from(const Space *S, BlockScratch *X, Stack *T, Py_ssize_t d, i64 limit) {
    const Py_ssize_t W = S->W;
    const u64 *done = T->done + d * W, *ready = T->ready + d * W;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < W; i++) {
        u64 rest = ready[i];
        while (rest) {
            const i64 v = (i64)i * 64 + __builtin_ctzll(rest);
            rest &= rest - 1;
            i64 at, after;
            step(S, done, v, T->live[d], &at, &after);
            if (at <= limit) T->options[k].after = after, T->options[k].at = at, T->options[k++].v = v;
        }
    }
    qsort(T->options, k, sizeof(T->options[0]), cmp_option);
    T->hi[d] = T->lo[d];
    for (Py_ssize_t j = 0; j < k; j++) {
        i64 len, left;
        if (block(S, X, done, T->live[d], T->options[j].v, T->options[j].after, limit, T->blocks + d * BLOCK_NODES,
                  &len, &left)) {
            Move m = {left, -1, len};
            return push_move(T, T->hi[d]++, m);
        }
    }
    for (Py_ssize_t j = k - 1; j >= 0; j--) { /* popped from the end: least (after, at, v) first */
        Move m = {T->options[j].after, T->options[j].v, 0};
        if (!push_move(T, T->hi[d]++, m)) return 0;
    }
    return 1;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* the search; on FOUND the order is path[0:*order_len] */
static int search(const Space *S, Stack *T, BlockScratch *X, Seen *seen, i64 limit, i64 budget, double seconds,
                  i64 *visited, i64 *order_len) {
    const Py_ssize_t W = S->W;
    const double deadline = seconds_now() + seconds;
    memset(T->done, 0, W * sizeof(u64));
    memcpy(T->ready, S->sources, W * sizeof(u64));
    T->live[0] = S->start_live;
    T->lo[0] = T->hi[0] = 0;
    T->generated[0] = 0;
    T->path_lo[0] = T->path_len[0] = 0;
    if (seen_add(seen, T->done) < 0) return NO_MEMORY;
    Py_ssize_t d = 0;
    while (d >= 0) {
        u64 *done = T->done + d * W;
        if (!T->generated[d]) {
            if (!memcmp(done, S->full, W * sizeof(u64))) {
                *order_len = T->path_lo[d] + T->path_len[d];
                return FOUND;
            }
            if (!moves_from(S, X, T, d, limit)) return NO_MEMORY;
            T->generated[d] = 1;
        }
        if (T->hi[d] == T->lo[d]) {
            d--;
            continue;
        }
        const Move m = T->moves[--T->hi[d]];
        u64 *nxt = T->done + (d + 1) * W;
        memcpy(nxt, done, W * sizeof(u64));
        const i64 *run = m.len ? T->blocks + d * BLOCK_NODES : &m.v;
        const i64 len = m.len ? m.len : 1;
        for (i64 r = 0; r < len; r++) set(nxt, run[r]);
        const int was = seen_add(seen, nxt);
        if (was < 0) return NO_MEMORY;
        if (was) continue;
        ++*visited;
        if (*visited > budget || seconds_now() > deadline) return OUT_OF_BUDGET;
        if ((*visited & 4095) == 0 && PyErr_CheckSignals()) return INTERRUPTED;
        const i64 base = T->path_lo[d] + T->path_len[d];
        memcpy(T->path + base, run, len * sizeof(i64));
        memcpy(T->ready + (d + 1) * W, T->ready + d * W, W * sizeof(u64));
        ready_after(S, T->ready + (d + 1) * W, nxt, run, len);
        d++;
        T->live[d] = m.after;
        T->lo[d] = T->hi[d] = T->hi[d - 1];
        T->generated[d] = 0;
        T->path_lo[d] = base;
        T->path_len[d] = len;
    }
    return EXHAUSTED;
}

static void fill_masks(u64 *masks, Py_ssize_t W, const i64 *start, const i64 *members, Py_ssize_t rows) {
    for (Py_ssize_t r = 0; r < rows; r++)
        for (i64 k = start[r]; k < start[r + 1]; k++) set(masks + r * W, members[k]);
}

/* below(n, B, pred_start, pred, succ_start, succ, touch_start, touch, near_start, near, size,
 *       alloc_start, alloc, reader_start, reader, to_end, start_live, limit, budget, seconds)
 * (the lists as CSR: X_start[r]..X_start[r + 1] index X)
 * -> (status, visited, order or None): status 1 found, 0 no order within limit, -1 out of budget. */
static PyObject *below(PyObject *self, PyObject *args) {
    Py_ssize_t n, B;
    Py_buffer in[14];
    i64 start_live, limit, budget;
    double seconds;
    memset(in, 0, sizeof(in));
    if (!PyArg_ParseTuple(args, "nny*y*y*y*y*y*y*y*y*y*y*y*y*y*LLLd", &n, &B, &in[0], &in[1], &in[2], &in[3],
                          &in[4], &in[5], &in[6], &in[7], &in[8], &in[9], &in[10], &in[11], &in[12], &in[13],
                          &start_live, &limit, &budget, &seconds))
        return NULL;
    const i64 *I[14];
    for (int k = 0; k < 14; k++) I[k] = in[k].buf;
    const Py_ssize_t W = n / 64 + 1;
    Space S = {n, W, B};
    S.size = I[8], S.to_end = I[13], S.touch_start = I[4], S.touch = I[5], S.succ_start = I[2], S.succ = I[3];
    S.start_live = start_live;
    Stack T = {0};
    BlockScratch X = {0};
    Seen seen = {NULL, NULL, W, 0, 0};
    S.pred_mask = calloc(n * W, sizeof(u64));
    S.near = calloc(n * W, sizeof(u64));
    S.alloc_mask = calloc(B * W + 1, sizeof(u64));
    S.reader_mask = calloc(B * W + 1, sizeof(u64));
    S.sources = calloc(W, sizeof(u64));
    S.full = calloc(W, sizeof(u64));
    S.alloc_empty = calloc(B + 1, 1);
    T.done = calloc((n + 2) * W, sizeof(u64));
    T.ready = calloc((n + 2) * W, sizeof(u64));
    T.live = calloc(n + 2, sizeof(i64));
    T.lo = calloc(n + 2, sizeof(i64));
    T.hi = calloc(n + 2, sizeof(i64));
    T.generated = calloc(n + 2, 1);
    T.path_lo = calloc(n + 2, sizeof(i64));
    T.path_len = calloc(n + 2, sizeof(i64));
    T.path = calloc(n + 1, sizeof(i64));
    T.blocks = calloc((n + 2) * BLOCK_NODES, sizeof(i64));
    T.options = calloc(n + 1, sizeof(T.options[0]));
    T.moves_cap = 4 * (n + 1);
    T.moves = malloc(T.moves_cap * sizeof(Move));
    X.keys = calloc((2 * BLOCK_IDEALS + 2) * W, sizeof(u64));
    X.lives = calloc(2 * BLOCK_IDEALS + 2, sizeof(i64));
    X.now = calloc(W, sizeof(u64));
    X.near = calloc(W, sizeof(u64));
    X.tmp = calloc(W, sizeof(u64));
    int status = NO_MEMORY;
    i64 visited = 0, order_len = 0;
    if (S.pred_mask && S.near && S.alloc_mask && S.reader_mask && S.sources && S.full && S.alloc_empty && T.done &&
        T.ready && T.live && T.lo && T.hi && T.generated && T.path_lo && T.path_len && T.path && T.blocks &&
        T.options && T.moves && X.keys && X.lives && X.now && X.near && X.tmp) {
        fill_masks(S.pred_mask, W, I[0], I[1], n);
        fill_masks(S.near, W, I[6], I[7], n);
        fill_masks(S.alloc_mask, W, I[9], I[10], B);
        fill_masks(S.reader_mask, W, I[11], I[12], B);
        for (Py_ssize_t b = 0; b < B; b++) S.alloc_empty[b] = I[9][b] == I[9][b + 1];
        for (Py_ssize_t v = 0; v < n; v++) {
            set(S.full, v);
            if (I[0][v] == I[0][v + 1]) set(S.sources, v);
        }
        status = search(&S, &T, &X, &seen, limit, budget, seconds, &visited, &order_len); /* holds the GIL: Ctrl-C */
    }
    PyObject *result = NULL;
    if (status == INTERRUPTED) {
        PyErr_CheckSignals();
    } else if (status == NO_MEMORY) {
        PyErr_NoMemory();
    } else {
        PyObject *order = Py_None;
        Py_INCREF(order);
        if (status == FOUND) {
            Py_DECREF(order);
            order = PyList_New(order_len);
            for (i64 k = 0; order && k < order_len; k++) PyList_SET_ITEM(order, k, PyLong_FromLongLong(T.path[k]));
        }
        if (order) result = Py_BuildValue("iLN", status, (long long)visited, order);
    }
    free(S.pred_mask), free(S.near), free(S.alloc_mask), free(S.reader_mask), free(S.sources), free(S.full);
    free(S.alloc_empty), free(T.done), free(T.ready), free(T.live), free(T.lo), free(T.hi), free(T.generated);
    free(T.path_lo), free(T.path_len), free(T.path), free(T.blocks), free(T.options), free(T.moves);
    free(X.keys), free(X.lives), free(X.now), free(X.near), free(X.tmp), free(seen.keys), free(seen.slots);
    for (int k = 0; k < 14; k++) PyBuffer_Release(&in[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"below", below, METH_VARARGS, "The exact search of roam_cli.order.ideals for one limit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ideals",
                                    "roam_cli.order.ideals's exact search, in C", -1, methods};

PyMODINIT_FUNC PyInit__ideals(void) { return PyModule_Create(&module); }
