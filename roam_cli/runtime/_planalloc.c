/* The plan's arena as ONNX Runtime's allocator.
 *
 * ONNX Runtime's Python build offers no way to give its sessions an allocator of our own: the
 * public C API's RegisterAllocator needs an OrtEnv, and the Python module's environment is not
 * one the C API can reach (CreateEnv in a process that imported onnxruntime fails: "Only one
 * instance of LoggingManager created with InstanceType::Default can exist"; see
 * docs/runtime.md). So this module serves ORT's requests where they leave ORT:
 *
 * - CPU: with its arena off (enable_cpu_mem_arena = False), ORT's CPU allocator takes every
 *   tensor and kernel scratch buffer from posix_memalign and returns it with free (onnxruntime
 *   1.19), or from C++'s aligned operator new and delete (onnxruntime 1.20 on). install() points
 *   those entries of the ORT library's global offset table at our functions, the way a preloaded
 *   allocator would, but for that one library only. libstdc++'s aligned delete is free, so a
 *   buffer from either pair may be returned through the other.
 * - CUDA: the CUDA provider takes external allocator functions as provider options
 *   (gpu_external_alloc / gpu_external_free / gpu_external_empty_cache); cuda_functions()
 *   gives their addresses. cudaMalloc and cudaFree are looked up at run time in the CUDA
 *   runtime ORT already loaded: nothing here links against CUDA.
 *
 * Each device has one state. RECORD passes requests through to the real allocator and logs
 * each (size, alloc event, free event); Python lays those buffers out with roam's layout
 * solver and hands back one offset per request (load_plan). SERVE then answers the k-th
 * request of a step at base + offset[k]. A request that does not match the recording (another
 * size, or its place still taken by a buffer that is live) falls back to the real allocator and
 * is counted: the arena can be wrong about nothing, only unused.
 *
 * Only the thread that began the step is planned (ORT's sequential executor allocates on the
 * calling thread); requests from other threads pass through and are counted. All state is
 * behind one mutex: the hooks see every allocation of the library, from any thread. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { OFF = 0, RECORD = 1, SERVE = 2 };
enum { CPU = 0, CUDA = 1, DEVICES = 2 };
#define LOOKAHEAD 64 /* how far past the cursor a request may match (one-off requests skipped) */

/* ---- pointer -> index map (open addressing, linear probing, backward-shift delete) ---- */

typedef struct {
    uintptr_t *keys; /* 0 = empty */
    int64_t *vals;
    size_t cap, used;
} PtrMap;

static size_t slot_of(const PtrMap *m, uintptr_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (m->cap - 1);
}

static int map_grow(PtrMap *m) {
    PtrMap n = {0};
    n.cap = m->cap ? m->cap * 2 : 1024;
    n.keys = calloc(n.cap, sizeof *n.keys);
    n.vals = calloc(n.cap, sizeof *n.vals);
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t s = slot_of(&n, m->keys[i]);
        while (n.keys[s]) s = (s + 1) & (n.cap - 1);
        n.keys[s] = m->keys[i];
        n.vals[s] = m->vals[i];
        n.used++;
    }
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

static int map_put(PtrMap *m, uintptr_t key, int64_t val) {
    if ((m->used + 1) * 2 > m->cap && map_grow(m)) return -1;
    size_t s = slot_of(m, key);
    while (m->keys[s] && m->keys[s] != key) s = (s + 1) & (m->cap - 1);
    if (!m->keys[s]) m->used++;
    m->keys[s] = key;
    m->vals[s] = val;
    return 0;
}

/* The value stored for key, removing it; -1 when absent. */
static int64_t map_take(PtrMap *m, uintptr_t key) {
    if (!m->cap) return -1;
    size_t s = slot_of(m, key);
    while (m->keys[s] != key) {
        if (!m->keys[s]) return -1;
        s = (s + 1) & (m->cap - 1);
    }
    int64_t val = m->vals[s];
    m->keys[s] = 0;
    m->used--;
    /* backward shift: keep every later key of the probe run reachable */
    size_t hole = s, j = s;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (!m->keys[j]) break;
        size_t home = slot_of(m, m->keys[j]);
        int between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (between) continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        m->keys[j] = 0;
        hole = j;
    }
    return val;
}

