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
 *   1.19), or from C++'s aligned operator new and delete (onnxruntime 1.20 on). new_session()
 *   points those entries of the ORT library's global offset table at our functions, the way a
 *   preloaded allocator would, but for that one library only, and the last session to go puts
 *   the original entries back. libstdc++'s aligned delete is free, so a buffer from either pair
 *   may be returned through the other.
 * - CUDA: the CUDA provider takes external allocator functions as provider options
 *   (gpu_external_alloc / gpu_external_free / gpu_external_empty_cache); cuda_functions()
 *   gives their addresses. cudaMalloc and cudaFree are looked up at run time in the CUDA
 *   runtime ORT already loaded: nothing here links against CUDA.
 *
 * Each planned session has a state of its own (a handle: new_session ... close). RECORD passes
 * requests through to the real allocator and logs each (size, alloc event, free event); Python
 * gives one offset and one pool per request (load_plan). SERVE then answers the k-th request of a
 * step at base[pool[k]] + offset[k]. Pool 0 is the device's arena, pool 1 the slow tier's (a plan
 * that offloads, DESIGN.md "Memory tiers"): on CUDA pinned host memory, which the GPU's kernels
 * read and write over the bus; on the CPU both are host memory, each of its plan's size. A slot
 * AT_ADDRESS is served at the address its offset holds: a state's own buffer, which an elementwise
 * kernel's output is written over (plan field `written_over`). A request that does not match
 * (another size, or its place still taken by a buffer that is live) falls back to the real
 * allocator and is counted, the first one noted: the arena can be wrong about nothing, only unused.
 * Slots of one storage group (a storage and the outputs written over it, each while the one before
 * is still held by ORT: the kernel reads it as it writes) may share bytes while both are live; the
 * served map then holds the newest at the address, each slot the one it was served over, and a free
 * at the address releases the oldest still held (ORT frees a kernel's input no later than its output).
 *
 * A session serves only the thread that began its step (ORT's sequential executor allocates on
 * the calling thread), one session per thread at a time; requests from other threads pass
 * through and are counted. The sessions are behind one mutex, which is never held while Python
 * runs or memory is taken from the system: a Python object built under it could start the
 * garbage collector, whose frees of ORT values come back here for the same mutex. */

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
#include <time.h>
#include <unistd.h>

enum { OFF = 0, RECORD = 1, SERVE = 2 };
enum { CPU = 0, CUDA = 1, DEVICES = 2 };
enum { POOLS = 2 }; /* the device's arena and the slow tier's */
enum { AT_ADDRESS = 2 }; /* a slot's pool when its offset is an address (a state's buffer) */
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

/* The value stored for key, or -1. */
static int64_t map_get(const PtrMap *m, uintptr_t key) {
    if (!m->cap) return -1;
    for (size_t s = slot_of(m, key); m->keys[s]; s = (s + 1) & (m->cap - 1))
        if (m->keys[s] == key) return m->vals[s];
    return -1;
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

/* ---- per-session state ---- */

typedef struct {
    int64_t requests, served_bytes, unplanned, unplanned_bytes, conflicts, other_threads;
    int64_t fallback_peak;
    int64_t pool_served[POOLS], pool_planned[POOLS], pool_high_water[POOLS];
    int64_t at_address, at_address_planned; /* served at a state's own buffer (its own slot: the plan's) */
    int64_t miss_request, miss_size, miss_slot; /* the step's first unplanned request (-1: none) */
} Stats;

typedef struct Session {
    int64_t id;
    int device, mode, closed;
    pthread_t owner;
    /* RECORD */
    Vec rec_size, rec_alloc, rec_free; /* per request: bytes, alloc event, free event (-1: live) */
    Vec rec_time; /* and when it came (CLOCK_REALTIME ns: the clock of ORT's profiler on Linux) */
    int64_t events;
    int rec_failed;
    PtrMap rec_live; /* pointer -> request */
    /* the plan: one slot per recorded request */
    int64_t n;
    int64_t *size, *offset;
    int64_t *ov_start, *ov; /* CSR: slots whose bytes overlap slot i's (at other times) */
    int64_t *under; /* the live slot of its storage group a slot was served over in this step, or -1 */
    char *live, *taken, *planned; /* planned: the slot is a tensor of roam's plan, at its offset */
    char *pool; /* the pool each slot is in (AT_ADDRESS: none) */
    char *base[POOLS];
    int64_t arena_bytes[POOLS];
    int64_t cursor;
    PtrMap served; /* arena or state pointer -> the newest slot served there */
    PtrMap fallback; /* pointer -> bytes, for requests served by the real allocator */
    int64_t fallback_live;
    Stats st;
    struct Session *next;
} Session;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the sessions and everything in them */
static Session *sessions;
static int64_t next_id = 1;
static int engaged[DEVICES]; /* sessions per device; atomic reads: hook_free's lock-free path */

/* the real allocators */
static int (*real_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static void (*real_free)(void *) = free;
typedef int (*cuda_malloc_t)(void **, size_t);
typedef int (*cuda_free_t)(void *);
static cuda_malloc_t cuda_malloc;
static cuda_free_t cuda_free;
static cuda_malloc_t cuda_malloc_host; /* pinned host memory: the slow pool of a CUDA session */
static cuda_free_t cuda_free_host;

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

/* A pool's arena: the slow pool of a CUDA session in pinned host memory, every other in the device's. */
static int pool_alloc(int d, int pool, void **p, size_t size) {
    if (d == CUDA && pool == 1) return cuda_malloc_host && cuda_malloc_host(p, size) == 0 ? 0 : -1;
    return device_alloc(d, p, 4096, size);
}

static void pool_free(int d, int pool, void *p) {
    if (d == CUDA && pool == 1) {
        if (cuda_free_host) cuda_free_host(p);
    } else
        device_free(d, p);
}

/* Under the lock. */
static Session *find(int64_t id) {
    for (Session *s = sessions; s; s = s->next)
        if (s->id == id) return s;
    return NULL;
}

/* Under the lock: the session planning this thread's requests on device d, or NULL (CUDA: the
 * provider calls from its own threads, so the one session of the device in a step). */
static Session *planning(int d) {
    for (Session *s = sessions; s; s = s->next)
        if (s->device == d && s->mode != OFF && (d == CUDA || pthread_equal(pthread_self(), s->owner))) return s;
    return NULL;
}

static Session *busy_elsewhere(int d) {
    for (Session *s = sessions; s; s = s->next)
        if (s->device == d && s->mode != OFF) return s;
    return NULL;
}

/* Where slot j is served. */
static char *slot_address(const Session *s, int64_t j) {
    if (s->pool[j] == AT_ADDRESS) return (char *)(uintptr_t)s->offset[j];
    return s->base[(int)s->pool[j]] + s->offset[j];
}

static int in_arena(const Session *s, const void *p) {
    for (int q = 0; q < POOLS; q++)
        if (s->base[q] && (const char *)p >= s->base[q] && (const char *)p < s->base[q] + s->arena_bytes[q]) return 1;
    return 0;
}

static int conflicts(Session *s, int64_t j) {
    for (int64_t k = s->ov_start[j]; k < s->ov_start[j + 1]; k++)
        if (s->live[s->ov[k]]) {
            s->st.conflicts++;
            return 1;
        }
    return 0;
}

/* A slot for request k of `size` bytes at `align`, or -1: slot k itself when it fits (the request
 * is the one recorded there), else the first free slot of that size a little past the cursor (the
 * sequence moved: a one-off request skipped). A slot whose bytes are held by a live one is refused. */
static int64_t match_slot(Session *s, int64_t k, size_t size, size_t align) {
    if (k < s->n && !s->taken[k] && s->size[k] == (int64_t)size && (uintptr_t)slot_address(s, k) % align == 0)
        return conflicts(s, k) ? -1 : k;
    int64_t end = s->cursor + LOOKAHEAD < s->n ? s->cursor + LOOKAHEAD : s->n;
    for (int64_t j = s->cursor; j < end; j++) {
        if (j == k || s->taken[j] || s->size[j] != (int64_t)size || (uintptr_t)slot_address(s, j) % align) continue;
        return conflicts(s, j) ? -1 : j;
    }
    return -1;
}

typedef struct {
    int64_t *size, *offset, *ov_start, *ov, *under;
    char *live, *taken, *planned, *pool, *base[POOLS];
    int64_t n, arena_bytes[POOLS];
} Plan;

static void free_plan(int d, Plan *p) {
    free(p->size), free(p->offset), free(p->ov_start), free(p->ov), free(p->live), free(p->taken), free(p->planned);
    free(p->pool), free(p->under);
    for (int q = 0; q < POOLS; q++)
        if (p->base[q]) pool_free(d, q, p->base[q]);
    memset(p, 0, sizeof *p);
}

/* Under the lock: the session's plan moved out into `p` (freed later, outside the lock). */
static void take_plan(Session *s, Plan *p) {
    *p = (Plan){s->size, s->offset, s->ov_start, s->ov, s->under, s->live, s->taken, s->planned, s->pool,
                {s->base[0], s->base[1]}, s->n, {s->arena_bytes[0], s->arena_bytes[1]}};
    s->size = s->offset = s->ov_start = s->ov = s->under = NULL;
    s->live = s->taken = s->planned = s->pool = NULL;
    memset(s->base, 0, sizeof s->base);
    memset(s->arena_bytes, 0, sizeof s->arena_bytes);
    s->n = 0;
    map_clear(&s->served);
}

static void unpatch_all(void);

/* Outside the lock: a session already unlinked. */
static void destroy(Session *s) {
    Plan p;
    take_plan(s, &p);
    free_plan(s->device, &p);
    vec_free(&s->rec_size), vec_free(&s->rec_alloc), vec_free(&s->rec_free), vec_free(&s->rec_time);
    map_clear(&s->rec_live), map_clear(&s->fallback);
    int cpu = s->device == CPU;
    free(s);
    if (cpu) unpatch_all(); /* the original allocator back when no CPU session is left */
}

/* Under the lock. */
static void unlink_session(Session *s) {
    for (Session **at = &sessions; *at; at = &(*at)->next)
        if (*at == s) {
            *at = s->next;
            __atomic_sub_fetch(&engaged[s->device], 1, __ATOMIC_RELEASE);
            return;
        }
}

static void *allocate(int d, size_t size, size_t align) {
    void *p = NULL;
    pthread_mutex_lock(&lock);
    Session *s = planning(d);
    if (!s) {
        Session *other = busy_elsewhere(d);
        if (other) other->st.other_threads++;
        pthread_mutex_unlock(&lock);
        return device_alloc(d, &p, align, size) ? NULL : p;
    }
    if (s->mode == SERVE) {
        int64_t k = s->st.requests++;
        int64_t j = match_slot(s, k, size, align);
        int64_t over = j >= 0 ? map_get(&s->served, (uintptr_t)slot_address(s, j)) : -1; /* its group's, live */
        if (j >= 0 && map_put(&s->served, (uintptr_t)slot_address(s, j), j) == 0) {
            s->taken[j] = s->live[j] = 1;
            s->under[j] = over;
            while (s->cursor < s->n && s->taken[s->cursor]) s->cursor++;
            p = slot_address(s, j);
            int at_plan = j == k && s->planned[j]; /* its own slot: the plan's offset */
            int q = s->pool[j];
            s->st.served_bytes += (int64_t)size;
            if (q == AT_ADDRESS) {
                s->st.at_address++;
                s->st.at_address_planned += at_plan;
            } else {
                s->st.pool_served[q]++;
                s->st.pool_planned[q] += at_plan;
                if (s->offset[j] + (int64_t)size > s->st.pool_high_water[q])
                    s->st.pool_high_water[q] = s->offset[j] + (int64_t)size;
            }
            pthread_mutex_unlock(&lock);
            return p;
        }
        if (s->st.miss_request < 0) {
            s->st.miss_request = k;
            s->st.miss_size = (int64_t)size;
            s->st.miss_slot = s->cursor < s->n ? s->cursor : -1;
        }
    }
    int64_t id = s->id;
    int mode = s->mode;
    pthread_mutex_unlock(&lock);
    if (device_alloc(d, &p, align, size)) return NULL;
    pthread_mutex_lock(&lock);
    s = find(id);
    if (s && s->mode == mode && mode == RECORD) {
        int64_t k = (int64_t)s->rec_size.n;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (vec_push(&s->rec_size, (int64_t)size) || vec_push(&s->rec_alloc, s->events++) ||
            vec_push(&s->rec_time, (int64_t)now.tv_sec * 1000000000 + now.tv_nsec) ||
            vec_push(&s->rec_free, -1) || map_put(&s->rec_live, (uintptr_t)p, k)) {
            s->mode = OFF; /* out of memory for the log: stop recording, end_record reports it */
            s->rec_failed = 1;
        }
    } else if (s && s->mode == mode) {
        s->st.unplanned++;
        s->st.unplanned_bytes += (int64_t)size;
        s->fallback_live += (int64_t)size;
        if (s->fallback_live > s->st.fallback_peak) s->st.fallback_peak = s->fallback_live;
        map_put(&s->fallback, (uintptr_t)p, (int64_t)size);
    } /* else the session ended meanwhile: p is the system's, and free hands it back there */
    pthread_mutex_unlock(&lock);
    return p;
}

static void release(int d, void *p) {
    if (!p) return;
    Session *gone = NULL;
    int ours = 0;
    pthread_mutex_lock(&lock);
    for (Session *s = sessions; s; s = s->next) {
        if (s->device != d) continue;
        int64_t j = s->served.used ? map_take(&s->served, (uintptr_t)p) : -1;
        if (j >= 0 || in_arena(s, p)) {
            if (j >= 0) {
                /* of the slots held at p (a storage and the outputs written over it, each over the
                 * one before), the oldest: ORT frees a kernel's input no later than its output, and
                 * one of them may outlive the plan (an output ORT keeps for a later reader) */
                int64_t newer = -1, oldest = j;
                while (s->under[oldest] >= 0 && s->live[s->under[oldest]]) {
                    newer = oldest;
                    oldest = s->under[oldest];
                }
                s->live[oldest] = 0;
                if (newer >= 0) {
                    s->under[newer] = -1;
                    map_put(&s->served, (uintptr_t)p, j); /* the entry was just taken: no growth */
                }
            }
            if (s->closed && !s->served.used) unlink_session(gone = s); /* closed while it was live */
            ours = 1;
            break;
        }
        int64_t k = s->rec_live.used ? map_take(&s->rec_live, (uintptr_t)p) : -1;
        if (k >= 0) {
            s->rec_free.v[k] = s->events++;
            break;
        }
        int64_t bytes = s->fallback.used ? map_take(&s->fallback, (uintptr_t)p) : -1;
        if (bytes >= 0) {
            s->fallback_live -= bytes;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (gone) destroy(gone);
    if (!ours) device_free(d, p);
}

/* ---- the hooks ---- */

static int hook_posix_memalign(void **out, size_t align, size_t size) {
    void *p = allocate(CPU, size, align);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

static void hook_free(void *p) {
    if (!__atomic_load_n(&engaged[CPU], __ATOMIC_ACQUIRE)) {
        real_free(p); /* no session: nothing of ours can be live, and the common path takes no lock */
        return;
    }
    release(CPU, p);
}

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

void *roam_cuda_alloc(size_t size) { return allocate(CUDA, size, 256); }
void roam_cuda_free(void *p) {
    if (!__atomic_load_n(&engaged[CUDA], __ATOMIC_ACQUIRE)) device_free(CUDA, p);
    else release(CUDA, p);
}
void roam_cuda_empty_cache(void) {}

/* ---- GOT patching ---- */

/* Every entry patched, with what it held, so that the last session can put them back. Behind
 * patch_lock (never taken inside the sessions' lock). */
typedef struct {
    void **slot;
    void *original, *hook;
} Patched;

static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;
static Patched *patched;
static size_t n_patched, cap_patched;

typedef struct {
    const char *needle;
    int found;
    const char *error;
} PatchJob;

static int set_slot(void **slot, void *target) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)slot & ~(uintptr_t)(page - 1);
    if (mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE)) return -1;
    __atomic_store_n(slot, target, __ATOMIC_RELEASE);
    /* RELRO makes the table read-only after loading; put that back */
    mprotect((void *)start, (size_t)page, PROT_READ);
    return 0;
}

static void *hook_for(const char *name) {
    return !strcmp(name, "posix_memalign")         ? (void *)hook_posix_memalign
           : !strcmp(name, "free")                   ? (void *)hook_free
           : !strcmp(name, "_ZnwmSt11align_val_t")   ? (void *)hook_new_aligned
           : !strcmp(name, "_ZdlPvSt11align_val_t")  ? (void *)hook_delete_aligned
           : !strcmp(name, "_ZdlPvmSt11align_val_t") ? (void *)hook_delete_sized_aligned
                                                     : NULL;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data) {
    PatchJob *job = data;
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, job->needle)) return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    job->found = 1;
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
            void *target = hook_for(names + syms[ELF64_R_SYM(r[i].r_info)].st_name);
            if (!target) continue;
            void **slot = (void **)(base + r[i].r_offset);
            if (*slot == target) continue; /* listed already */
            if (n_patched == cap_patched) {
                size_t cap = cap_patched ? cap_patched * 2 : 16;
                Patched *grown = realloc(patched, cap * sizeof *grown);
                if (!grown) {
                    job->error = "out of memory";
                    return 1;
                }
                patched = grown, cap_patched = cap;
            }
            void *original = *slot;
            if (set_slot(slot, target)) {
                job->error = "mprotect refused to make the offset table writable";
                return 1;
            }
            patched[n_patched++] = (Patched){slot, original, target};
        }
    }
    return 1;
}

