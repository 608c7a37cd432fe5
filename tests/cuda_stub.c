/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests on machines without a GPU.

   It implements the driver API calls the cuda backend's runtime makes, with the real ABI, over
   host memory: device buffers are malloc'ed, copies are memcpy, a kernel launch or a graph replay
   checks and records its arguments. With it on LD_LIBRARY_PATH, cuda-bindings loads it as the
   driver, so the runtime's Python code (contexts, the arena, argument packing, CUDA graphs and
   their updates, copies, freeing, errors) runs end to end. By default no kernel runs; after
   stub_emulate(library) (a build of a program's CUDA C by tests/cuda_emulate.py's `library`),
   the functions of the modules loaded since the last stub_emulate run there: each launch, and
   each node of a replayed graph with the arguments the node holds, runs its kernel in the C++
   emulation over this host memory, so the calls compute. Counters are exported for the test. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define OK 0
#define OUT_OF_MEMORY 2
#define INVALID_VALUE 1
#define NOT_FOUND 500

typedef struct {  /* CUDA_KERNEL_NODE_PARAMS (v2) */
    void *func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams, **extra;
    void *kern, *ctx;
} KernelNodeParams;

/* what the test reads back (ctypes) */
long stub_allocations, stub_frees, stub_launches, stub_graphs, stub_nodes, stub_node_updates, stub_replays;
long stub_live_bytes;
unsigned long long stub_last_args[32];  /* the arguments of the last launch or node */
int stub_last_nargs;

long stub_emulated;  /* kernels run by the emulation */

static int handle_counter = 1;
static void *new_handle(void) { return (void *)(intptr_t)(0x1000 * handle_counter++); }

/* the emulation: lm_run(name, pointers to the argument values, grid, block) */
typedef int (*Runner)(const char *, void **, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned);

/* kernel functions by handle: their names, and the emulation that runs them (if any) */
#define MAX_FUNCTIONS 4096
static struct { void *handle; char *name; Runner runner; } functions[MAX_FUNCTIONS];
static int n_functions, n_emulated;  /* functions[:n_emulated] have had their stub_emulate call */

int stub_emulate(const char *library) {
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    Runner runner = lib ? (Runner)dlsym(lib, "lm_run") : NULL;
    if (!runner) return -1;
    for (; n_emulated < n_functions; n_emulated++) functions[n_emulated].runner = runner;
    return 0;
}

/* a graph's kernel nodes in order (a chain), as the driver holds them: the arguments' values copied */
typedef struct { void *func; unsigned grid[3], block[3]; int nargs; unsigned long long args[32]; } Node;
typedef struct { int count, capacity; Node *nodes; } Nodes;
#define MAX_GRAPHS 1024
static Nodes graphs[MAX_GRAPHS], execs[MAX_GRAPHS];
static int n_graphs, n_execs;
#define GRAPH_HANDLE(k) ((void *)(intptr_t)(((long long)(k) + 1) << 32))
#define EXEC_HANDLE(k) ((void *)(intptr_t)(((long long)(k) + 1) << 44))
#define NODE_HANDLE(k) ((void *)(intptr_t)(0x10000 + (k)))  /* its index in its graph */

static CUresult run_kernel(void *func, const unsigned *grid, const unsigned *block, int nargs, unsigned long long *values) {
    int f = 0;
    while (f < n_functions && functions[f].handle != func) f++;
    if (f == n_functions) return INVALID_VALUE;
    if (!functions[f].runner) return OK;  /* (not emulated: runs nothing) */
    void *pointers[32];
    for (int k = 0; k < nargs; k++) pointers[k] = &values[k];
    if (functions[f].runner(functions[f].name, pointers, grid[0], grid[1], grid[2], block[0], block[1], block[2]) != 0)
        return NOT_FOUND;
    stub_emulated++;
    return OK;
}

static CUresult record_args(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            void **params) {
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024 || gy > 65535 || gz > 65535)
        return INVALID_VALUE;
    if (!params) return INVALID_VALUE;
    /* every parameter luminar passes is 64 bits, the array NULL-terminated (driver.Args) */
    stub_last_nargs = 0;
    while (stub_last_nargs < 32 && params[stub_last_nargs]) {
        stub_last_args[stub_last_nargs] = *(unsigned long long *)params[stub_last_nargs];
        stub_last_nargs++;
    }
    return OK;
}

