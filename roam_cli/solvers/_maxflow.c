/* Minimum s-t cut by Dinic's algorithm, in C: the same algorithm as maxflow.Network, for the
 * order's step bounds (order/bounds.py), whose networks on a 70B-class step have tens of
 * thousands of edges and are cut a dozen times per plan.
 *
 * min_cut(vertices, tails, heads, caps, source, sink) -> (flow, source_side)
 *   tails, heads, caps: equal-length buffers of int64 (an edge tails[i] -> heads[i] of capacity
 *   caps[i]; a negative capacity is infinite). flow: the maximum flow, an int, or None when it is
 *   infinite (no finite cut); source_side: bytes, 1 for each vertex the residual network reaches
 *   from the source (the source side of a minimum cut). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* larger than any sum of finite capacities the bounds build (bytes of one step's buffers) */
#define INFINITE (INT64_MAX / 4)

typedef struct {
    Py_ssize_t n, m;   /* vertices, edge slots (2 per edge: e and its reverse e ^ 1) */
    int64_t *head;     /* edge slot -> the vertex it enters */
    int64_t *cap;      /* residual capacity */
    int64_t *first;    /* vertex -> its slots' start in `slots` (CSR, n + 1 entries) */
    int64_t *slots;    /* the edge slots leaving each vertex */
    int64_t *level, *cursor, *queue, *path;
} Net;

static int bfs(Net *g, int64_t s, int64_t t) {
    for (Py_ssize_t v = 0; v < g->n; v++) g->level[v] = -1;
    Py_ssize_t lo = 0, hi = 0;
    g->level[s] = 0;
    g->queue[hi++] = s;
    while (lo < hi) {
        int64_t a = g->queue[lo++];
        for (int64_t k = g->first[a]; k < g->first[a + 1]; k++) {
            int64_t e = g->slots[k], b = g->head[e];
            if (g->cap[e] > 0 && g->level[b] < 0) {
                g->level[b] = g->level[a] + 1;
                g->queue[hi++] = b;
            }
        }
    }
    return g->level[t] >= 0;
}

/* one augmenting path of the level graph by iterative depth-first search; its bottleneck */
static int64_t augment(Net *g, int64_t s, int64_t t) {
    Py_ssize_t depth = 0;
    int64_t a = s;
    for (;;) {
        if (a == t) {
            int64_t pushed = INFINITE;
            for (Py_ssize_t i = 0; i < depth; i++)
                if (g->cap[g->path[i]] < pushed) pushed = g->cap[g->path[i]];
            for (Py_ssize_t i = 0; i < depth; i++) {
                g->cap[g->path[i]] -= pushed;
                g->cap[g->path[i] ^ 1] += pushed;
            }
            return pushed;
        }
        int64_t e = -1;
        while (g->first[a] + g->cursor[a] < g->first[a + 1]) {
            int64_t c = g->slots[g->first[a] + g->cursor[a]];
            if (g->cap[c] > 0 && g->level[g->head[c]] == g->level[a] + 1) {
                e = c;
                break;
            }
            g->cursor[a]++;
        }
        if (e < 0) {
            if (depth == 0) return 0;
            g->level[a] = -1; /* a dead end */
            e = g->path[--depth];
            a = g->head[e ^ 1];
            g->cursor[a]++;
            continue;
        }
        g->path[depth++] = e;
        a = g->head[e];
    }
}

static int view(PyObject *obj, Py_buffer *buf, const char *what) {
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (buf->itemsize != 8 || (buf->format && strcmp(buf->format, "l") && strcmp(buf->format, "q"))) {
        PyErr_Format(PyExc_TypeError, "%s: an int64 buffer expected", what);
        PyBuffer_Release(buf);
        return -1;
    }
    return 0;
}