/* Under patch_lock. */
static void restore_slots(void) {
    for (size_t i = 0; i < n_patched; i++)
        if (*patched[i].slot == patched[i].hook) set_slot(patched[i].slot, patched[i].original);
    n_patched = 0;
}

/* The original entries back, when no CPU session is left. */
static void unpatch_all(void) {
    pthread_mutex_lock(&patch_lock);
    pthread_mutex_lock(&lock);
    int left = engaged[CPU];
    pthread_mutex_unlock(&lock);
    if (!left) restore_slots();
    pthread_mutex_unlock(&patch_lock);
}

/* ---- Python interface ---- */

static int parse_device(const char *name, int *d) {
    if (!strcmp(name, "cpu")) *d = CPU;
    else if (!strcmp(name, "cuda")) *d = CUDA;
    else {
        PyErr_Format(PyExc_ValueError, "device must be 'cpu' or 'cuda', not '%s'", name);
        return -1;
    }
    return 0;
}

/* new_session(device, library): a handle. CPU: the library's allocation entries are patched
 * (once for all sessions; put back when the last one is gone). */
static PyObject *py_new_session(PyObject *self, PyObject *args) {
    const char *name, *library;
    int d;
    if (!PyArg_ParseTuple(args, "ss", &name, &library) || parse_device(name, &d)) return NULL;
    if (d == CUDA && !cuda_malloc) {
        PyErr_SetString(PyExc_RuntimeError, "call cuda_functions() first");
        return NULL;
    }
    Session *s = calloc(1, sizeof *s);
    if (!s) return PyErr_NoMemory();
    s->device = d;
    pthread_mutex_lock(&patch_lock);
    if (d == CPU && !n_patched) {
        PatchJob job = {library, 0, NULL};
        dl_iterate_phdr(patch_object, &job);
        const char *why = !job.found ? "no loaded library has that name"
                          : job.error ? job.error
                          : !n_patched ? "it calls none of posix_memalign, free and aligned operator new/delete "
                                         "through its offset table (this ONNX Runtime build allocates otherwise)"
                                       : NULL;
        if (why) {
            restore_slots();
            pthread_mutex_unlock(&patch_lock);
            free(s);
            PyErr_Format(PyExc_RuntimeError, "%s: %s", library, why);
            return NULL;
        }
    }
    pthread_mutex_lock(&lock);
    s->id = next_id++;
    s->next = sessions;
    sessions = s;
    __atomic_add_fetch(&engaged[d], 1, __ATOMIC_RELEASE);
    int64_t id = s->id;
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&patch_lock);
    return PyLong_FromLongLong(id);
}