CUresult cuInit(unsigned flags) { return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? OK : INVALID_VALUE; }
CUresult cuDeviceGetName(char *name, int len, int dev) { snprintf(name, len, "luminar stub GPU"); return OK; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int dev) {
    switch (attribute) {
        case 75: *value = 9; break;    /* COMPUTE_CAPABILITY_MAJOR */
        case 76: *value = 0; break;    /* COMPUTE_CAPABILITY_MINOR */
        case 16: *value = 132; break;  /* MULTIPROCESSOR_COUNT */
        case 1: *value = 1024; break;  /* MAX_THREADS_PER_BLOCK */
        case 8: *value = 49152; break; /* MAX_SHARED_MEMORY_PER_BLOCK */
        default: *value = 0;
    }
    return OK;
}
CUresult cuDeviceTotalMem(size_t *bytes, int dev) { *bytes = (size_t)1 << 34; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x42; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x42 ? OK : INVALID_VALUE; }
CUresult cuStreamCreate(void **stream, unsigned flags) { *stream = new_handle(); return OK; }
CUresult cuStreamSynchronize(void *stream) { return OK; }
CUresult cuModuleLoadData(void **module, const void *image) {
    if (memcmp(image, "\x7f" "ELF", 4) != 0) return INVALID_VALUE;  /* a cubin is an ELF image */
    *module = new_handle();
    return OK;
}
CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    if (strncmp(name, "lm_", 3) != 0 || n_functions == MAX_FUNCTIONS) return NOT_FOUND;
    *function = new_handle();
    functions[n_functions].handle = *function;
    functions[n_functions++].name = strdup(name);
    return OK;
}
CUresult cuMemAlloc(unsigned long long *ptr, size_t bytes) {
    if (bytes > ((size_t)1 << 36)) return OUT_OF_MEMORY;
    size_t *block = malloc(bytes + 16);
    if (!block) return OUT_OF_MEMORY;
    block[0] = bytes;
    *ptr = (unsigned long long)(uintptr_t)(block + 2);
    stub_allocations++;
    stub_live_bytes += bytes;
    return OK;
}
CUresult cuMemFree(unsigned long long ptr) {
    size_t *block = (size_t *)(uintptr_t)ptr - 2;
    stub_live_bytes -= block[0];
    free(block);
    stub_frees++;
    return OK;
}
CUresult cuMemcpyHtoDAsync(unsigned long long dst, const void *src, size_t n, void *s) { memcpy((void *)(uintptr_t)dst, src, n); return OK; }
CUresult cuMemcpyDtoHAsync(void *dst, unsigned long long src, size_t n, void *s) { memcpy(dst, (void *)(uintptr_t)src, n); return OK; }
CUresult cuMemcpyDtoDAsync(unsigned long long dst, unsigned long long src, size_t n, void *s) {
    memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    stub_launches++;
    CUresult r = record_args(gx, gy, gz, bx, by, bz, params);
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return r != OK ? r : run_kernel(f, grid, block, stub_last_nargs, stub_last_args);
}

static CUresult set_node(Node *node, const KernelNodeParams *p) {
    CUresult r = record_args(p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ, p->kernelParams);
    if (r != OK) return r;
    node->func = p->func;
    node->grid[0] = p->gridDimX, node->grid[1] = p->gridDimY, node->grid[2] = p->gridDimZ;
    node->block[0] = p->blockDimX, node->block[1] = p->blockDimY, node->block[2] = p->blockDimZ;
    node->nargs = stub_last_nargs;
    memcpy(node->args, stub_last_args, sizeof node->args);
    return OK;
}
static Nodes *graph_of(void *handle, Nodes *table, int count, int shift) {
    long long k = ((long long)(intptr_t)handle >> shift) - 1;
    return k >= 0 && k < count && ((long long)(intptr_t)handle & ((1LL << shift) - 1)) == 0 ? &table[k] : NULL;
}

