/* The canonical layout search of roam_cli/layout/search.py, in C.
 *
 * search.py is the reference: this is the same search, node for node (same candidates in the
 * same order, same pruning, same learnt section weights, same node and backtrack counts), so the
 * tests compare the two.  search.py documents the algorithm; comments here say only what the
 * C version does differently to get the same result:
 *
 * - Lists become flat int64 arrays in one growable stack ("arena"): a chunk of a node's
 *   candidates lives above its caller's and is popped when the node returns (see gather); its
 *   child's component is its own with the placed buffer taken out in place (and put back on
 *   failure), so memory is the depth of the search times a chunk, not the depth times the
 *   component or all its candidates.  A split copies the component into its groups.  The arena
 *   may move when it grows, so positions in it are indices, never pointers kept across a call.
 * - Sections whose witness was the placed buffer are found by scanning the buffer's own
 *   sections (a witness is always a member of its section), so no per-buffer sets are needed.
 * - Aborts (node limit, deadline, Ctrl-C) are return codes, not exceptions; the state is left
 *   as it is, since the caller starts every solve from scratch.
 *
 * The inputs come from CanonicalSearch as int64 buffers (array('q')); see run(). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int64_t i64;

#define INF ((i64)1 << 62)

enum { EXHAUSTED = 0, FOUND = 1, NODE_LIMIT = -1, DEADLINE = -2, NO_MEMORY = -3, INTERRUPTED = -4 };

typedef struct {
    /* the problem: n buffers, S sections */
    Py_ssize_t n, S;
    const i64 *size, *slo, *shi, *mem_start, *mem, *ovl_start, *ovl, *twin_prev;
    i64 *rank;
    i64 C, *weights;
    /* the ranking's keys: ncols columns of n (smaller first), dynamic[c] for T columns, which
     * are recomputed into tnow[] from the unplaced bytes when the problem splits */
    const i64 *keys, *dynamic;
    Py_ssize_t ncols;
    i64 *tnow;
    /* the state of the search */
    i64 *minoff, *top, *offset, *total, *cuts, *witness;
    char *placed, *fixed;
    /* undo: one (buffer, offset, first change) per placement; changes are (buffer, old minoff),
     * grown as needed (sized to every overlap, they were gigabytes on a 70B-class step) */
    i64 *trail_b, *trail_x, *trail_changes;
    Py_ssize_t trail_len;
    i64 *change_o, *change_old;
    Py_ssize_t change_len, change_cap;
    i64 *arena;
    Py_ssize_t arena_len, arena_cap;
    i64 nodes, backtracks, node_limit;
    Py_ssize_t chunk; /* candidates gathered at a time (see gather) */
    struct timespec deadline;
} Search;

/* Room for k more int64 on the arena; returns the index of the first, or -1. */
static Py_ssize_t push(Search *s, Py_ssize_t k) {
    if (s->arena_len + k > s->arena_cap) {
        Py_ssize_t cap = 2 * (s->arena_len + k);
        i64 *grown = realloc(s->arena, (size_t)cap * sizeof(i64));
        if (!grown) return -1;
        s->arena = grown;
        s->arena_cap = cap;
    }
    Py_ssize_t at = s->arena_len;
    s->arena_len += k;
    return at;
}

/* Room for k more changes on the undo trail; 0 when out of memory. */
static int reserve_changes(Search *s, Py_ssize_t k) {
    if (s->change_len + k <= s->change_cap) return 1;
    Py_ssize_t cap = 2 * (s->change_len + k);
    i64 *o = realloc(s->change_o, (size_t)cap * sizeof(i64));
    if (!o) return 0;
    s->change_o = o;
    i64 *old = realloc(s->change_old, (size_t)cap * sizeof(i64));
    if (!old) return 0;
    s->change_old = old;
    s->change_cap = cap;
    return 1;
}

static int past_deadline(const Search *s) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > s->deadline.tv_sec ||
           (now.tv_sec == s->deadline.tv_sec && now.tv_nsec > s->deadline.tv_nsec);
}

static i64 max_total(const Search *s, i64 from, i64 to) {
    i64 m = s->total[from];
    for (i64 k = from + 1; k < to; ++k)
        if (s->total[k] > m) m = s->total[k];
    return m;
}