static void map_clear(PtrMap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- growable int64 arrays ---- */

typedef struct {
    int64_t *v;
    size_t n, cap;
} Vec;

static int vec_push(Vec *a, int64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4096;
        int64_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static void vec_free(Vec *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- per-device state ---- */

typedef struct {
    int mode;
    pthread_t owner;
    int any_thread; /* CUDA: the provider calls from its own threads; every request is planned */
    /* RECORD */
    Vec rec_size, rec_alloc, rec_free; /* per request: bytes, alloc event, free event (-1: live) */
    int64_t events;
    PtrMap rec_live; /* pointer -> request */
    /* the plan: one slot per recorded request */
    int64_t n;
    int64_t *size, *offset;
    int64_t *ov_start, *ov; /* CSR: slots whose bytes overlap slot i's (at other times) */
    char *live, *taken;
    char *base;
    int64_t arena_bytes;
    int64_t cursor;
    PtrMap served; /* arena pointer -> slot */
    PtrMap fallback; /* pointer -> bytes, for requests served by the real allocator */
    /* step statistics */
    int64_t st_served, st_served_bytes, st_unplanned, st_unplanned_bytes, st_conflicts, st_other_threads;
    int64_t st_fallback_live, st_fallback_peak, st_high_water;
} Device;

static Device dev[DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* the real allocators */
static int (*real_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static void (*real_free)(void *) = free;
typedef int (*cuda_malloc_t)(void **, size_t);
typedef int (*cuda_free_t)(void *);
static cuda_malloc_t cuda_malloc;
static cuda_free_t cuda_free;

static int device_alloc(int d, void **p, size_t align, size_t size) {
    if (d == CPU) return real_posix_memalign(p, align, size);
    if (!cuda_malloc) return -1;
    return cuda_malloc(p, size) == 0 ? 0 : -1; /* cudaMalloc aligns to 256 bytes or more */
}

static void device_free(int d, void *p) {
    if (d == CPU)
        real_free(p);
    else if (cuda_free)
        cuda_free(p);
}

static int planned_thread(const Device *s) {
    return s->any_thread || pthread_equal(pthread_self(), s->owner);
}

static int in_arena(const Device *s, const void *p) {
    return s->base && (const char *)p >= s->base && (const char *)p < s->base + s->arena_bytes;
}

/* A slot for a request of `size` bytes at `align`, or -1. */
static int64_t match_slot(Device *s, size_t size, size_t align) {
    if ((uintptr_t)s->base % align) return -1;
    int64_t end = s->cursor + LOOKAHEAD < s->n ? s->cursor + LOOKAHEAD : s->n;
    for (int64_t j = s->cursor; j < end; j++) {
        if (s->taken[j] || s->size[j] != (int64_t)size || s->offset[j] % (int64_t)align) continue;
        for (int64_t k = s->ov_start[j]; k < s->ov_start[j + 1]; k++)
            if (s->live[s->ov[k]]) {
                s->st_conflicts++;
                return -1;
            }
        return j;
    }
    return -1;
}

static void *allocate(int d, size_t size, size_t align) {
    Device *s = &dev[d];
    void *p = NULL;
    pthread_mutex_lock(&lock);
    if (s->mode == OFF || !planned_thread(s)) {
        if (s->mode != OFF) s->st_other_threads++;
        pthread_mutex_unlock(&lock);
        return device_alloc(d, &p, align, size) ? NULL : p;
    }
    if (s->mode == SERVE) {
        int64_t j = match_slot(s, size, align);
        if (j >= 0) {
            s->taken[j] = s->live[j] = 1;
            while (s->cursor < s->n && s->taken[s->cursor]) s->cursor++;
            p = s->base + s->offset[j];
            if (map_put(&s->served, (uintptr_t)p, j) == 0) {
                s->st_served++;
                s->st_served_bytes += (int64_t)size;
                if (s->offset[j] + (int64_t)size > s->st_high_water) s->st_high_water = s->offset[j] + (int64_t)size;
                pthread_mutex_unlock(&lock);
                return p;
            }
            s->taken[j] = s->live[j] = 0;
        }
    }
    if (device_alloc(d, &p, align, size)) p = NULL;
    if (p && s->mode == RECORD) {
        int64_t k = (int64_t)s->rec_size.n;
        if (vec_push(&s->rec_size, (int64_t)size) || vec_push(&s->rec_alloc, s->events++) ||
            vec_push(&s->rec_free, -1) || map_put(&s->rec_live, (uintptr_t)p, k)) {
            s->mode = OFF; /* out of memory for the log: stop recording, end_record reports it */
            s->rec_size.n = 0;
        }
    } else if (p) {
        s->st_unplanned++;
        s->st_unplanned_bytes += (int64_t)size;
        s->st_fallback_live += (int64_t)size;
        if (s->st_fallback_live > s->st_fallback_peak) s->st_fallback_peak = s->st_fallback_live;
        map_put(&s->fallback, (uintptr_t)p, (int64_t)size);
    }
    pthread_mutex_unlock(&lock);
    return p;
}

static void release(int d, void *p) {
    Device *s = &dev[d];
    if (!p) return;
    pthread_mutex_lock(&lock);
    if (in_arena(s, p)) {
        int64_t j = map_take(&s->served, (uintptr_t)p);
        if (j >= 0) s->live[j] = 0;
        pthread_mutex_unlock(&lock);
        return;
    }
    if (s->rec_live.used) {
        int64_t k = map_take(&s->rec_live, (uintptr_t)p);
        if (k >= 0) s->rec_free.v[k] = s->events++;
    }
    if (s->fallback.used) {
        int64_t bytes = map_take(&s->fallback, (uintptr_t)p);
        if (bytes >= 0) s->st_fallback_live -= bytes;
    }
    pthread_mutex_unlock(&lock);
    device_free(d, p);
}

/* ---- the hooks ---- */

static int hook_posix_memalign(void **out, size_t align, size_t size) {
    void *p = allocate(CPU, size, align);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

static void hook_free(void *p);

/* operator new(size_t, align_val_t): a C function cannot throw bad_alloc, so a request that
 * neither the arena nor the system can serve ends the process, as an uncaught bad_alloc would. */
static void *hook_new_aligned(size_t size, size_t align) {
    void *p = allocate(CPU, size, align);
    if (!p) abort();
    return p;
}

static void hook_delete_aligned(void *p, size_t align) {
    (void)align;
    hook_free(p);
}

static void hook_delete_sized_aligned(void *p, size_t size, size_t align) {
    (void)size, (void)align;
    hook_free(p);
}

static void hook_free(void *p) {
    if (!dev[CPU].base && !dev[CPU].mode && !dev[CPU].fallback.used && !dev[CPU].rec_live.used) {
        real_free(p); /* nothing of ours can be live: the common path takes no lock */
        return;
    }
    release(CPU, p);
}

void *roam_cuda_alloc(size_t size) { return allocate(CUDA, size, 256); }
void roam_cuda_free(void *p) { release(CUDA, p); }
void roam_cuda_empty_cache(void) {}

/* ---- GOT patching ---- */

typedef struct {
    const char *needle;
    int patched;
    const char *error;
} PatchJob;

static int patch_slot(void **slot, void *target) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)slot & ~(uintptr_t)(page - 1);
    if (mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE)) return -1;
    *slot = target;
    /* RELRO makes the table read-only after loading; put that back */
    mprotect((void *)start, (size_t)page, PROT_READ);
    return 0;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data) {
    PatchJob *job = data;
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, job->needle)) return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) {
        job->error = "no dynamic section";
        return 1;
    }
    uintptr_t base = info->dlpi_addr, symtab = 0, strtab = 0, jmprel = 0, rela = 0;
    size_t pltsz = 0, relasz = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t v = dyn->d_un.d_ptr;
        switch (dyn->d_tag) {
            case DT_SYMTAB: symtab = v; break;
            case DT_STRTAB: strtab = v; break;
            case DT_JMPREL: jmprel = v; break;
            case DT_PLTRELSZ: pltsz = dyn->d_un.d_val; break;
            case DT_RELA: rela = v; break;
            case DT_RELASZ: relasz = dyn->d_un.d_val; break;
        }
    }
    /* the loader relocates these addresses in place on most targets, not on all */