static PyObject *min_cut(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *tails_o, *heads_o, *caps_o;
    long long s, t;
    if (!PyArg_ParseTuple(args, "nOOOLL", &n, &tails_o, &heads_o, &caps_o, &s, &t)) return NULL;
    Py_buffer tb, hb, cb;
    if (view(tails_o, &tb, "tails") < 0) return NULL;
    if (view(heads_o, &hb, "heads") < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    if (view(caps_o, &cb, "caps") < 0) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&hb);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t edges = tb.len / 8;
    const int64_t *tails = tb.buf, *heads = hb.buf, *caps = cb.buf;
    Net g = {.n = n, .m = 2 * edges};
    if (hb.len / 8 != edges || cb.len / 8 != edges || n <= 0 || s < 0 || s >= n || t < 0 || t >= n || s == t) {
        PyErr_SetString(PyExc_ValueError, "min_cut: edge arrays of unequal length, or a bad source or sink");
        goto done;
    }
    for (Py_ssize_t i = 0; i < edges; i++)
        if (tails[i] < 0 || tails[i] >= n || heads[i] < 0 || heads[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "min_cut: an edge names a vertex out of range");
            goto done;
        }
    g.head = malloc(sizeof(int64_t) * (g.m + 1));
    g.cap = malloc(sizeof(int64_t) * (g.m + 1));
    g.slots = malloc(sizeof(int64_t) * (g.m + 1));
    g.first = calloc(n + 1, sizeof(int64_t));
    g.level = malloc(sizeof(int64_t) * n);
    g.cursor = malloc(sizeof(int64_t) * n);
    g.queue = malloc(sizeof(int64_t) * n);
    g.path = malloc(sizeof(int64_t) * (n + 1));
    if (!g.head || !g.cap || !g.slots || !g.first || !g.level || !g.cursor || !g.queue || !g.path) {
        PyErr_NoMemory();
        goto done;
    }
    /* slots in the order edges were given, as Network.add appends them: the same search */
    for (Py_ssize_t i = 0; i < edges; i++) {
        g.head[2 * i] = heads[i];
        g.head[2 * i + 1] = tails[i];
        g.cap[2 * i] = caps[i] < 0 ? INFINITE : caps[i];
        g.cap[2 * i + 1] = 0;
        g.first[tails[i] + 1]++;
        g.first[heads[i] + 1]++;
    }
    for (Py_ssize_t v = 0; v < n; v++) g.first[v + 1] += g.first[v];
    memcpy(g.cursor, g.first, sizeof(int64_t) * n); /* fill positions */
    for (Py_ssize_t i = 0; i < edges; i++) {
        g.slots[g.cursor[tails[i]]++] = 2 * i;
        g.slots[g.cursor[heads[i]]++] = 2 * i + 1;
    }
    int64_t flow = 0;
    int infinite = 0;
    Py_BEGIN_ALLOW_THREADS
    while (!infinite && bfs(&g, s, t)) {
        memset(g.cursor, 0, sizeof(int64_t) * n);
        int64_t pushed;
        while ((pushed = augment(&g, s, t)) > 0) {
            if (pushed >= INFINITE || flow >= INFINITE - pushed) {
                infinite = 1;
                break;
            }
            flow += pushed;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *side = PyBytes_FromStringAndSize(NULL, n);
    if (!side) goto done;
    char *seen = PyBytes_AS_STRING(side);
    memset(seen, 0, n);
    Py_ssize_t top = 0;
    seen[s] = 1;
    g.queue[top++] = s;
    while (top) {
        int64_t a = g.queue[--top];
        for (int64_t k = g.first[a]; k < g.first[a + 1]; k++) {
            int64_t e = g.slots[k], b = g.head[e];
            if (g.cap[e] > 0 && !seen[b]) {
                seen[b] = 1;
                g.queue[top++] = b;
            }
        }
    }
    if (infinite) {
        Py_INCREF(Py_None);
        result = Py_BuildValue("(NN)", Py_None, side);
    } else {
        result = Py_BuildValue("(LN)", (long long)flow, side);
    }
done:
    free(g.head);
    free(g.cap);
    free(g.slots);
    free(g.first);
    free(g.level);
    free(g.cursor);
    free(g.queue);
    free(g.path);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&cb);
    return result;
}

static PyMethodDef methods[] = {
    {"min_cut", min_cut, METH_VARARGS, "min_cut(vertices, tails, heads, caps, source, sink) -> (flow, source_side)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maxflow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maxflow(void) { return PyModule_Create(&module); }