/* A new witness for section sec (its last member with min offset <= room); 0 if none. */
static int refresh(Search *s, i64 sec, i64 room) {
    for (i64 k = s->mem_start[sec + 1] - 1; k >= s->mem_start[sec]; --k) {
        i64 w = s->mem[k];
        if (s->minoff[w] <= room) {
            s->witness[sec] = w;
            return 1;
        }
    }
    return 0;
}

static void unplace(Search *s) {
    Py_ssize_t t = --s->trail_len;
    i64 b = s->trail_b[t], x = s->trail_x[t], sz = s->size[b];
    for (i64 k = s->slo[b] + 1; k < s->shi[b]; ++k) s->cuts[k] += 1;
    for (i64 k = s->slo[b]; k < s->shi[b]; ++k) s->total[k] += sz;
    s->placed[b] = 0;
    s->minoff[b] = x;
    s->top[b] = s->fixed[b] ? x + 1 : x + sz;
    while (s->change_len > s->trail_changes[t]) {
        Py_ssize_t c = --s->change_len;
        i64 o = s->change_o[c];
        s->minoff[o] = s->change_old[c];
        s->top[o] = s->change_old[c] + s->size[o];
    }
}

static int search(Search *s, Py_ssize_t comp_at, Py_ssize_t comp_len, i64 s0, i64 s1,
                  i64 last_x, i64 last_r);

static const Search *ranking; /* qsort's comparator has no context argument; we hold the GIL */

static int by_keys(const void *pa, const void *pb) {
    const Search *s = ranking;
    i64 a = *(const i64 *)pa, b = *(const i64 *)pb;
    for (Py_ssize_t c = 0; c < s->ncols; ++c) {
        i64 ka = s->dynamic[c] ? s->tnow[a] : s->keys[c * s->n + a];
        i64 kb = s->dynamic[c] ? s->tnow[b] : s->keys[c * s->n + b];
        if (ka != kb) return ka < kb ? -1 : 1;
    }
    return a < b ? -1 : a > b;
}

/* Rank the group[] afresh (see search.py's rerank); its old ranks go to old[]. */
static void rerank(Search *s, i64 *group, Py_ssize_t len, i64 *old) {
    for (Py_ssize_t k = 0; k < len; ++k) {
        i64 i = group[k];
        s->tnow[i] = -max_total(s, s->slo[i], s->shi[i]);
    }
    ranking = s;
    qsort(group, (size_t)len, sizeof(i64), by_keys);
    for (Py_ssize_t k = 0; k < len; ++k) {
        old[k] = s->rank[group[k]];
        s->rank[group[k]] = k;
    }
}

/* The unplaced buffers rest[] fall apart at the zero-cut boundaries splits[]: solve the groups
 * one after the other, largest first (ties: the group met first in rest[]). */
static int split_search(Search *s, Py_ssize_t rest_at, Py_ssize_t rest_len, Py_ssize_t splits_at,
                        Py_ssize_t nsplits, i64 s0, i64 s1, i64 x) {
    Py_ssize_t mark = s->arena_len, ngroups = nsplits + 1;
    /* per group: size, first position in rest[], fill position; then the group order; then
     * the members grouped; then room for a group's old ranks; then each member's group, popped
     * once the members are grouped */
    Py_ssize_t count_at = push(s, 3 * ngroups), order_at = push(s, ngroups), grouped_at = push(s, rest_len),
               old_at = push(s, rest_len), gid_at = push(s, rest_len);
    if (count_at < 0 || order_at < 0 || grouped_at < 0 || gid_at < 0 || old_at < 0) return NO_MEMORY;
    i64 *a = s->arena, *count = a + count_at, *first = count + ngroups, *fill = first + ngroups;
    for (Py_ssize_t g = 0; g < ngroups; ++g) count[g] = 0, first[g] = -1;
    for (Py_ssize_t k = 0; k < rest_len; ++k) {
        i64 lo = s->slo[a[rest_at + k]];
        Py_ssize_t lo_g = 0, hi_g = nsplits; /* bisect_right(splits, lo) */
        while (lo_g < hi_g) {
            Py_ssize_t mid = (lo_g + hi_g) / 2;
            if (a[splits_at + mid] <= lo) lo_g = mid + 1; else hi_g = mid;
        }
        a[gid_at + k] = lo_g;
        if (count[lo_g]++ == 0) first[lo_g] = k;
    }
    Py_ssize_t used = 0;
    for (Py_ssize_t g = 0; g < ngroups; ++g) {
        fill[g] = used;
        used += count[g];
    }
    for (Py_ssize_t k = 0; k < rest_len; ++k) a[grouped_at + fill[a[gid_at + k]]++] = a[rest_at + k];
    s->arena_len = gid_at;
    /* the non-empty groups by (size descending, first appearance): insertion sort, few groups */
    Py_ssize_t norder = 0;
    for (Py_ssize_t g = 0; g < ngroups; ++g) {
        if (!count[g]) continue;
        Py_ssize_t j = norder++;
        while (j > 0) {
            i64 h = a[order_at + j - 1];
            if (count[h] > count[g] || (count[h] == count[g] && first[h] < first[g])) break;
            a[order_at + j] = h;
            --j;
        }
        a[order_at + j] = g;
    }
    Py_ssize_t trail_mark = s->trail_len;
    for (Py_ssize_t k = 0; k < norder; ++k) {
        a = s->arena;
        i64 g = a[order_at + k];
        i64 g0 = g > 0 ? a[splits_at + g - 1] : s0, g1 = g < nsplits ? a[splits_at + g] : s1;
        i64 start = a[count_at + 2 * ngroups + g] - a[count_at + g]; /* fill ran to its end */
        i64 len = a[count_at + g], *group = a + grouped_at + start, *old = a + old_at;
        rerank(s, group, len, old);
        int r = search(s, grouped_at + start, len, g0, g1, x, -1);
        a = s->arena;
        for (i64 k = 0; k < len; ++k) s->rank[a[grouped_at + start + k]] = a[old_at + k];
        if (r != FOUND) {
            if (r == EXHAUSTED)
                while (s->trail_len > trail_mark) unplace(s);
            s->arena_len = mark;
            return r;
        }
    }
    s->arena_len = mark;
    return FOUND;
}