#define ABS(x) ((x) && (x) < base ? (x) + base : (x))
    symtab = ABS(symtab), strtab = ABS(strtab), jmprel = ABS(jmprel), rela = ABS(rela);
#undef ABS
    if (!symtab || !strtab) {
        job->error = "no symbol table";
        return 1;
    }
    const ElfW(Sym) *syms = (const ElfW(Sym) *)symtab;
    const char *names = (const char *)strtab;
    struct { uintptr_t at; size_t bytes; } tables[2] = {{jmprel, pltsz}, {rela, relasz}};
    for (int t = 0; t < 2; t++) {
        const ElfW(Rela) *r = (const ElfW(Rela) *)tables[t].at;
        for (size_t i = 0; r && i < tables[t].bytes / sizeof *r; i++) {
            size_t type = ELF64_R_TYPE(r[i].r_info);
#if defined(__x86_64__)
            if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
#elif defined(__aarch64__)
            if (type != R_AARCH64_JUMP_SLOT && type != R_AARCH64_GLOB_DAT) continue;
#else
#error "GOT patching is written for x86-64 and aarch64"
#endif
            const char *name = names + syms[ELF64_R_SYM(r[i].r_info)].st_name;
            void *target = !strcmp(name, "posix_memalign")         ? (void *)hook_posix_memalign
                           : !strcmp(name, "free")                   ? (void *)hook_free
                           : !strcmp(name, "_ZnwmSt11align_val_t")   ? (void *)hook_new_aligned
                           : !strcmp(name, "_ZdlPvSt11align_val_t")  ? (void *)hook_delete_aligned
                           : !strcmp(name, "_ZdlPvmSt11align_val_t") ? (void *)hook_delete_sized_aligned
                                                                     : NULL;
            if (!target) continue;
            void **slot = (void **)(base + r[i].r_offset);
            if (*slot == target) { job->patched++; continue; } /* installed before */
            if (patch_slot(slot, target)) {
                job->error = "mprotect refused to make the offset table writable";
                return 1;
            }
            job->patched++;
        }
    }
    return 1;
}