CUresult cuGraphCreate(void **graph, unsigned flags) {
    if (n_graphs == MAX_GRAPHS) return OUT_OF_MEMORY;
    *graph = GRAPH_HANDLE(n_graphs++);
    stub_graphs++;
    return OK;
}
CUresult cuGraphAddKernelNode(void **node, void *graph, const void **deps, size_t ndeps, const KernelNodeParams *p) {
    Nodes *g = graph_of(graph, graphs, n_graphs, 32);
    if (!g || ndeps > 1 || (ndeps && deps[0] != NODE_HANDLE(g->count - 1))) return INVALID_VALUE;  /* a chain */
    if (g->count == g->capacity) {
        g->capacity = g->capacity ? 2 * g->capacity : 16;
        g->nodes = realloc(g->nodes, g->capacity * sizeof(Node));
    }
    CUresult r = set_node(&g->nodes[g->count], p);
    if (r != OK) return r;
    *node = NODE_HANDLE(g->count++);
    stub_nodes++;
    return OK;
}
CUresult cuGraphInstantiate(void **exec, void *graph, unsigned long long flags) {
    Nodes *g = graph_of(graph, graphs, n_graphs, 32);
    if (!g || n_execs == MAX_GRAPHS) return INVALID_VALUE;
    Nodes *e = &execs[n_execs];
    e->count = e->capacity = g->count;
    e->nodes = malloc((g->count ? g->count : 1) * sizeof(Node));
    memcpy(e->nodes, g->nodes, g->count * sizeof(Node));
    *exec = EXEC_HANDLE(n_execs++);
    return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) { return cuGraphInstantiate(exec, graph, flags); }
CUresult cuGraphExecKernelNodeSetParams(void *exec, void *node, const KernelNodeParams *p) {
    Nodes *e = graph_of(exec, execs, n_execs, 44);
    long long k = (long long)(intptr_t)node - 0x10000;
    if (!e || k < 0 || k >= e->count) return INVALID_VALUE;
    stub_node_updates++;
    return set_node(&e->nodes[k], p);
}
CUresult cuGraphLaunch(void *exec, void *stream) {
    Nodes *e = graph_of(exec, execs, n_execs, 44);
    if (!e) return INVALID_VALUE;
    stub_replays++;
    for (int k = 0; k < e->count; k++) {
        CUresult r = run_kernel(e->nodes[k].func, e->nodes[k].grid, e->nodes[k].block, e->nodes[k].nargs, e->nodes[k].args);
        if (r != OK) return r;
    }
    return OK;
}
CUresult cuGraphExecDestroy(void *exec) { return OK; }
CUresult cuGraphDestroy(void *graph) { return OK; }
CUresult cuGetErrorName(CUresult error, const char **name) {
    *name = error == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : error == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
          : error == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_UNKNOWN";
    return OK;
}

/* NVRTC looks for the driver's private tables when it finds a libcuda: there are none here */
CUresult cuGetExportTable(const void **table, const void *id) { *table = NULL; return 801; /* NOT_SUPPORTED */ }

/* cuda-bindings asks the driver for every entry point by its base name */
#define ENTRY(name) {#name, (void *)name}
static const struct { const char *name; void *function; } ENTRIES[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet), ENTRY(cuDeviceGetName),
    ENTRY(cuDeviceGetAttribute), ENTRY(cuDeviceTotalMem), ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuCtxSetCurrent),
    ENTRY(cuStreamCreate), ENTRY(cuStreamSynchronize), ENTRY(cuModuleLoadData), ENTRY(cuModuleGetFunction),
    ENTRY(cuMemAlloc), ENTRY(cuMemFree), ENTRY(cuMemcpyHtoDAsync), ENTRY(cuMemcpyDtoHAsync), ENTRY(cuMemcpyDtoDAsync),
    ENTRY(cuLaunchKernel), ENTRY(cuGraphCreate), ENTRY(cuGraphAddKernelNode), ENTRY(cuGraphInstantiate),
    ENTRY(cuGraphInstantiateWithFlags), ENTRY(cuGraphExecKernelNodeSetParams), ENTRY(cuGraphLaunch),
    ENTRY(cuGraphExecDestroy), ENTRY(cuGraphDestroy), ENTRY(cuGetErrorName),
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    for (size_t k = 0; k < sizeof ENTRIES / sizeof ENTRIES[0]; k++)
        if (strcmp(symbol, ENTRIES[k].name) == 0) {
            *pfn = ENTRIES[k].function;
            if (status) *status = 0;
            return OK;
        }
    *pfn = NULL;
    if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return NOT_FOUND;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