/* The next candidates of a node, at most room of them, into the arena at cand_at: the buffers
 * of comp[] below the lowest top mh whose (min offset, rank) follow (after_x, after_r), in that
 * order.  A node may have thousands of candidates and a descent has a node per buffer, so they
 * are gathered a chunk at a time (all at once took 4.5 GB on a 405B-class step); a node that
 * tries more than a chunk scans comp[] again, in the state its failed children restored. */
static Py_ssize_t gather(Search *s, Py_ssize_t comp_at, Py_ssize_t comp_len, i64 mh, i64 after_x,
                         i64 after_r, Py_ssize_t cand_at, Py_ssize_t room) {
    const i64 *minoff = s->minoff, *rank = s->rank;
    i64 *a = s->arena;
    Py_ssize_t ncand = 0;
    for (Py_ssize_t k = 0; k < comp_len; ++k) {
        i64 b = a[comp_at + k], x = minoff[b], r = rank[b];
        if (x >= mh || x < after_x || (x == after_x && r <= after_r)) continue;
        if (ncand == room) { /* full: b displaces the last, if it comes before it */
            const i64 *last = a + cand_at + 3 * (room - 1);
            if (last[0] < x || (last[0] == x && last[1] < r)) continue;
            --ncand;
        }
        /* insertion by (min offset, rank): usually a handful */
        Py_ssize_t j = ncand++;
        while (j > 0) {
            i64 *prev = a + cand_at + 3 * (j - 1);
            if (prev[0] < x || (prev[0] == x && prev[1] < r)) break;
            memcpy(prev + 3, prev, 3 * sizeof(i64));
            --j;
        }
        i64 *slot = a + cand_at + 3 * j;
        slot[0] = x, slot[1] = r, slot[2] = b;
    }
    return ncand;
}