/* ---- Python interface ---- */

static int parse_device(PyObject *args, int *d) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return -1;
    if (!strcmp(name, "cpu")) *d = CPU;
    else if (!strcmp(name, "cuda")) *d = CUDA;
    else {
        PyErr_Format(PyExc_ValueError, "device must be 'cpu' or 'cuda', not %R", PyTuple_GET_ITEM(args, 0));
        return -1;
    }
    return 0;
}

static PyObject *py_install(PyObject *self, PyObject *args) {
    PatchJob job = {0};
    if (!PyArg_ParseTuple(args, "s", &job.needle)) return NULL;
    if (!dl_iterate_phdr(patch_object, &job)) {
        PyErr_Format(PyExc_RuntimeError, "no loaded library matches %s", job.needle);
        return NULL;
    }
    if (job.error) {
        PyErr_Format(PyExc_RuntimeError, "%s: %s", job.needle, job.error);
        return NULL;
    }
    return PyLong_FromLong(job.patched);
}

static PyObject *py_cuda_functions(PyObject *self, PyObject *noargs) {
    static const char *libs[] = {"libcudart.so.12", "libcudart.so.11.0", "libcudart.so", NULL};
    for (int i = 0; !cuda_malloc && libs[i]; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) h = dlopen(libs[i], RTLD_NOW);
        if (!h) continue;
        cuda_malloc = (cuda_malloc_t)dlsym(h, "cudaMalloc");
        cuda_free = (cuda_free_t)dlsym(h, "cudaFree");
    }
    if (!cuda_malloc || !cuda_free) {
        PyErr_SetString(PyExc_RuntimeError, "the CUDA runtime (libcudart) is not loadable");
        return NULL;
    }
    dev[CUDA].any_thread = 1;
    return Py_BuildValue("(nnn)", (Py_ssize_t)(uintptr_t)roam_cuda_alloc, (Py_ssize_t)(uintptr_t)roam_cuda_free,
                         (Py_ssize_t)(uintptr_t)roam_cuda_empty_cache);
}

static PyObject *py_begin_record(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    vec_free(&s->rec_size), vec_free(&s->rec_alloc), vec_free(&s->rec_free);
    map_clear(&s->rec_live);
    s->events = 0;
    s->owner = pthread_self();
    s->mode = RECORD;
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

static PyObject *int64_list(const int64_t *v, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromLongLong(v[i]));
    return list;
}

/* (sizes, alloc events, free events, events): requests still live have free event -1. */
static PyObject *py_end_record(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    int failed = s->mode != RECORD;
    s->mode = OFF;
    map_clear(&s->rec_live); /* what is still live stays live to the end */
    PyObject *r = failed ? NULL
                         : Py_BuildValue("(NNNL)", int64_list(s->rec_size.v, s->rec_size.n),
                                         int64_list(s->rec_alloc.v, s->rec_alloc.n),
                                         int64_list(s->rec_free.v, s->rec_free.n), (long long)s->events);
    pthread_mutex_unlock(&lock);
    if (failed) PyErr_SetString(PyExc_MemoryError, "recording ORT's requests ran out of memory");
    return r;
}