static PyObject *py_patched(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&patch_lock);
    size_t n = n_patched;
    pthread_mutex_unlock(&patch_lock);
    return PyLong_FromSize_t(n);
}

static PyObject *py_cuda_functions(PyObject *self, PyObject *noargs) {
    static const char *libs[] = {"libcudart.so.12", "libcudart.so.11.0", "libcudart.so", NULL};
    for (int i = 0; !cuda_malloc && libs[i]; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) h = dlopen(libs[i], RTLD_NOW);
        if (!h) continue;
        cuda_malloc = (cuda_malloc_t)dlsym(h, "cudaMalloc");
        cuda_free = (cuda_free_t)dlsym(h, "cudaFree");
        cuda_malloc_host = (cuda_malloc_t)dlsym(h, "cudaMallocHost");
        cuda_free_host = (cuda_free_t)dlsym(h, "cudaFreeHost");
    }
    if (!cuda_malloc || !cuda_free) {
        cuda_malloc = NULL;
        PyErr_SetString(PyExc_RuntimeError, "the CUDA runtime (libcudart) is not loadable");
        return NULL;
    }
    return Py_BuildValue("(nnn)", (Py_ssize_t)(uintptr_t)roam_cuda_alloc, (Py_ssize_t)(uintptr_t)roam_cuda_free,
                         (Py_ssize_t)(uintptr_t)roam_cuda_empty_cache);
}