static int search(Search *s, Py_ssize_t comp_at, Py_ssize_t comp_len, i64 s0, i64 s1,
                  i64 last_x, i64 last_r) {
    const i64 C = s->C, *size = s->size, *slo = s->slo, *shi = s->shi, *rank = s->rank;  /* rank: read only here */
    i64 *minoff = s->minoff, *top = s->top, *total = s->total;
    s->nodes += 1;
    if (s->nodes >= s->node_limit) return NODE_LIMIT;
    if (!(s->nodes & 127)) {
        if (past_deadline(s)) return DEADLINE;
        if (PyErr_CheckSignals()) return INTERRUPTED;
    }
    Py_ssize_t mark = s->arena_len;
    /* candidates: (min offset, rank, buffer) of the buffers below the lowest top, a chunk at a time */
    Py_ssize_t room = comp_len < s->chunk ? comp_len : s->chunk, cand_at = push(s, 3 * room);
    if (cand_at < 0) return NO_MEMORY;
    i64 *a = s->arena, mh = INF;
    for (Py_ssize_t k = 0; k < comp_len; ++k)
        if (top[a[comp_at + k]] < mh) mh = top[a[comp_at + k]];
    i64 big = total[s0], smax = s0;
    for (i64 k = s0 + 1; k < s1; ++k)
        if (total[k] > big) big = total[k], smax = k;
    int mono_hit = 0, hatless_failed = 0;
    i64 after_x = -1, after_r = -1;
    /* a full chunk may have more after it */
    for (Py_ssize_t ncand = room; ncand == room && !hatless_failed;) {
        ncand = gather(s, comp_at, comp_len, mh, after_x, after_r, cand_at, room);
        if (ncand) after_x = s->arena[cand_at + 3 * (ncand - 1)], after_r = s->arena[cand_at + 3 * (ncand - 1) + 1];
        for (Py_ssize_t c = 0; c < ncand; ++c) {
            a = s->arena;
            i64 x = a[cand_at + 3 * c], b = a[cand_at + 3 * c + 2];
            if (x < last_x || (x == last_x && rank[b] < last_r)) continue;
            i64 sz = size[b];
            if (x + big - sz > C) {
                if (!mono_hit) s->weights[smax] += 1, mono_hit = 1;
                continue;
            }
            i64 tp = s->twin_prev[b];
            if (tp >= 0 && !s->placed[tp]) continue;
            i64 lo_b = slo[b], hi_b = shi[b];
            if (x + big > C) {
                if (smax < lo_b || smax >= hi_b) continue;
                if (lo_b > s0 && x + max_total(s, s0, lo_b) > C) continue;
                if (hi_b < s1 && x + max_total(s, hi_b, s1) > C) continue;
                if (x + max_total(s, lo_b, hi_b) - sz > C) continue;
            }
            i64 t = x + sz, rlo = lo_b, rhi = hi_b;
            if (!reserve_changes(s, (Py_ssize_t)(s->ovl_start[b + 1] - s->ovl_start[b]))) return NO_MEMORY;
            /* ---- place b at x */
            s->trail_b[s->trail_len] = b, s->trail_x[s->trail_len] = x;
            s->trail_changes[s->trail_len++] = s->change_len;
            int clash = 0, hatless = 1;
            for (i64 k = s->ovl_start[b]; k < s->ovl_start[b + 1]; ++k) {
                i64 o = s->ovl[k];
                if (!s->placed[o]) hatless = 0;
                if (minoff[o] >= t) continue;
                if (s->fixed[o]) {
                    clash = 1;
                    continue;
                }
                s->change_o[s->change_len] = o, s->change_old[s->change_len++] = minoff[o];
                minoff[o] = t;
                top[o] = t + size[o];
                if (slo[o] < rlo) rlo = slo[o];
                if (shi[o] > rhi) rhi = shi[o];
            }
            minoff[b] = INF, top[b] = INF;
            s->placed[b] = 1;
            s->offset[b] = x;
            for (i64 k = lo_b; k < hi_b; ++k) total[k] -= sz;
            Py_ssize_t nsplits = 0, splits_at = s->arena_len;
            for (i64 k = lo_b + 1; k < hi_b; ++k)
                if (!--s->cuts[k]) ++nsplits;
            if (nsplits) {
                if (push(s, nsplits) < 0) return NO_MEMORY;
                Py_ssize_t j = splits_at;
                for (i64 k = lo_b + 1; k < hi_b; ++k)
                    if (!s->cuts[k]) s->arena[j++] = k;
            }
            /* ---- inference */
            int ok = !clash;
            if (ok) {
                i64 thr = C - t;
                for (i64 k = rlo; k < rhi; ++k) {
                    if (total[k] <= thr) continue;
                    i64 room = C - total[k];
                    if (minoff[s->witness[k]] > room && !refresh(s, k, room)) {
                        ok = 0;
                        s->weights[k] += 1;
                        break;
                    }
                }
            }
            if (ok) {
                for (i64 k = lo_b; k < hi_b; ++k) {
                    if (s->witness[k] == b && total[k] && !refresh(s, k, C - total[k])) {
                        ok = 0;
                        s->weights[k] += 1;
                        break;
                    }
                }
            }
            if (ok) {
                if (comp_len == 1) {
                    s->arena_len = mark;
                    return FOUND;
                }
                /* the rest is the component without b, in place and in order (a copy per node made
                 * the memory quadratic in the depth: 4 GB per worker on a 405B-class step); b goes
                 * back when its subtree fails */
                i64 *comp = s->arena + comp_at;
                Py_ssize_t p = 0;
                while (comp[p] != b) ++p;
                memmove(comp + p, comp + p + 1, (size_t)(comp_len - 1 - p) * sizeof(i64));
                int r = nsplits ? split_search(s, comp_at, comp_len - 1, splits_at, nsplits, s0, s1, x)
                                : search(s, comp_at, comp_len - 1, s0, s1, x, rank[b]);
                if (r != EXHAUSTED) {
                    s->arena_len = mark;
                    return r;
                }
                comp = s->arena + comp_at;
                memmove(comp + p + 1, comp + p, (size_t)(comp_len - 1 - p) * sizeof(i64));
                comp[p] = b;
            }
            s->arena_len = splits_at;
            unplace(s);
            if (hatless) {
                hatless_failed = 1;
                break;
            }
        }
    }
    s->backtracks += 1;
    s->arena_len = mark;
    return EXHAUSTED;
}