static int64_t *int64_array(PyObject *seq, Py_ssize_t n) {
    int64_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return (int64_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v[i] == -1 && PyErr_Occurred()) {
            free(v);
            return NULL;
        }
    }
    return v;
}

static void drop_plan(Device *s) {
    free(s->size), free(s->offset), free(s->ov_start), free(s->ov), free(s->live), free(s->taken);
    s->size = s->offset = s->ov_start = s->ov = NULL;
    s->live = s->taken = NULL;
    s->n = 0;
    map_clear(&s->served);
    if (s->base) device_free(s == &dev[CPU] ? CPU : CUDA, s->base);
    s->base = NULL;
    s->arena_bytes = 0;
}

static int64_t *order_by_offset;
static int by_offset(const void *a, const void *b) {
    int64_t x = order_by_offset[*(const int64_t *)a], y = order_by_offset[*(const int64_t *)b];
    return (x > y) - (x < y);
}

/* Slots sharing bytes: a sweep over slots sorted by offset (pairs only, never n^2 tests). */
static int build_overlaps(Device *s, const int64_t *rounded) {
    int64_t n = s->n;
    int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    Vec a = {0}, b = {0};
    if (!idx) return -1;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    order_by_offset = s->offset;
    qsort(idx, (size_t)n, sizeof *idx, by_offset);
    for (int64_t x = 0; x < n; x++) {
        int64_t i = idx[x], top = s->offset[i] + rounded[i];
        for (int64_t y = x + 1; y < n && s->offset[idx[y]] < top; y++)
            if (vec_push(&a, i) || vec_push(&b, idx[y])) goto fail;
    }
    s->ov_start = calloc((size_t)n + 1, sizeof *s->ov_start);
    s->ov = malloc((a.n * 2 + 1) * sizeof *s->ov);
    if (!s->ov_start || !s->ov) goto fail;
    for (size_t k = 0; k < a.n; k++) s->ov_start[a.v[k] + 1]++, s->ov_start[b.v[k] + 1]++;
    for (int64_t i = 0; i < n; i++) s->ov_start[i + 1] += s->ov_start[i];
    int64_t *fill = malloc((size_t)(n ? n : 1) * sizeof *fill);
    if (!fill) goto fail;
    memcpy(fill, s->ov_start, (size_t)n * sizeof *fill);
    for (size_t k = 0; k < a.n; k++) s->ov[fill[a.v[k]]++] = b.v[k], s->ov[fill[b.v[k]]++] = a.v[k];
    free(fill);
    free(idx), vec_free(&a), vec_free(&b);
    return 0;
fail:
    free(idx), vec_free(&a), vec_free(&b);
    return -1;
}