/* Under the lock: the open session of that handle, or NULL (the caller raises after unlocking). */
static Session *session_of(int64_t id) {
    Session *s = find(id);
    return s && !s->closed ? s : NULL;
}

#define PARSE_HANDLE(args, id) \
    long long id;              \
    if (!PyArg_ParseTuple(args, "L", &id)) return NULL;

static PyObject *closed_error(void) {
    PyErr_SetString(PyExc_RuntimeError, "that allocator session is closed");
    return NULL;
}

static PyObject *py_begin(PyObject *args, int mode) {
    PARSE_HANDLE(args, id)
    pthread_mutex_lock(&lock);
    Session *s = session_of(id);
    if (!s) {
        pthread_mutex_unlock(&lock);
        return closed_error();
    }
    Session *other = s->device == CUDA ? busy_elsewhere(CUDA) : planning(CPU);
    const char *why = other && other != s ? "another planned session is in a step on this device and thread: end it first"
                      : mode == SERVE && !s->pool ? "no plan loaded"
                                                  : NULL;
    if (!why && mode == RECORD) {
        vec_free(&s->rec_size), vec_free(&s->rec_alloc), vec_free(&s->rec_free), vec_free(&s->rec_time);
        map_clear(&s->rec_live);
        s->events = 0;
        s->rec_failed = 0;
    } else if (!why) {
        memcpy(s->taken, s->live, (size_t)s->n); /* a slot still held from the last step is not free */
        s->cursor = 0;
        while (s->cursor < s->n && s->taken[s->cursor]) s->cursor++;
        memset(&s->st, 0, sizeof s->st);
        s->st.fallback_peak = s->fallback_live;
        s->st.miss_request = s->st.miss_size = s->st.miss_slot = -1;
    }
    if (!why) {
        s->owner = pthread_self();
        s->mode = mode;
    }
    pthread_mutex_unlock(&lock);
    if (why) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_begin_record(PyObject *self, PyObject *args) { return py_begin(args, RECORD); }
static PyObject *py_begin_step(PyObject *self, PyObject *args) { return py_begin(args, SERVE); }

static PyObject *int64_list(const int64_t *v, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

/* (sizes, alloc events, free events, times, events): requests still live have free event -1. The
 * log is moved out under the lock and turned into lists after it. */
static PyObject *py_end_record(PyObject *self, PyObject *args) {
    PARSE_HANDLE(args, id)
    pthread_mutex_lock(&lock);
    Session *s = session_of(id);
    if (!s) {
        pthread_mutex_unlock(&lock);
        return closed_error();
    }
    int failed = s->rec_failed || s->mode != RECORD;
    s->mode = OFF;
    map_clear(&s->rec_live); /* what is still live stays live to the end */
    Vec sizes = s->rec_size, allocs = s->rec_alloc, frees = s->rec_free, times = s->rec_time;
    long long events = s->events;
    memset(&s->rec_size, 0, sizeof s->rec_size), memset(&s->rec_alloc, 0, sizeof s->rec_alloc);
    memset(&s->rec_free, 0, sizeof s->rec_free), memset(&s->rec_time, 0, sizeof s->rec_time);
    pthread_mutex_unlock(&lock);
    PyObject *r = NULL;
    if (failed)
        PyErr_SetString(PyExc_MemoryError, "recording ORT's requests ran out of memory");
    else
        r = Py_BuildValue("(NNNNL)", int64_list(sizes.v, sizes.n), int64_list(allocs.v, allocs.n),
                          int64_list(frees.v, frees.n), int64_list(times.v, times.n), events);
    vec_free(&sizes), vec_free(&allocs), vec_free(&frees), vec_free(&times);
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

static const Plan *order_by; /* the GIL is held: one sort at a time */
static int by_place(const void *a, const void *b) {
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (order_by->pool[i] != order_by->pool[j]) return order_by->pool[i] - order_by->pool[j];
    return (order_by->offset[i] > order_by->offset[j]) - (order_by->offset[i] < order_by->offset[j]);
}

/* Slots sharing bytes: a sweep over slots sorted by pool, then offset (pairs only, never n^2 tests);
 * slots of one storage group (group[i] == group[j] >= 0) and slots AT_ADDRESS are left out. */
static int build_overlaps(Plan *s, const int64_t *rounded, const int64_t *group) {
    int64_t n = s->n;
    int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    Vec a = {0}, b = {0};
    if (!idx) return -1;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    order_by = s;
    qsort(idx, (size_t)n, sizeof *idx, by_place);
    for (int64_t x = 0; x < n; x++) {
        int64_t i = idx[x], top = s->offset[i] + rounded[i];
        if (s->pool[i] == AT_ADDRESS) continue;
        for (int64_t y = x + 1; y < n && s->pool[idx[y]] == s->pool[i] && s->offset[idx[y]] < top; y++)
            if ((group[i] < 0 || group[i] != group[idx[y]]) && (vec_push(&a, i) || vec_push(&b, idx[y]))) goto fail;
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

/* load_plan(handle, sizes, offsets, rounded sizes, planned flags, pools, storage groups, (device
 * arena bytes, slow arena bytes)): slot k serves request k, in pool pools[k] (AT_ADDRESS: at the
 * address offsets[k]), of storage group groups[k] (-1: none). The plan and its arena are built
 * before the lock is taken, swapped in under it, the old one freed after. */
static PyObject *py_load_plan(PyObject *self, PyObject *args) {
    long long id, arena[POOLS];
    PyObject *sizes, *offsets, *rounded, *flags, *pools, *groups;
    if (!PyArg_ParseTuple(args, "LOOOOOO(LL)", &id, &sizes, &offsets, &rounded, &flags, &pools, &groups, &arena[0],
                          &arena[1]))
        return NULL;
    PyObject *fs = PySequence_Fast(sizes, "sizes"), *fo = PySequence_Fast(offsets, "offsets"),
             *fr = PySequence_Fast(rounded, "rounded"), *ff = PySequence_Fast(flags, "planned flags"),
             *fp = PySequence_Fast(pools, "pools"), *fg = PySequence_Fast(groups, "groups");
    if (!fs || !fo || !fr || !ff || !fp || !fg) {
        Py_XDECREF(fs), Py_XDECREF(fo), Py_XDECREF(fr), Py_XDECREF(ff), Py_XDECREF(fp), Py_XDECREF(fg);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fs);
    if (PySequence_Fast_GET_SIZE(fo) != n || PySequence_Fast_GET_SIZE(fr) != n || PySequence_Fast_GET_SIZE(ff) != n ||
        PySequence_Fast_GET_SIZE(fp) != n || PySequence_Fast_GET_SIZE(fg) != n) {
        Py_DECREF(fs), Py_DECREF(fo), Py_DECREF(fr), Py_DECREF(ff), Py_DECREF(fp), Py_DECREF(fg);
        PyErr_SetString(PyExc_ValueError, "sizes, offsets, rounded sizes, planned flags, pools and groups differ in length");
        return NULL;
    }
    Plan plan = {0};
    int64_t *rs = int64_array(fr, n), *fl = rs ? int64_array(ff, n) : NULL, *pl = fl ? int64_array(fp, n) : NULL;
    int64_t *gr = pl ? int64_array(fg, n) : NULL;
    plan.size = gr ? int64_array(fs, n) : NULL;
    plan.offset = plan.size ? int64_array(fo, n) : NULL;
    plan.planned = gr ? calloc((size_t)n + 1, 1) : NULL;
    plan.pool = gr ? calloc((size_t)n + 1, 1) : NULL;
    plan.under = gr ? malloc(((size_t)n + 1) * sizeof *plan.under) : NULL;
    for (Py_ssize_t i = 0; plan.planned && plan.pool && plan.under && i < n; i++) {
        plan.planned[i] = fl[i] != 0;
        plan.pool[i] = (char)pl[i];
        plan.under[i] = -1;
    }
    int bad_pool = 0;
    for (Py_ssize_t i = 0; pl && i < n; i++) bad_pool |= pl[i] < 0 || pl[i] > AT_ADDRESS;
    free(fl), free(pl);
    Py_DECREF(fs), Py_DECREF(fo), Py_DECREF(fr), Py_DECREF(ff), Py_DECREF(fp), Py_DECREF(fg);
    pthread_mutex_lock(&lock);
    Session *s = session_of(id);
    int device = s ? s->device : CPU;
    pthread_mutex_unlock(&lock);
    if (!s) {
        free(rs), free(gr), free_plan(device, &plan);
        return PyErr_Occurred() ? NULL : closed_error();
    }
    if (!plan.offset || !plan.planned || !plan.pool || !plan.under) {
        free(rs), free(gr), free_plan(device, &plan);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    if (bad_pool) {
        free(rs), free(gr), free_plan(device, &plan);
        PyErr_SetString(PyExc_ValueError, "a pool is 0 (the device's), 1 (the slow tier's) or 2 (at an address)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (rs[i] < plan.size[i] || (plan.pool[i] == AT_ADDRESS ? plan.offset[i] <= 0
                                     : plan.offset[i] < 0 || plan.offset[i] + rs[i] > arena[(int)plan.pool[i]])) {
            free(rs), free(gr), free_plan(device, &plan);
            PyErr_Format(PyExc_ValueError, "slot %zd does not fit its pool's arena", i);
            return NULL;
        }
    plan.n = n;
    plan.live = calloc((size_t)n + 1, 1);
    plan.taken = calloc((size_t)n + 1, 1);
    int bad = !plan.live || !plan.taken || build_overlaps(&plan, rs, gr);
    free(gr);
    for (int q = 0; q < POOLS && !bad; q++) {
        void *base = NULL;
        plan.arena_bytes[q] = arena[q];
        bad = arena[q] && pool_alloc(device, q, &base, (size_t)arena[q]);
        plan.base[q] = base;
    }
    free(rs);
    if (bad) {
        free_plan(device, &plan);
        return PyErr_NoMemory();
    }
    int64_t pairs = plan.ov_start[n] / 2;
    Plan old = {0};
    pthread_mutex_lock(&lock);
    s = session_of(id);
    const char *why = !s ? "that allocator session is closed"
                      : s->served.used ? "arena buffers are still in use; free them before loading a plan"
                                       : NULL;
    if (!why) {
        take_plan(s, &old);
        s->size = plan.size, s->offset = plan.offset, s->ov_start = plan.ov_start, s->ov = plan.ov, s->under = plan.under;
        s->live = plan.live, s->taken = plan.taken, s->planned = plan.planned, s->pool = plan.pool;
        memcpy(s->base, plan.base, sizeof s->base);
        memcpy(s->arena_bytes, plan.arena_bytes, sizeof s->arena_bytes);
        s->n = plan.n;
    }
    pthread_mutex_unlock(&lock);
    free_plan(device, why ? &plan : &old);
    if (why) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    return PyLong_FromLongLong(pairs);
}

/* end_step(handle) -> the step's statistics: counted under the lock, made a dict after it. */
static PyObject *py_end_step(PyObject *self, PyObject *args) {
    PARSE_HANDLE(args, id)
    pthread_mutex_lock(&lock);
    Session *s = session_of(id);
    if (!s) {
        pthread_mutex_unlock(&lock);
        return closed_error();
    }
    s->mode = OFF;
    Stats st = s->st;
    int64_t held = 0;
    for (int64_t j = 0; j < s->n; j++) held += s->live[j];
    pthread_mutex_unlock(&lock);
    /* totals, and each pool's own figures ("arena_high_water" is the device pool's) */
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsLsLsLsLsLsLs{s{sLsLsL}s{sLsLsL}}}", "requests", (long long)st.requests,
                         "served", (long long)(st.pool_served[0] + st.pool_served[1] + st.at_address),
                         "served_at_plan_offset",
                         (long long)(st.pool_planned[0] + st.pool_planned[1] + st.at_address_planned),
                         "served_bytes",
                         (long long)st.served_bytes, "unplanned", (long long)st.unplanned, "unplanned_bytes",
                         (long long)st.unplanned_bytes, "unplanned_peak_bytes", (long long)st.fallback_peak,
                         "conflicts", (long long)st.conflicts, "other_threads", (long long)st.other_threads,
                         "arena_high_water", (long long)st.pool_high_water[0], "held_after_step", (long long)held,
                         "first_unplanned_request", (long long)st.miss_request, "first_unplanned_size",
                         (long long)st.miss_size, "first_unplanned_slot", (long long)st.miss_slot, "pools", "device",
                         "served", (long long)st.pool_served[0], "served_at_plan_offset", (long long)st.pool_planned[0],
                         "high_water", (long long)st.pool_high_water[0], "slow", "served", (long long)st.pool_served[1],
                         "served_at_plan_offset", (long long)st.pool_planned[1], "high_water",
                         (long long)st.pool_high_water[1]);
}

static PyObject *py_live(PyObject *self, PyObject *args) {
    PARSE_HANDLE(args, id)
    pthread_mutex_lock(&lock);
    Session *s = session_of(id);
    Py_ssize_t live = s ? (Py_ssize_t)s->served.used : 0;
    long long fallback = s ? (long long)s->fallback_live : 0;
    pthread_mutex_unlock(&lock);
    if (!s) return closed_error();
    return Py_BuildValue("(nL)", live, fallback);
}

/* close(handle) -> arena buffers still live. The session stops serving at once; its arena is
 * freed now, or by the free of its last live buffer. Closing twice does nothing. */
static PyObject *py_close(PyObject *self, PyObject *args) {
    PARSE_HANDLE(args, id)
    pthread_mutex_lock(&lock);
    Session *s = find(id);
    Py_ssize_t live = 0;
    if (s && !s->closed) {
        s->mode = OFF;
        s->closed = 1;
        live = (Py_ssize_t)s->served.used;
        if (live) s = NULL;
        else unlink_session(s);
    } else
        s = NULL;
    pthread_mutex_unlock(&lock);
    if (s) destroy(s);
    return PyLong_FromSsize_t(live);
}

static PyMethodDef methods[] = {
    {"new_session", py_new_session, METH_VARARGS, "new_session(device, library) -> handle; CPU: patches that loaded library."},
    {"patched", py_patched, METH_NOARGS, "patched() -> offset-table entries patched now."},
    {"cuda_functions", py_cuda_functions, METH_NOARGS, "(alloc, free, empty_cache) addresses for gpu_external_*."},
    {"begin_record", py_begin_record, METH_VARARGS, "begin_record(handle): log this thread's requests."},
    {"end_record", py_end_record, METH_VARARGS, "end_record(handle) -> (sizes, alloc events, free events, times in ns, events)."},
    {"load_plan", py_load_plan, METH_VARARGS, "load_plan(handle, sizes, offsets, rounded, planned, pools, groups, (device bytes, slow bytes)): slot pairs sharing bytes."},
    {"begin_step", py_begin_step, METH_VARARGS, "begin_step(handle): serve this thread's requests from the arena."},
    {"end_step", py_end_step, METH_VARARGS, "end_step(handle) -> the step's statistics."},
    {"live", py_live, METH_VARARGS, "live(handle) -> (arena buffers live, fallback bytes live)."},
    {"close", py_close, METH_VARARGS, "close(handle) -> arena buffers still live; the arena goes with the last."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planalloc", "The plan's arena as ONNX Runtime's allocator.", -1, methods};

PyMODINIT_FUNC PyInit__planalloc(void) { return PyModule_Create(&module); }