typedef struct {
    Py_buffer size, slo, shi, mem_start, mem, ovl_start, ovl, rank, order, twin_prev, fixed, weights, keys, dynamic;
} Inputs;

static int check_lengths(const Inputs *in, Py_ssize_t *n, Py_ssize_t *S) {
    const Py_buffer *same_n[] = {&in->slo, &in->shi, &in->rank, &in->order, &in->twin_prev, &in->fixed};
    *n = in->size.len / 8;
    *S = in->mem_start.len / 8 - 1;
    for (size_t k = 0; k < sizeof same_n / sizeof *same_n; ++k)
        if (same_n[k]->len != in->size.len) return 0;
    return *S >= 0 && in->ovl_start.len == in->size.len + 8 && in->weights.len / 8 >= *S &&
           in->keys.len == in->dynamic.len * *n;
}

static void release(Inputs *in) {
    Py_buffer *all[] = {&in->size, &in->slo, &in->shi, &in->mem_start, &in->mem, &in->ovl_start,
                        &in->ovl, &in->rank, &in->order, &in->twin_prev, &in->fixed, &in->weights,
                        &in->keys, &in->dynamic};
    for (size_t k = 0; k < sizeof all / sizeof *all; ++k)
        if (all[k]->obj) PyBuffer_Release(all[k]);
}

static const char *STATUS[] = {"infeasible", "solved", "node limit", "deadline"};

/* run(size, slo, shi, mem_start, mem, ovl_start, ovl, rank, order, twin_prev, fixed, capacity,
 *     node_limit, seconds, weights, keys, dynamic, chunk) -> (status, offsets | None, nodes, backtracks)
 *
 * All arrays are int64 buffers.  Buffer i covers sections slo[i] .. shi[i]-1; the members of
 * section s are mem[mem_start[s] : mem_start[s+1]] and the buffers overlapping i in time are
 * ovl[ovl_start[i] : ovl_start[i+1]].  order lists the buffers by rank; twin_prev[i] is the
 * identical buffer i must wait for (-1: none); fixed[i] is i's pinned offset (-1: free, pinned
 * offsets already checked against the capacity).  weights (one per section, writable) gains
 * one per failed section check.  keys holds the ranking's columns (column c of buffer i at
 * c*n+i, rank is their lexicographic order, ties by i) and dynamic[c] marks the T columns,
 * recomputed when the problem splits (rank is rewritten then, and restored).  chunk is how many
 * candidates a node gathers at a time (memory only: the search is the same for any chunk).
 * status is "solved", "infeasible" (a proof), "node limit" or "deadline". */