/* load_plan(device, sizes, offsets, rounded sizes, arena bytes): slot k serves request k. */
static PyObject *py_load_plan(PyObject *self, PyObject *args) {
    const char *name;
    PyObject *sizes, *offsets, *rounded;
    long long arena;
    if (!PyArg_ParseTuple(args, "sOOOL", &name, &sizes, &offsets, &rounded, &arena)) return NULL;
    PyObject *dev_args = Py_BuildValue("(s)", name);
    int d, bad_device = !dev_args || parse_device(dev_args, &d);
    Py_XDECREF(dev_args);
    if (bad_device) return NULL;
    PyObject *fs = PySequence_Fast(sizes, "sizes"), *fo = PySequence_Fast(offsets, "offsets"),
             *fr = PySequence_Fast(rounded, "rounded");
    if (!fs || !fo || !fr) goto fail_seq;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fs);
    if (PySequence_Fast_GET_SIZE(fo) != n || PySequence_Fast_GET_SIZE(fr) != n) {
        PyErr_SetString(PyExc_ValueError, "sizes, offsets and rounded sizes differ in length");
        goto fail_seq;
    }
    int64_t *sz = int64_array(fs, n), *off = int64_array(fo, n), *rs = int64_array(fr, n);
    Py_DECREF(fs), Py_DECREF(fo), Py_DECREF(fr);
    if (!sz || !off || !rs) {
        free(sz), free(off), free(rs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (off[i] < 0 || rs[i] < sz[i] || off[i] + rs[i] > arena) {
            free(sz), free(off), free(rs);
            PyErr_Format(PyExc_ValueError, "slot %zd does not fit the arena", i);
            return NULL;
        }
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    if (s->served.used) {
        pthread_mutex_unlock(&lock);
        free(sz), free(off), free(rs);
        PyErr_SetString(PyExc_RuntimeError, "arena buffers are still in use; free them before loading a plan");
        return NULL;
    }
    drop_plan(s);
    s->n = n, s->size = sz, s->offset = off, s->arena_bytes = arena;
    s->live = calloc((size_t)n + 1, 1);
    s->taken = calloc((size_t)n + 1, 1);
    void *base = NULL;
    int bad = !s->live || !s->taken || build_overlaps(s, rs) || device_alloc(d, &base, 4096, (size_t)(arena ? arena : 1));
    free(rs);
    if (bad) {
        drop_plan(s);
        pthread_mutex_unlock(&lock);
        return PyErr_NoMemory();
    }
    s->base = base;
    int64_t pairs = s->ov_start[n] / 2;
    pthread_mutex_unlock(&lock);
    return PyLong_FromLongLong(pairs);
fail_seq:
    Py_XDECREF(fs), Py_XDECREF(fo), Py_XDECREF(fr);
    return NULL;
}

static PyObject *py_begin_step(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    if (!s->base) {
        pthread_mutex_unlock(&lock);
        PyErr_SetString(PyExc_RuntimeError, "no plan loaded");
        return NULL;
    }
    memcpy(s->taken, s->live, (size_t)s->n); /* a slot still held from the last step is not free */
    s->cursor = 0;
    while (s->cursor < s->n && s->taken[s->cursor]) s->cursor++;
    s->st_served = s->st_served_bytes = s->st_unplanned = s->st_unplanned_bytes = 0;
    s->st_conflicts = s->st_other_threads = s->st_high_water = 0;
    s->st_fallback_peak = s->st_fallback_live;
    s->owner = pthread_self();
    s->mode = SERVE;
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

static PyObject *py_end_step(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    s->mode = OFF;
    int64_t held = 0;
    for (int64_t j = 0; j < s->n; j++) held += s->live[j];
    PyObject *r = Py_BuildValue("{sLsLsLsLsLsLsLsLsL}", "served", (long long)s->st_served, "served_bytes",
                                (long long)s->st_served_bytes, "unplanned", (long long)s->st_unplanned,
                                "unplanned_bytes", (long long)s->st_unplanned_bytes, "unplanned_peak_bytes",
                                (long long)s->st_fallback_peak, "conflicts", (long long)s->st_conflicts,
                                "other_threads", (long long)s->st_other_threads, "arena_high_water",
                                (long long)s->st_high_water, "held_after_step", (long long)held);
    pthread_mutex_unlock(&lock);
    return r;
}

static PyObject *py_live(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    PyObject *r = Py_BuildValue("(nL)", (Py_ssize_t)s->served.used, (long long)s->st_fallback_live);
    pthread_mutex_unlock(&lock);
    return r;
}

static PyObject *py_drop(PyObject *self, PyObject *args) {
    int d;
    if (parse_device(args, &d)) return NULL;
    pthread_mutex_lock(&lock);
    Device *s = &dev[d];
    int busy = s->served.used != 0;
    if (!busy) {
        drop_plan(s);
        s->mode = OFF;
    }
    pthread_mutex_unlock(&lock);
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "arena buffers are still in use");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS, "install(library): serve posix_memalign/free of that loaded library; slots patched."},
    {"cuda_functions", py_cuda_functions, METH_NOARGS, "(alloc, free, empty_cache) addresses for gpu_external_*."},
    {"begin_record", py_begin_record, METH_VARARGS, "begin_record(device): log this thread's requests."},
    {"end_record", py_end_record, METH_VARARGS, "end_record(device) -> (sizes, alloc events, free events, events)."},
    {"load_plan", py_load_plan, METH_VARARGS, "load_plan(device, sizes, offsets, rounded, arena): slot pairs sharing bytes."},
    {"begin_step", py_begin_step, METH_VARARGS, "begin_step(device): serve this thread's requests from the arena."},
    {"end_step", py_end_step, METH_VARARGS, "end_step(device) -> the step's statistics."},
    {"live", py_live, METH_VARARGS, "live(device) -> (arena buffers live, fallback bytes live)."},
    {"drop", py_drop, METH_VARARGS, "drop(device): free the arena (nothing may be live in it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planalloc", "The plan's arena as ONNX Runtime's allocator.", -1, methods};

PyMODINIT_FUNC PyInit__planalloc(void) { return PyModule_Create(&module); }