static PyObject *run(PyObject *self, PyObject *args) {
    Inputs in = {0};
    long long capacity, node_limit;
    double seconds;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*w*y*y*y*LLdw*y*y*n", &in.size, &in.slo, &in.shi,
                          &in.mem_start, &in.mem, &in.ovl_start, &in.ovl, &in.rank, &in.order,
                          &in.twin_prev, &in.fixed, &capacity, &node_limit, &seconds, &in.weights,
                          &in.keys, &in.dynamic, &chunk))
        return NULL;
    Search s = {0};
    s.chunk = chunk > 0 ? chunk : 1;
    PyObject *result = NULL;
    if (!check_lengths(&in, &s.n, &s.S)) {
        PyErr_SetString(PyExc_ValueError, "_search.run: arrays of inconsistent lengths");
        release(&in);
        return NULL;
    }
    Py_ssize_t n = s.n, S = s.S;
    s.size = in.size.buf, s.slo = in.slo.buf, s.shi = in.shi.buf, s.mem_start = in.mem_start.buf;
    s.mem = in.mem.buf, s.ovl_start = in.ovl_start.buf, s.ovl = in.ovl.buf, s.rank = in.rank.buf;
    s.twin_prev = in.twin_prev.buf, s.weights = in.weights.buf;
    s.keys = in.keys.buf, s.dynamic = in.dynamic.buf, s.ncols = in.dynamic.len / 8;
    s.C = capacity, s.node_limit = node_limit;
    const i64 *fixed = in.fixed.buf, *order = in.order.buf;
    clock_gettime(CLOCK_MONOTONIC, &s.deadline);
    double whole = seconds > 1e9 ? 1e9 : seconds < 0 ? 0 : seconds;
    s.deadline.tv_sec += (time_t)whole;
    s.deadline.tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
    if (s.deadline.tv_nsec >= 1000000000L) s.deadline.tv_sec += 1, s.deadline.tv_nsec -= 1000000000L;
    size_t nn = (size_t)n + 1, ns = (size_t)S + 1;
    s.minoff = malloc(nn * 8), s.top = malloc(nn * 8), s.offset = calloc(nn, 8);
    s.total = calloc(ns, 8), s.cuts = calloc(ns, 8), s.witness = malloc(ns * 8);
    s.placed = calloc(nn, 1), s.fixed = calloc(nn, 1), s.tnow = malloc(nn * 8);
    s.trail_b = malloc(nn * 8), s.trail_x = malloc(nn * 8), s.trail_changes = malloc(nn * 8);
    s.change_cap = 1024, s.change_o = malloc(1024 * 8), s.change_old = malloc(1024 * 8);
    int status = NO_MEMORY;
    if (!(s.minoff && s.top && s.offset && s.total && s.cuts && s.witness && s.placed && s.fixed && s.tnow &&
          s.trail_b && s.trail_x && s.trail_changes && s.change_o && s.change_old))
        goto done;
    for (Py_ssize_t i = 0; i < n; ++i) {
        s.fixed[i] = fixed[i] >= 0;
        s.minoff[i] = s.fixed[i] ? fixed[i] : 0;
        s.top[i] = s.fixed[i] ? fixed[i] + 1 : s.size[i];
        for (i64 k = s.slo[i]; k < s.shi[i]; ++k) s.total[k] += s.size[i];
        for (i64 k = s.slo[i] + 1; k < s.shi[i]; ++k) s.cuts[k] += 1;
    }
    status = EXHAUSTED;
    for (Py_ssize_t k = 0; k < S; ++k) {
        s.witness[k] = s.mem[s.mem_start[k]];
        if (s.total[k] && s.minoff[s.witness[k]] > s.C - s.total[k] && !refresh(&s, k, s.C - s.total[k]))
            goto done;
    }
    Py_ssize_t comp_at = push(&s, n);
    if (comp_at < 0) {
        status = NO_MEMORY;
        goto done;
    }
    memcpy(s.arena + comp_at, order, (size_t)n * 8);
    Py_ssize_t nsplits = 0;
    for (Py_ssize_t k = 1; k < S; ++k) nsplits += !s.cuts[k];
    if (nsplits) {
        Py_ssize_t splits_at = push(&s, nsplits);
        if (splits_at < 0) {
            status = NO_MEMORY;
            goto done;
        }
        for (Py_ssize_t k = 1, j = splits_at; k < S; ++k)
            if (!s.cuts[k]) s.arena[j++] = k;
        status = split_search(&s, comp_at, n, splits_at, nsplits, 0, S, 0);
    } else {
        status = search(&s, comp_at, n, 0, S, 0, -1);
    }
done:
    if (status == NO_MEMORY) {
        PyErr_NoMemory();
    } else if (status != INTERRUPTED) {
        PyObject *offsets = Py_None;
        Py_INCREF(Py_None);
        if (status == FOUND) {
            Py_DECREF(Py_None);
            offsets = PyList_New(n);
            for (Py_ssize_t i = 0; offsets && i < n; ++i) {
                PyObject *v = PyLong_FromLongLong(s.offset[i]);
                if (!v) Py_CLEAR(offsets); else PyList_SET_ITEM(offsets, i, v);
            }
        }
        if (offsets)
            result = Py_BuildValue("(sNLL)", STATUS[status == DEADLINE ? 3 : status == NODE_LIMIT ? 2 : status],
                                   offsets, (long long)s.nodes, (long long)s.backtracks);
    }
    free(s.minoff), free(s.top), free(s.offset), free(s.total), free(s.cuts), free(s.witness);
    free(s.placed), free(s.fixed), free(s.tnow), free(s.trail_b), free(s.trail_x), free(s.trail_changes);
    free(s.change_o), free(s.change_old), free(s.arena);
    release(&in);
    return result;
}

/* overlaps(lowers, uppers) -> (ovl_start, ovl): search.py's overlaps_of, as the int64 arrays run()
 * takes (bytes), built without Python lists: the buffers overlapping buffer i in time are
 * ovl[ovl_start[i] : ovl_start[i+1]], in overlaps_of's order (those met earlier in the sweep by
 * lower end, then those met later).  Two sweeps: one counts, one fills. */
static const i64 *sweep_lowers; /* qsort's comparator has no context argument; we hold the GIL */

static int by_lower(const void *pa, const void *pb) {
    i64 a = *(const i64 *)pa, b = *(const i64 *)pb;
    if (sweep_lowers[a] != sweep_lowers[b]) return sweep_lowers[a] < sweep_lowers[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void sweep(const i64 *order, Py_ssize_t n, const i64 *lowers, const i64 *uppers, i64 *active,
                  i64 *pos, i64 *ovl) {
    Py_ssize_t nactive = 0;
    for (Py_ssize_t k = 0; k < n; ++k) {
        i64 i = order[k], lo = lowers[i];
        Py_ssize_t kept = 0;
        for (Py_ssize_t a = 0; a < nactive; ++a)
            if (uppers[active[a]] > lo) active[kept++] = active[a];
        nactive = kept;
        for (Py_ssize_t a = 0; a < nactive; ++a) {
            i64 j = active[a];
            if (ovl) ovl[pos[i]] = j, ovl[pos[j]] = i;
            pos[i] += 1, pos[j] += 1;
        }
        active[nactive++] = i;
    }
}

static PyObject *overlaps(PyObject *self, PyObject *args) {
    Py_buffer lo_buf, hi_buf;
    if (!PyArg_ParseTuple(args, "y*y*", &lo_buf, &hi_buf)) return NULL;
    PyObject *result = NULL, *starts = NULL, *ovl = NULL;
    Py_ssize_t n = lo_buf.len / 8;
    const i64 *lowers = lo_buf.buf, *uppers = hi_buf.buf;
    i64 *order = malloc((size_t)(n + 1) * 8), *active = malloc((size_t)(n + 1) * 8), *pos = calloc((size_t)n + 1, 8);
    if (hi_buf.len != lo_buf.len) {
        PyErr_SetString(PyExc_ValueError, "_search.overlaps: lowers and uppers differ in length");
        goto done;
    }
    if (!order || !active || !pos) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i) order[i] = i;
    sweep_lowers = lowers;
    qsort(order, (size_t)n, sizeof(i64), by_lower);
    sweep(order, n, lowers, uppers, active, pos, NULL); /* pos[i]: i's overlaps */
    starts = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
    if (!starts) goto done;
    i64 *start = (i64 *)PyBytes_AS_STRING(starts);
    start[0] = 0;
    for (Py_ssize_t i = 0; i < n; ++i) start[i + 1] = start[i] + pos[i], pos[i] = start[i];
    ovl = PyBytes_FromStringAndSize(NULL, start[n] * 8);
    if (!ovl) goto done;
    sweep(order, n, lowers, uppers, active, pos, (i64 *)PyBytes_AS_STRING(ovl));
    result = PyTuple_Pack(2, starts, ovl);
done:
    Py_XDECREF(starts), Py_XDECREF(ovl);
    free(order), free(active), free(pos);
    PyBuffer_Release(&lo_buf), PyBuffer_Release(&hi_buf);
    return result;
}

/* ---- the placement heuristics' loop (heuristics.py's _place_in_order, the same placements) ---- */

/* place_in_order(lowers, uppers, sizes, order, smallest_gap, heap_gap) -> offsets (int64 bytes):
 * each buffer of `order` in the smallest (or the lowest) gap among the placed buffers whose
 * lifetimes overlap its own, else on top of them; with heap_gap the chunk between their top and
 * the top of everything placed is a gap too. The placed buffers are kept sorted by offset (equal
 * offsets in the order placed, as the reference's stable sort has them), so each buffer is one
 * scan of them, without sorting. */
static PyObject *place_in_order(PyObject *self, PyObject *args) {
    Py_buffer lo_buf, hi_buf, size_buf, order_buf;
    int smallest_gap, heap_gap;
    if (!PyArg_ParseTuple(args, "y*y*y*y*pp", &lo_buf, &hi_buf, &size_buf, &order_buf, &smallest_gap, &heap_gap))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = lo_buf.len / 8, m = order_buf.len / 8;
    const i64 *lowers = lo_buf.buf, *uppers = hi_buf.buf, *sizes = size_buf.buf, *order = order_buf.buf;
    i64 *plo = malloc((size_t)(n + 1) * 8), *phi = malloc((size_t)(n + 1) * 8), *poff = malloc((size_t)(n + 1) * 8),
        *ptop = malloc((size_t)(n + 1) * 8);
    if (hi_buf.len != lo_buf.len || size_buf.len != lo_buf.len) {
        PyErr_SetString(PyExc_ValueError, "_search.place_in_order: lowers, uppers and sizes differ in length");
        goto done;
    }
    if (!plo || !phi || !poff || !ptop) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; ++k)
        if (order[k] < 0 || order[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "_search.place_in_order: order names a buffer out of range");
            goto done;
        }
    result = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!result) goto done;
    i64 *offsets = (i64 *)PyBytes_AS_STRING(result);
    memset(offsets, 0, (size_t)n * 8);
    Py_ssize_t placed = 0;
    i64 heap = 0;
    for (Py_ssize_t k = 0; k < m; ++k) {
        i64 i = order[k], lo = lowers[i], hi = uppers[i], size = sizes[i];
        if (size <= 0 || hi <= lo) continue;
        /* the gaps below each overlapping buffer, by offset: from the highest top below it */
        i64 start = 0, best_start = -1, best_len = 0;
        int overlapped = 0;
        for (Py_ssize_t j = 0; j < placed; ++j) {
            if (plo[j] >= hi || phi[j] <= lo) continue;
            overlapped = 1;
            i64 len = poff[j] - start;
            if (len >= size && (best_start < 0 || (smallest_gap && len < best_len))) {
                best_start = start, best_len = len;
                if (!smallest_gap) break;
            }
            if (ptop[j] > start) start = ptop[j];
        }
        i64 off = 0;
        if (overlapped && (smallest_gap || best_start < 0)) {
            i64 top = start; /* the tops of every overlapping buffer: the scan ran to the end */
            if (heap_gap && heap - top >= size && (best_start < 0 || (smallest_gap && heap - top < best_len)))
                best_start = top;
            off = best_start >= 0 ? best_start : top;
        } else if (overlapped) {
            off = best_start;
        }
        offsets[i] = off;
        Py_ssize_t at = placed; /* after the placed buffers at or below `off` */
        {
            Py_ssize_t a = 0, b = placed;
            while (a < b) {
                Py_ssize_t mid = (a + b) / 2;
                if (poff[mid] <= off) a = mid + 1; else b = mid;
            }
            at = a;
        }
        memmove(plo + at + 1, plo + at, (size_t)(placed - at) * 8);
        memmove(phi + at + 1, phi + at, (size_t)(placed - at) * 8);
        memmove(poff + at + 1, poff + at, (size_t)(placed - at) * 8);
        memmove(ptop + at + 1, ptop + at, (size_t)(placed - at) * 8);
        plo[at] = lo, phi[at] = hi, poff[at] = off, ptop[at] = off + size, ++placed;
        if (off + size > heap) heap = off + size;
    }
done:
    free(plo), free(phi), free(poff), free(ptop);
    PyBuffer_Release(&lo_buf), PyBuffer_Release(&hi_buf), PyBuffer_Release(&size_buf), PyBuffer_Release(&order_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "The canonical layout search (see roam_cli/layout/search.py)."},
    {"overlaps", overlaps, METH_VARARGS, "The overlaps of buffers in time (see search.py's overlaps_of)."},
    {"place_in_order", place_in_order, METH_VARARGS, "The placement heuristics' loop (see heuristics.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_search",
                                    "The canonical layout search of search.py, in C.", -1, methods};

PyMODINIT_FUNC PyInit__search(void) { return PyModule_Create(&module); }
