/* The variant selection, the one implementation: fx_gemm / fx_attention / fx_gemm_packed /
 * fx_gemm_blockscaled / fx_gemm_grouped choose a variant from the tables generated into fx_glue.c (fx_select.h),
 * then launch it; their fx_*_select only choose, and are what the Python loader calls
 * (factory/runtime/selector.py).  The cost models' constants come from factory/runtime/tuning.py
 * and cost_sm100.py (their one description); their code is here.
 *
 * Comments name the runtime module whose op a function serves (factory/runtime/...).  Integer
 * arithmetic that can pass 2^63 is done in __int128; this file is compiled with -ffp-contract=off.
 * Tests: tests/test_c_selection.py (answers on the test bundle, tuning overrides, refusals) and
 * tests/selection_lib.py (this file compiled with the tables of synthetic entries).
 *
 * The pattern of an op (how to add one, e.g. fx_attention_kvcache):
 *   1. fx_api.h: a fx_<op>_problem_t (sizes int64, strides in elements per mode, pointers, flags
 *      int32 0/1), and the two entry points fx_<op>_select (no GPU, no CUDA call) and fx_<op>
 *      (select, then launch), both filling a fx_selection_t.
 *   2. here, <op>_select(dev, p, out, ctx, workspace): first every check, in this order, each a
 *      FX_ERR_INPUT whose message names the field: check_device; check_bool for each flag;
 *      check_sizes / check_stride (named); product / span_of / range_of for every element count,
 *      extent and byte count (checked arithmetic: never a wrapped value); check_distinct for each
 *      output and check_disjoint of each output against the inputs and the other outputs; then
 *      the empty problem (FX_OK, variant -1, nothing launched); then the choice (<op>_choose over
 *      candidates(dev, FX_OP_<OP>, ...), tuning buckets by find_bucket-style keys when
 *      tuning_applies(dev)); then the launch values (spec() per tensor, in signature order) and
 *      check_contract(variant, values) (loader.Binder.check); workspace sizes with mulu64.
 *   3. the exported functions return finish(rc, out): the message cleared on success, the
 *      selection zeroed on FX_ERR_INPUT / FX_ERR_NO_VARIANT.
 *   4. factory/compiler/selection.py: the variant fields the choice reads (a column of fx_variant
 *      in fx_select.h, OP_IDS for the op), generated from the manifest entry. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_bundle.h"
#include "fx_select.h"

#define FX_EXPORT __attribute__((visibility("default")))
#define INT32_MAX_ ((int64_t)2147483647)

typedef __int128 i128;

#define FX_WORKSPACE_TILES 2 /* fx_variant.workspace of the in-kernel split-K fix-up (selection.py) */
#define FX_WORKSPACE_COUNTERS 3 /* a decode variant whose last split merges the others (arrival counters) */
#define FX_WORKSPACE_TAIL 4  /* the GEMM tail split's partial tiles + semaphores (gemm/sm90_splitk.py tail=True) */
#define FX_WORKSPACE_TILE_COUNTERS 5 /* a dynamic persistent attention variant's tile counters (attention/sm90.py) */
#define FX_TAIL_SLOTS 144    /* gemm/sm90_splitk.py TAIL_SLOTS */
#define FX_TAIL_MIN_K 4      /* gemm/sm90_splitk.py TAIL_MIN_K */
#define FX_TAIL_MAX_SPLITS 16 /* gemm/sm90_splitk.py TAIL_MAX_SPLITS */

static _Thread_local char fx_msg[1024];

static int32_t fail(int32_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fx_msg, sizeof fx_msg, fmt, ap);
    va_end(ap);
    return code;
}

int32_t fx_record_error(int32_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fx_msg, sizeof fx_msg, fmt, ap);
    va_end(ap);
    return code;
}

int32_t fx_require_device(const char *what) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) return 0;
    cudaGetLastError(); /* not a later call's error */
    if (e == cudaSuccess) e = cudaErrorNoDevice;
    if (e == cudaErrorInsufficientDriver) {
        /* The statically linked runtime refuses a driver older than its own major version (it asks
           libcuda.so.1's cuDriverGetVersion): name both, or say that no driver was found. */
        int drv = 0;
        if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
        cudaGetLastError();
        if (drv > 0)
            return fail((int32_t)e, "%s: no usable CUDA device (%s: %s): the NVIDIA driver supports CUDA %d.%d, but "
                        "this host library links the CUDA %d.%d runtime, which needs a driver for CUDA %d.0 or "
                        "newer: update the NVIDIA driver", what, cudaGetErrorName(e), cudaGetErrorString(e),
                        drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                        CUDART_VERSION / 1000);
        return fail((int32_t)e, "%s: no usable CUDA device (%s: %s): no CUDA driver found (libcuda.so.1 could not "
                    "be loaded); this host library needs a driver for CUDA %d.0 or newer", what, cudaGetErrorName(e),
                    cudaGetErrorString(e), CUDART_VERSION / 1000);
    }
    return fail((int32_t)e, "%s: no usable CUDA device (%s: %s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* --- checked arithmetic ------------------------------------------------------------------------
   Every size, product and byte count a call forms goes through these: a value past int64 (or a
   uint64 byte count past 2^64) is FX_ERR_INPUT naming what overflowed, never a wrapped value. */
static int32_t mul64(int64_t a, int64_t b, int64_t *r, const char *what) {
    if (__builtin_mul_overflow(a, b, r))
        return fail(FX_ERR_INPUT, "%s overflows int64 (%lld x %lld)", what, (long long)a, (long long)b);
    return 0;
}

static int32_t add64(int64_t a, int64_t b, int64_t *r, const char *what) {
    if (__builtin_add_overflow(a, b, r))
        return fail(FX_ERR_INPUT, "%s overflows int64 (%lld + %lld)", what, (long long)a, (long long)b);
    return 0;
}

static int32_t mulu64(uint64_t a, uint64_t b, uint64_t *r, const char *what) {
    if (__builtin_mul_overflow(a, b, r))
        return fail(FX_ERR_INPUT, "%s overflows 64 bits (%llu x %llu bytes)", what, (unsigned long long)a,
                    (unsigned long long)b);
    return 0;
}

/* The product of n sizes (each >= 0), checked: FX_ERR_INPUT naming `what` when it passes int64. */
static int32_t product(const int64_t *xs, int32_t n, int64_t *r, const char *what) {
    int64_t p = 1;
    int32_t rc;
    for (int32_t i = 0; i < n; i++)
        if ((rc = mul64(p, xs[i], &p, what))) return rc;
    *r = p;
    return 0;
}

/* The elements a tensor of these sizes and (non-negative) strides spans: 1 + sum (size - 1) x
   stride, 0 when a size is 0; FX_ERR_INPUT when that passes int64. */
static int32_t span_of(const char *what, int32_t n, const int64_t *shape, const int64_t *stride, int64_t *span) {
    int64_t s = 1, t;
    int32_t rc;
    for (int32_t i = 0; i < n; i++) {
        if (shape[i] == 0) {
            *span = 0;
            return 0;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if ((rc = mul64(shape[i] - 1, stride[i], &t, what)) || (rc = add64(s, t, &s, what))) return rc;
    }
    *span = s;
    return 0;
}

/* An output's layout must give every element its own address: modes of size > 1, in order of
   stride, each with a stride of at least the span of the smaller ones (a zero stride, or rows
   that overlap, is refused: the kernels' CTAs would race on one address). */
static int32_t check_distinct(const char *what, int32_t n, const int64_t *shape, const int64_t *stride) {
    int32_t idx[FX_MAX_RANK], m = 0;
    for (int32_t i = 0; i < n; i++)
        if (shape[i] == 0) return 0; /* no elements */
    for (int32_t i = 0; i < n && m < FX_MAX_RANK; i++)
        if (shape[i] > 1) idx[m++] = i;
    for (int32_t i = 1; i < m; i++) { /* insertion sort by stride */
        int32_t x = idx[i], j = i - 1;
        while (j >= 0 && stride[idx[j]] > stride[x]) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = x;
    }
    int64_t span = 1, t;
    for (int32_t i = 0; i < m; i++) {
        int32_t d = idx[i];
        if (stride[d] < span)
            return fail(FX_ERR_INPUT, "%s: stride %lld of mode %d makes elements overlap (sizes and strides must "
                        "give every output element its own address; zero strides are refused)", what,
                        (long long)stride[d], d);
        if (__builtin_mul_overflow(shape[d] - 1, stride[d], &t) || __builtin_add_overflow(span, t, &span))
            return fail(FX_ERR_INPUT, "%s: its span overflows int64", what);
    }
    return 0;
}

/* A byte range [p, p + bytes) of a caller's tensor; NULL pointers and empty ranges overlap nothing. */
typedef struct {
    const char *what;
    uintptr_t p;
    uint64_t bytes;
} fx_range;

static int32_t range_of(fx_range *r, const char *what, const void *p, int64_t span, int64_t elem) {
    r->what = what;
    r->p = (uintptr_t)p;
    return mulu64((uint64_t)span, (uint64_t)elem, &r->bytes, what);
}

/* FX_ERR_INPUT when the output range o shares a byte with any of the n input ranges. */
static int32_t check_disjoint(const fx_range *o, const fx_range *in, int32_t n) {
    if (!o->p || !o->bytes) return 0;
    for (int32_t i = 0; i < n; i++) {
        if (!in[i].p || !in[i].bytes) continue;
        int overlap = o->p < in[i].p ? in[i].p - o->p < o->bytes : o->p - in[i].p < in[i].bytes;
        if (overlap)
            return fail(FX_ERR_INPUT, "%s overlaps %s in memory: an output must not alias an input or another output",
                        o->what, in[i].what);
    }
    return 0;
}

static int32_t check_bool(const char *what, int32_t x) {
    if (x != 0 && x != 1) return fail(FX_ERR_INPUT, "%s must be 0 or 1, got %d", what, (int)x);
    return 0;
}

static int known_capability(int32_t major, int32_t minor) {
    for (int32_t i = 0; i < fx_n_known_ccs; i++)
        if (fx_known_ccs[i][0] == major && fx_known_ccs[i][1] == minor) return 1;
    return 0;
}

/* What every entry point checks of the device. */
static int32_t check_device(const fx_device_t *dev) {
    if (dev->sm_count <= 0) return fail(FX_ERR_INPUT, "fx_device_t.sm_count must be positive, got %d", dev->sm_count);
    if (!known_capability(dev->cc_major, dev->cc_minor))
        return fail(FX_ERR_INPUT, "fx_device_t compute capability %d.%d is not one an NVIDIA device has",
                    dev->cc_major, dev->cc_minor);
    if (memchr(dev->name, 0, sizeof dev->name) == NULL)
        return fail(FX_ERR_INPUT, "fx_device_t.name is not NUL-terminated within its 256 bytes");
    return 0;
}

/* How every exported function returns: on success the last-error message is cleared; on an
   FX_ERR_INPUT / FX_ERR_NO_VARIANT the selection is zeroed (variant -1), so nothing stale of an
   earlier call remains (FX_ERR_WORKSPACE keeps it: it says how much workspace to give). */
static int32_t finish(int32_t rc, fx_selection_t *out) {
    if (rc == 0) {
        fx_msg[0] = 0;
    } else if (rc == FX_ERR_INPUT || rc == FX_ERR_NO_VARIANT) {
        memset(out, 0, sizeof *out);
        out->variant = -1;
    }
    return rc;
}

FX_EXPORT const char *fx_last_error_message(void) { return fx_msg; }
FX_EXPORT int32_t fx_variant_count(void) { return fx_n_variants; }
FX_EXPORT const char *fx_variant_name(int32_t i) {
    return i >= 0 && i < fx_n_variants ? fx_variants[i].name : NULL;
}
FX_EXPORT const char *fx_selection_info(void) { return fx_selection_summary; }

FX_EXPORT const char *fx_error_string(int32_t err) {
    switch (err) {
    case FX_ERR_INPUT: return "FX_ERR_INPUT: invalid arguments (fx_last_error_message says which)";
    case FX_ERR_NO_VARIANT: return "FX_ERR_NO_VARIANT: no variant of this bundle runs this problem on this device";
    case FX_ERR_WORKSPACE: return "FX_ERR_WORKSPACE: the workspace is missing, too small or misaligned";
    default: return err < 0 ? "unknown fx error" : cudaGetErrorString((cudaError_t)err);
    }
}

FX_EXPORT int32_t fx_device_query(int32_t device, fx_device_t *out) {
    if (!out) return fail(FX_ERR_INPUT, "fx_device_query: out must not be NULL");
    int32_t rc = fx_require_device("fx_device_query");
    if (rc) return rc;
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fail((int32_t)e, "fx_device_query: device %d: %s: %s", (int)device, cudaGetErrorName(e),
                    cudaGetErrorString(e));
    }
    memset(out, 0, sizeof *out);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    snprintf(out->name, sizeof out->name, "%s", p.name);
    return 0;
}

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); } /* a >= 0, b > 0 */
#define FX_SCALE_BLOCK_K 128 /* K elements (and rows of b) per block scale */
static i128 cdiv128(i128 a, i128 b) { return (a + b - 1) / b; }

static const char *dtype_name(int32_t d) {
    switch (d) {
    case FX_DTYPE_BF16: return "bf16";
    case FX_DTYPE_F16: return "f16";
    case FX_DTYPE_F32: return "f32";
    case FX_DTYPE_E4M3: return "e4m3";
    default: return "?";
    }
}

static void spec(fx_value *v, const void *ptr, int32_t rank, const int64_t *shape, const int64_t *stride) {
    memset(v, 0, sizeof *v);
    v->t.ptr = (uintptr_t)ptr;
    v->t.rank = rank;
    for (int32_t i = 0; i < rank; i++) {
        v->t.shape[i] = shape[i];
        v->t.stride[i] = stride[i];
    }
}

/* --- the contract: loader.Binder.check ------------------------------------------------------- */
/* 0 when the first n values meet variant v's argument contract (zip(plan, specs): arguments past
   the values given are not checked), else FX_ERR_INPUT with the reason. */
static int32_t check_contract(const fx_variant *v, const fx_value *vals, int32_t n) {
    int64_t syms[FX_MAX_SYMS];
    char set[FX_MAX_SYMS];
    memset(set, 0, sizeof set);
    if (n > v->n_args) n = v->n_args;
    for (int32_t i = 0; i < n; i++) {
        const fx_arg *a = &v->args[i];
        if (a->scalar) continue;
        const fx_spec *s = &vals[i].t;
        if (s->rank != a->rank)
            return fail(FX_ERR_INPUT, "%s: %s has rank %d, expected %d", v->name, a->name, s->rank, a->rank);
        for (int32_t what = 0; what < 2; what++) {
            const fx_dim *want = what ? a->stride : a->shape;
            const int64_t *got = what ? s->stride : s->shape;
            for (int32_t m = 0; m < a->rank; m++) {
                if (want[m].sym >= 0) {
                    int32_t y = want[m].sym;
                    if (!set[y]) {
                        set[y] = 1;
                        syms[y] = got[m];
                    } else if (syms[y] != got[m]) {
                        return fail(FX_ERR_INPUT, "%s: a size is %lld elsewhere but %s has %lld", v->name,
                                    (long long)syms[y], a->name, (long long)got[m]);
                    }
                    int64_t d = v->divisors[y];
                    if (got[m] % d)
                        return fail(FX_ERR_INPUT, "%s: %s %s %lld (mode %d) must be a multiple of %lld (16-byte alignment)",
                                    v->name, a->name, what ? "stride" : "size", (long long)got[m], m, (long long)d);
                } else if (want[m].value != got[m] && !(what == 1 && s->shape[m] == 1)) {
                    return fail(FX_ERR_INPUT, "%s: %s %s of mode %d is %lld, kernel needs %lld", v->name, a->name,
                                what ? "stride" : "size", m, (long long)got[m], (long long)want[m].value);
                }
            }
        }
        if (s->ptr % (uintptr_t)a->align)
            return fail(FX_ERR_INPUT, "%s: %s data pointer is not %d-byte aligned", v->name, a->name, a->align);
        if (a->shape32)
            for (int32_t m = 0; m < a->rank; m++)
                if (a->shape[m].sym >= 0 && s->shape[m] > INT32_MAX_)
                    return fail(FX_ERR_INPUT, "%s: %s sizes exceed the kernel's 32-bit size slots", v->name, a->name);
    }
    return 0;
}

/* --- candidates: BundleCore.candidates --------------------------------------------------------- */
/* Target.runs_on: the recorded compute capabilities of an arch- or family-specific target, else
   the same major and a minor >= the target's. */
static int target_runs_on(const fx_target *g, int32_t major, int32_t minor) {
    if (g->n_ccs > 0) {
        for (int32_t i = 0; i < g->n_ccs; i++)
            if (g->ccs[i][0] == major && g->ccs[i][1] == minor) return 1;
        return 0;
    }
    return major == g->major && minor >= g->minor;
}

/* Indices of op's variants runnable on this capability, best target first (targets_for_capability:
   arch-specific for exactly this chip, then family-specific, then the newest plain target of the
   same major), manifest order within a target.  Returns the count; *out is malloc'd (free it). */
static int32_t candidates(const fx_device_t *dev, int32_t op, int32_t **out) {
    int32_t order[64], n_order = 0;
    for (int32_t t = 0; t < fx_n_targets && n_order < 64; t++)
        if (target_runs_on(&fx_targets[t], dev->cc_major, dev->cc_minor)) order[n_order++] = t;
    /* sorted by (specificity, capability), descending (insertion sort keeps ties in order) */
    for (int32_t i = 1; i < n_order; i++) {
        int32_t x = order[i], j = i - 1;
        const fx_target *gx = &fx_targets[x];
        while (j >= 0) {
            const fx_target *gj = &fx_targets[order[j]];
            int before = gx->specificity != gj->specificity ? gx->specificity > gj->specificity
                         : gx->major != gj->major ? gx->major > gj->major : gx->minor > gj->minor;
            if (!before) break;
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
    int32_t *c = malloc(sizeof(int32_t) * (size_t)(fx_n_variants + 1)), n = 0;
    for (int32_t r = 0; r < n_order; r++)
        for (int32_t i = 0; i < fx_n_variants; i++)
            if (fx_variants[i].op == op && fx_variants[i].target == order[r]) c[n++] = i;
    *out = c;
    return n;
}

static int tuning_applies(const fx_device_t *dev) {
    return fx_tuning_device[0] && dev->sm_count == fx_tuning_sm_count && strcmp(dev->name, fx_tuning_device) == 0;
}

/* --- tuning buckets: tuning.bucket_key ------------------------------------------------------- */
static int bit_length(int64_t x) { return x <= 0 ? 0 : 64 - __builtin_clzll((unsigned long long)x); }
static int64_t m_bucket(int64_t m) {
    int b = bit_length(m - 1);
    int64_t v = (int64_t)1 << (b > 0 ? b : 0);
    return v > 16 ? v : 16;
}
static int64_t nk_bucket(int64_t x) {
    if (x <= 64) return 64;
    int b = bit_length(x) - 3;
    int64_t step = (int64_t)1 << (b > 0 ? b : 0);
    return cdiv(x, step) * step;
}

static const fx_bucket *find_bucket(int32_t ab, int32_t c, int32_t am, int32_t bm, int64_t M, int64_t N, int64_t K,
                                    int64_t L) {
    char key[160];
    int lb = bit_length(L - 1);
    snprintf(key, sizeof key, "%s>%s:%s%s:m%lld_n%lld_k%lld_l%lld", dtype_name(ab), dtype_name(c),
             am == FX_MAJOR_K ? "k" : "m", bm == FX_MAJOR_K ? "k" : "n", (long long)m_bucket(M),
             (long long)nk_bucket(N), (long long)nk_bucket(K), (long long)((int64_t)1 << (lb > 0 ? lb : 0)));
    int32_t lo = 0, hi = fx_n_buckets - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        int r = strcmp(fx_buckets[mid].key, key);
        if (r == 0) return &fx_buckets[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* The attention bucket key (tuning.attention_bucket_key, dense problems): power-of-two buckets of seqlen_q, seqlen_k and
   batch x q-heads. */
static int64_t pow2_bucket(int64_t x) {
    int b = bit_length(x - 1);
    return (int64_t)1 << (b > 0 ? b : 0);
}

static const fx_bucket *find_attention_bucket(int32_t dtype, int32_t head_dim, int32_t causal, int64_t sq,
                                              int64_t sk, int64_t bh) {
    char key[160];
    snprintf(key, sizeof key, "attention:%s:d%d:%s:q%lld_k%lld_bh%lld", dtype_name(dtype), (int)head_dim,
             causal ? "causal" : "full", (long long)pow2_bucket(sq), (long long)pow2_bucket(sk),
             (long long)pow2_bucket(bh));
    int32_t lo = 0, hi = fx_n_buckets - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        int r = strcmp(fx_buckets[mid].key, key);
        if (r == 0) return &fx_buckets[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* --- the cost models' constants: compiled in (factory/compiler/selection.py from runtime/tuning.py
   MODEL and runtime/cost_sm100.py MODEL), or a fitting tool's (fx_cost_model_set) --------------- */
static fx_model fx_model90_set;
static fx_model_sm100 fx_model100_set;
static int fx_model90_given, fx_model100_given;

static const fx_model *model90(void) { return fx_model90_given ? &fx_model90_set : &fx_model_constants; }
static const fx_model_sm100 *model100(void) {
    return fx_model100_given ? &fx_model100_set : &fx_model_sm100_constants;
}

/* For fitting tools only (scripts/fit_cost_model.py; not thread-safe, never needed to serve): the
   models' tunable constants in the order of selection.py MODEL_KEYS (25) / SM100_MODEL_KEYS (9);
   NULL restores the compiled-in ones, and either forgets this thread's cached GEMM choices. */
static void gemm_cache_clear(void);
FX_EXPORT int32_t fx_cost_model_set(const double *sm90, int32_t n90, const double *sm100, int32_t n100) {
    if ((sm90 && n90 != 25) || (sm100 && n100 != 9))
        return fail(FX_ERR_INPUT, "fx_cost_model_set takes 25 sm90 and 9 sm100 constants, got %d and %d", n90, n100);
    fx_model90_set = fx_model_constants;
    fx_model100_set = fx_model_sm100_constants;
    if (sm90) memcpy(&fx_model90_set, sm90, 25 * sizeof(double));
    if (sm100) memcpy(&fx_model100_set, sm100, 9 * sizeof(double));
    fx_model90_given = sm90 != NULL;
    fx_model100_given = sm100 != NULL;
    gemm_cache_clear(); /* this thread's cached GEMM choices came from the old constants */
    fx_msg[0] = 0;
    return 0;
}

/* --- the Hopper cost model: tuning._efficiency, tuning.estimate_us, tuning._dram_bytes -------- */
#define FX_PP_FP8_MIN_M 1024
#define FX_PP_FP8_2X1_MIN_M 512
/* A 128x128 fp8 ping-pong tile with fast accumulation: each of its two consumer warpgroups owns a
   whole tile (two tiles per CTA in flight), the epilogue of one under the other's main loop. */
static int pp_fp8_128(const fx_variant *v) {
    return v->sched_pp && v->fp8_acc == FX_ACC_FAST && v->tile[0] == 128 && v->tile[1] == 128;
}

/* The M range where a 128x128 fp8 ping-pong tile competes (where it was timed, H100, row scales,
   notes/gemm-fp8.md): a 2x1 cluster (B multicast) at M 512..1024, the fastest tile of ours at all 8
   shapes timed there (0.99-1.06x torch's row-wise kernel); any other cluster above M 1024 (at M
   8192 the 2x1 tile ran 10-40 % behind the 1x2 one). */
static int pp_fp8_competes(const fx_variant *v, int64_t M) {
    if (v->cluster[0] == 2 && v->cluster[1] == 1) return M >= FX_PP_FP8_2X1_MIN_M && M <= FX_PP_FP8_MIN_M;
    return M > FX_PP_FP8_MIN_M;
}

/* A 128x192 fp8 cooperative tile with fast accumulation and no cluster, unsplit (row scales).  By name
   on an H100 (notes/gemm-fp8.md) it ran at the multicast tiles' rate, not the clusterless 128x128
   one's: 0.73-0.92x the default pick at M 384..4096 where a wide tile rounds the grid to fewer waves
   (2048 x 1536 x 7168 33.5 vs 41.8 us, 4096 x 576 x 7168 30.6 vs 41.0), but 1.09-1.15x the swapped
   tiles at M 16..64. */
#define FX_WIDE_FP8_MIN_M 384
static int wide_fp8_c1x1(const fx_variant *v) {
    return !v->sched_pp && !v->swap_ab && v->fp8_acc == FX_ACC_FAST && v->tile[0] == 128 && v->tile[1] == 192 &&
           v->cluster[0] == 1 && v->cluster[1] == 1 && v->split_k == 1 && v->workspace == 0;
}

static double efficiency(const fx_variant *v, int64_t busy, int32_t sm_count) {
    const fx_model *p = model90();
    int32_t tm = v->tile[0], tn = v->tile[1];
    int multicast = !(v->cluster[0] == 1 && v->cluster[1] == 1);
    double eff;
    if (v->swap_ab) {
        double r = (double)tm / 64.0;
        eff = p->eff_swap_base + p->eff_swap_slope * (r < 1.0 ? r : 1.0);
    } else if ((int64_t)tm * tn >= 128 * 256) {
        if (tm == 256 && tn == 128 && v->cluster[0] == 1 && v->cluster[1] == 2) eff = p->eff_256x128_c1x2;
        else if (tm == 128 && tn == 256 && v->cluster[0] == 2 && v->cluster[1] == 1) eff = p->eff_128x256_c2x1;
        else eff = p->eff_large;
    } else if ((int64_t)tm * tn >= 128 * 128) {
        int sparse = busy * 2 <= sm_count;
        eff = v->sched_pp ? (pp_fp8_128(v) ? p->eff_pp_fp8 : p->eff_pp)
              : (multicast || sparse || wide_fp8_c1x1(v)) ? p->eff_coop_mc : p->eff_coop;
    } else if (tm >= 128 && !v->sched_pp) {
        /* two consumer warpgroups on a narrow tile (128x64, 128x96): N granularity for grids of
           few tiles (2112 = 33 x 64 columns) */
        eff = p->eff_coop_narrow;
    } else {
        double r = (double)tn / 64.0;
        eff = p->eff_small * pow(r < 1.0 ? r : 1.0, p->narrow_exp);
    }
    if (v->fp8_acc == FX_ACC_PROMOTED) eff *= p->fp8_promoted;
    else if (v->fp8_acc == FX_ACC_FAST) eff *= p->fp8_fast;
    return eff;
}

static i128 dram_bytes(const fx_variant *v, int64_t M, int64_t N, int64_t K, i128 m_clusters, i128 n_clusters,
                       i128 resident) {
    i128 e = v->a_bytes;
    i128 a_bytes = (i128)M * K * e, b_bytes = (i128)N * K * e, c_bytes = (i128)M * N * v->c_bytes;
    if (v->swap_ab || v->split_k > 1) return a_bytes + b_bytes + c_bytes;
    i128 s = v->swizzle;
    i128 w_n = resident / (m_clusters > 1 ? m_clusters : 1);
    if (w_n < s) w_n = s;
    i128 w_m = resident / s;
    if (w_m > m_clusters) w_m = m_clusters;
    if (w_m < 1) w_m = 1;
    i128 l2 = model90()->l2_bytes; /* x <= L2 / 2 is tested as 2 x <= L2: exact */
    i128 a_passes = 2 * a_bytes <= l2 ? 1 : cdiv128(n_clusters, w_n);
    i128 strip = w_n * v->cluster[1] * v->tile[1] * (i128)K * e;
    i128 b_passes = (2 * b_bytes <= l2 || 2 * strip <= l2) ? 1 : cdiv128(m_clusters, w_m);
    return a_bytes * a_passes + b_bytes * b_passes + c_bytes;
}

/* The tail split's plan (gemm/sm90_splitk.py GemmSm90TailKernel, the same integers): of `ct`
   cluster tiles over `clusters` resident clusters, the last `*rest` (ct mod clusters) are split
   into `*parts` parts (1: not split). */
static void tail_plan(const fx_variant *v, int64_t M, int64_t N, int64_t K, int64_t L, i128 clusters, i128 *ct,
                      i128 *rest, i128 *parts) {
    int64_t cm = v->cluster[0], cn = v->cluster[1];
    i128 g = clusters > 1 ? clusters : 1;
    *ct = (i128)cdiv(cdiv(M, v->tile[0]), cm) * cdiv(cdiv(N, v->tile[1]), cn) * L;
    *rest = *ct % g;
    i128 r1 = *rest > 1 ? *rest : 1, s = g / r1;
    if (s > FX_TAIL_MAX_SPLITS) s = FX_TAIL_MAX_SPLITS;
    if (s > v->split_k) s = v->split_k;
    if (s > cdiv(K, v->tile[2]) / FX_TAIL_MIN_K) s = cdiv(K, v->tile[2]) / FX_TAIL_MIN_K;
    if (s > FX_TAIL_SLOTS / (r1 * cm * cn)) s = FX_TAIL_SLOTS / (r1 * cm * cn);
    *parts = s > 1 ? s : 1;
}

static double estimate_us(const fx_variant *v, int64_t M, int64_t N, int64_t K, int64_t L, int32_t sm_count) {
    const fx_model *p = model90();
    int64_t tm = v->tile[0], tn = v->tile[1], split = v->split_k, cm = v->cluster[0], cn = v->cluster[1];
    const int tail = v->workspace == FX_WORKSPACE_TAIL;
    if (tail) split = 1; /* whole tiles, then the last round's parts: waves below */
    i128 tiles_m = cdiv(cdiv(M, tm), cm) * cm;
    i128 tiles_n = cdiv(cdiv(N, tn), cn) * cn;
    /* A swizzled schedule (swizzle s > 1; the tiers raster every tile along M, swapped ones
       along the kernel's N, which is M here too) rounds the clusters along N up to a multiple of
       s, and its CTAs run the padding tiles as well (zero-filled loads, clipped stores): on an
       H100, 256x128 c1x2 sw8 at 8192x2112x7168 (9 -> 16 clusters along N) took 1.62x the time of
       the same tile unswizzled (notes/gemm-sm90.md, off the tuning grid).  swizzle_exact
       variants run no padding tiles. */
    i128 run_n = v->swizzle > 1 && !v->swizzle_exact ? cdiv128(tiles_n / cn, v->swizzle) * v->swizzle * cn : tiles_n;
    i128 units = tiles_m * run_n * L * split;
    /* the cluster split's parts are one cluster; the workspace split's are separate work units */
    i128 per_cluster = v->workspace == FX_WORKSPACE_TILES ? cm * cn : cm * cn * split;
    i128 cap = v->persistent_ctas ? v->persistent_ctas : sm_count;
    if (cap > sm_count) cap = sm_count;
    cap = cap / per_cluster * per_cluster;
    if (cap < per_cluster) cap = per_cluster;
    i128 grid = units < cap ? units : cap;
    i128 waves = cdiv128(units, grid);
    double per_sm = v->peak_tflops * 1e12 / (double)sm_count * efficiency(v, (int64_t)grid, sm_count);
    double wave_k = (double)waves * (double)cdiv(K, split), tail_cost = 0.0;
    if (tail) { /* the whole rounds, then the split round's longest part of k-tiles (and its fix-up) */
        i128 ct, rest, parts;
        tail_plan(v, M, N, K, L, cap / per_cluster, &ct, &rest, &parts);
        if (parts > 1) {
            int64_t kt = cdiv(K, v->tile[2]);
            wave_k = (double)(ct / (cap / per_cluster)) * (double)K
                     + (double)cdiv(kt, (int64_t)parts) * (double)v->tile[2];
            tail_cost = v->a_bytes == 1 ? p->tail_us_fp8 : p->tail_us;
        }
    }
    double t_compute = wave_k * 2.0 * (double)tm * (double)tn / per_sm;
    /* (the 128x128 fp8 ping-pong CTA works on two tiles at once: twice its clusters' tiles in L2) */
    i128 resident = grid / per_cluster * (pp_fp8_128(v) ? 2 : 1);
    double nbytes = (double)(dram_bytes(v, M, N, K, tiles_m / cm, tiles_n / cn, resident) * L);
    i128 tiles = (i128)cdiv(M, tm) * cdiv(N, tn) * L * split;
    i128 useful = grid < tiles ? grid : tiles;
    double frac = (double)useful / (double)sm_count;
    double bw = p->stream_tbs * 1e12 * pow(frac < 1.0 ? frac : 1.0, p->grid_bw_exp);
    if (v->deep) bw *= p->deep_bw;
    if (v->swap_ab && (int64_t)v->tile[2] * v->a_bytes >= 256) bw *= p->wide_k_bw;
    double t_memory = nbytes / bw;
    double hi = t_memory > t_compute ? t_memory : t_compute;
    double lo = t_memory < t_compute ? t_memory : t_compute;
    double t = hi + p->overlap * lo;
    double area = (double)(tm * tn) / 4096.0;
    double split_cost = p->split_us * (double)(split - 1) * pow(area > 1.0 ? area : 1.0, p->split_tile_exp);
    if (v->workspace == FX_WORKSPACE_TILES) /* per wave: a partial tile out, the last part's split tiles in */
        split_cost = p->wsplit_us * (double)waves * (double)(split + 1) * (double)(tm * tn) / 16384.0;
    double tile_cost = p->tile_us * (double)(waves - 1);
    return t * 1e6 + p->fixed_us + split_cost + tile_cost + tail_cost;
}

/* CTAs a persistent launcher whose grid was fixed at build time (persistent_ctas, older bundles)
   starts for this problem: the tile grid in whole clusters, capped at persistent_ctas. */
static i128 launch_ctas_fixed(const fx_variant *v, int64_t M, int64_t N, int64_t L) {
    int64_t tm = v->tile[0], tn = v->tile[1], split = v->split_k, cm = v->cluster[0], cn = v->cluster[1];
    i128 tiles = (i128)(cdiv(cdiv(M, tm), cm) * cm) * (cdiv(cdiv(N, tn), cn) * cn) * L * split;
    i128 per_cluster = cm * cn * split;
    i128 cap = (i128)v->persistent_ctas / per_cluster * per_cluster;
    return tiles < cap ? tiles : cap;
}

#define FX_GATE_UP_BLOCK 64 /* gemm/sm90.py GATE_UP_BLOCK */
#define FX_FP8_GROUP 128    /* gemm/sm90.py FP8_GROUP */

/* --- GEMM: runtime/gemm.py --------------------------------------------------------------------- */
typedef struct {
    const fx_device_t *dev;
    int32_t ab, c, am, bm;
    int64_t M, N, K, L;
    int32_t epilogue; /* fx_gemm_epilogue_flags_t: only variants with exactly these */
    int32_t scale_mode; /* fx_scale_mode_t (named in the refusal; the contracts tell the forms apart) */
    fx_value vals[FX_MAX_ARGS]; /* a, b, c [, scale_a, scale_b] [, bias] [, residual] */
    int32_t n_vals;
} gemm_ctx;

/* rkl majorness (gemm._major): "k" if K is contiguous, else M (N) if that is, else none. */
static int32_t gemm_major(const fx_spec *s, int32_t mn) {
    if (s->stride[1] == 1 || s->shape[1] == 1) return FX_MAJOR_K;
    if (s->stride[0] == 1 || s->shape[0] == 1) return mn;
    return 0;
}

/* The "tiles" workspace of the in-kernel split-K fix-up (gemm/sm90_splitk.py workspace_words,
   runtime/gemm.py): one int32 semaphore per output tile, rounded up to FX_SEM_ALIGN words, then a
   tile_m x tile_n float32 partial per (tile, part).  Saturates at INT64_MAX (the contract then
   refuses the size). */
#define FX_SEM_ALIGN 32
static int64_t split_sem_words(const fx_variant *e, int64_t M, int64_t N, int64_t L) {
    i128 t = (i128)cdiv(M, e->tile[0]) * cdiv(N, e->tile[1]) * L;
    i128 w = (t + FX_SEM_ALIGN - 1) / FX_SEM_ALIGN * FX_SEM_ALIGN;
    return w > (i128)INT64_MAX ? INT64_MAX : (int64_t)w;
}

static int64_t split_words(const fx_variant *e, int64_t M, int64_t N, int64_t L) {
    i128 t = (i128)cdiv(M, e->tile[0]) * cdiv(N, e->tile[1]) * L;
    i128 parts = t * e->split_k;
    if (e->workspace == FX_WORKSPACE_TAIL && parts > FX_TAIL_SLOTS) parts = FX_TAIL_SLOTS;
    i128 w = (i128)split_sem_words(e, M, N, L) + parts * e->tile[0] * e->tile[1];
    return w > (i128)INT64_MAX ? INT64_MAX : (int64_t)w;
}

static void workspace_spec(fx_value *v, const fx_variant *e, int64_t M, int64_t N, int64_t L, uintptr_t ptr) {
    if (e->workspace == FX_WORKSPACE_TILES || e->workspace == FX_WORKSPACE_TAIL) {
        int64_t shape[1] = {split_words(e, M, N, L)}, stride[1] = {1};
        spec(v, (const void *)ptr, 1, shape, stride);
        return;
    }
    int64_t shape[3] = {M, N, e->split_k}, stride[3] = {N, 1, M * N};
    spec(v, (const void *)ptr, 3, shape, stride);
}

/* The variants whose dtypes, majorness and argument contract take the problem, of the best target
   that has any (every target's
   with every_target); FX_ERR_NO_VARIANT when none fits.  *fits is malloc'd. */
static int32_t gemm_fits(const gemm_ctx *g, int32_t early_b, int32_t **fits, int32_t *n_fits) {
    int32_t *cand, n = candidates(g->dev, FX_OP_GEMM, &cand), k = 0;
    char reason[1024] = "";
    fx_value vals[FX_MAX_ARGS];
    memcpy(vals, g->vals, sizeof vals);
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[cand[i]];
        if (v->ab != g->ab || v->c != g->c || v->a_major != g->am || v->b_major != g->bm) continue;
        if (v->early_b != early_b) continue;
        if (v->epilogue != g->epilogue) continue;
        int32_t nv = g->n_vals;
        if (v->workspace) workspace_spec(&vals[nv++], v, g->M, g->N, g->L, 0);
        if (check_contract(v, vals, nv)) {
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", fx_msg);
            continue;
        }
        cand[k++] = cand[i];
    }
    if (k == 0) {
        free(cand);
        *fits = NULL;
        *n_fits = 0;
        return fail(FX_ERR_NO_VARIANT, "no gemm variant%s for a=%s (%s-major) b=%s (%s-major) -> %s, M=%lld N=%lld K=%lld L=%lld "
                    "on compute capability %d.%d%s%s%s",
                    g->scale_mode == FX_SCALE_ROW ? " with row fp8 scales" : g->scale_mode == FX_SCALE_BLOCK ? " with block fp8 scales" : "",
                    dtype_name(g->ab), g->am == FX_MAJOR_K ? "k" : "m",
                    dtype_name(g->ab), g->bm == FX_MAJOR_K ? "k" : "n", dtype_name(g->c), (long long)g->M,
                    (long long)g->N, (long long)g->K, (long long)g->L, g->dev->cc_major, g->dev->cc_minor,
                    reason[0] ? " (closest: " : "", reason, reason[0] ? ")" : "");
    }
    int32_t best = fx_variants[cand[0]].target, m = 0;
    for (int32_t i = 0; i < k; i++)
        if (fx_variants[cand[i]].target == best) cand[m++] = cand[i];
    *fits = cand;
    *n_fits = m;
    return 0;
}

static int contains(const int32_t *xs, int32_t n, int32_t x) {
    for (int32_t i = 0; i < n; i++)
        if (xs[i] == x) return 1;
    return 0;
}

/* --- the Blackwell cost model: cost_sm100.kblock_clocks, grid, dram_bytes, l2_bytes, estimate_us -- */
static double sm100_kblock_clocks(const fx_variant *v) {
    const fx_model_sm100 *p = model100();
    int64_t cta_m = v->tile[0], tn = v->tile[1], tk = v->tile[2], group = v->cta_group > 0 ? v->cta_group : 1;
    int64_t mma_m = v->mma_m > 0 ? v->mma_m : v->tile[0];
    double rate = mma_m / group < 128 ? p->rate_m64 : 1.0;
    double mma = 2.0 * (double)cta_m * (double)tn * (double)tk / (v->flops_per_clk * rate);
    double smem = (double)((cta_m + tn / group) * tk * v->a_bytes) / p->smem_bytes_per_clk;
    double hi = mma >= smem ? mma : smem, lo = mma >= smem ? smem : mma;
    return hi + p->issue_overlap * lo;
}

static void sm100_grid(const fx_variant *v, int64_t M, int64_t N, int64_t L, int32_t sm_count, i128 *units, i128 *ctas,
                       i128 *waves) {
    int64_t cm = v->cluster[0], cn = v->cluster[1];
    i128 tiles_m = cdiv(cdiv(M, v->tile[0]), cm) * cm;
    i128 tiles_n = cdiv(cdiv(N, v->tile[1]), cn) * cn;
    *units = tiles_m * tiles_n * L;
    i128 per_cluster = cm * cn;
    i128 cap = (i128)sm_count / per_cluster * per_cluster;
    if (cap < per_cluster) cap = per_cluster;
    *ctas = *units < cap ? *units : cap;
    *waves = cdiv128(*units, *ctas);
}

static i128 sm100_dram_bytes(const fx_variant *v, int64_t M, int64_t N, int64_t K, int64_t L, int32_t sm_count) {
    i128 e = v->a_bytes;
    i128 a_bytes = (i128)M * K * e, b_bytes = (i128)N * K * e, c_bytes = (i128)M * N * v->c_bytes;
    int64_t cm = v->cluster[0], cn = v->cluster[1], tn = v->tile[1];
    i128 units, ctas, waves;
    sm100_grid(v, M, N, 1, sm_count, &units, &ctas, &waves);
    i128 m_clusters = cdiv(cdiv(M, v->tile[0]), cm), n_clusters = cdiv(cdiv(N, tn), cn);
    i128 resident = ctas / (cm * cn);
    i128 w_n = resident / (m_clusters > 1 ? m_clusters : 1);
    if (w_n < 1) w_n = 1;
    i128 w_m = resident < m_clusters ? resident : m_clusters;
    if (w_m < 1) w_m = 1;
    i128 l2 = model100()->l2_bytes; /* x <= L2 / 2 is tested as 2 x <= L2: exact */
    i128 a_passes = 2 * a_bytes <= l2 ? 1 : cdiv128(n_clusters, w_n);
    i128 strip = w_n * cn * tn * (i128)K * e;
    i128 b_passes = (2 * b_bytes <= l2 || 2 * strip <= l2) ? 1 : cdiv128(m_clusters, w_m);
    return (a_bytes * a_passes + b_bytes * b_passes + c_bytes) * L;
}

static double sm100_l2_bytes(const fx_variant *v, int64_t M, int64_t N, int64_t K, int64_t L) {
    int64_t cta_m = v->tile[0], tn = v->tile[1], cm = v->cluster[0], cn = v->cluster[1];
    int64_t group = v->cta_group > 0 ? v->cta_group : 1, b_share = cm / group > 1 ? cm / group : 1;
    double rows = (double)(cta_m < M ? cta_m : M) / (double)cn + (double)(tn / group) / (double)b_share;
    i128 tiles = (i128)cdiv(M, cta_m) * cdiv(N, tn) * L;
    return (double)tiles * rows * (double)K * (double)v->a_bytes;
}

static double sm100_estimate_us(const fx_variant *v, int64_t M, int64_t N, int64_t K, int64_t L, int32_t sm_count) {
    const fx_model_sm100 *p = model100();
    i128 units, ctas, waves;
    sm100_grid(v, M, N, L, sm_count, &units, &ctas, &waves);
    i128 k_blocks = cdiv(K, v->tile[2]);
    double t_compute = (double)(waves * k_blocks) * sm100_kblock_clocks(v) / (p->clock_ghz * 1e9);
    double t_bw = (double)sm100_dram_bytes(v, M, N, K, L, sm_count) / (p->hbm_tbs * 1e12 * p->hbm_eff);
    double t_lat = (double)(waves * k_blocks) * p->latency_us * 1e-6 / (double)(v->stages > 0 ? v->stages : 4);
    double t_dram = t_bw >= t_lat ? t_bw : t_lat;
    double t_l2 = sm100_l2_bytes(v, M, N, K, L) / (p->l2_tbs * 1e12);
    double t_memory = t_dram >= t_l2 ? t_dram : t_l2;
    double hi = t_compute >= t_memory ? t_compute : t_memory, lo = t_compute >= t_memory ? t_memory : t_compute;
    double t = hi + p->mem_overlap * lo;
    return t * 1e6 + p->fixed_us + p->wave_us * (double)(waves - 1);
}

/* The family's cost model's predicted time (us) of GEMM variant `variant` on an (m, n, k, l)
   problem on this device (sm90: fitted to H100 measurements; sm100: a roofline from published B200
   figures, unmeasured): what the selection ranks by, for tools (scripts/tune.py screens with it). */
FX_EXPORT int32_t fx_gemm_estimate_us(const fx_device_t *dev, int32_t variant, int64_t m, int64_t n, int64_t k,
                                      int64_t l, double *us) {
    int32_t rc;
    fx_msg[0] = 0;
    if (!dev || !us) return fail(FX_ERR_INPUT, "fx_gemm_estimate_us: dev and us must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if (variant < 0 || variant >= fx_n_variants) return fail(FX_ERR_INPUT, "no variant %d", variant);
    if (m <= 0 || n <= 0 || k <= 0 || l <= 0 || m > INT32_MAX_ || n > INT32_MAX_ || k > INT32_MAX_ || l > INT32_MAX_)
        return fail(FX_ERR_INPUT, "m, n, k, l must be in 1..2^31-1, got %lld, %lld, %lld, %lld", (long long)m,
                    (long long)n, (long long)k, (long long)l);
    const fx_variant *v = &fx_variants[variant];
    if (v->op != FX_OP_GEMM || (v->family != FX_FAMILY_SM90 && v->family != FX_FAMILY_SM100))
        return fail(FX_ERR_INPUT, "%s has no cost model (the sm90 and sm100 GEMM families have)", v->name);
    *us = v->family == FX_FAMILY_SM100 ? sm100_estimate_us(v, m, n, k, l, dev->sm_count)
                                       : estimate_us(v, m, n, k, l, dev->sm_count);
    return 0;
}

static i128 sm80_ctas(const fx_variant *v, const gemm_ctx *g) {
    return (i128)cdiv(g->M, v->tile[0]) * cdiv(g->N, v->tile[1]) * g->L * v->split_k;
}

/* Whether an sm90 split-K variant competes (by wave count; the cost model then decides):
   the cluster split where its unsplit tile grid is under one wave; the workspace split (in-kernel
   fix-up) where the unsplit grid's last wave leaves at least a quarter of the SMs idle (tiles <
   SMs, or (tiles mod SMs) in 1..3/4 SMs within FX_SPLIT_MAX_WAVES waves), every part keeps at least
   FX_SPLIT_MIN_KBLOCKS k-blocks, the workspace stays within FX_SPLIT_MAX_WORKSPACE_WORDS, and the
   split grid's waves are fuller than the unsplit ones. */
#define FX_SPLIT_MAX_WAVES 3
#define FX_SPLIT_MIN_KBLOCKS 32 /* H100 sweep: split tiles with 8-27 k-blocks per part lost 1.2-2.6x */
#define FX_SPLIT_MAX_WORKSPACE_WORDS ((int64_t)16 << 20) /* 64 MiB of partial tiles per call at most */
#define FX_TAIL_MAX_WAVES 4
static int split_competes(const fx_variant *v, const gemm_ctx *g, int32_t sms) {
    i128 tiles = (i128)cdiv(g->M, v->tile[0]) * cdiv(g->N, v->tile[1]) * g->L;
    /* the tail split: at least one whole round, then a last round that leaves >= 1/4 of the
       clusters idle, split (H100, off-grid tune half: under one round, M = 128, its fix-up lost
       2-6 % to the unsplit tiles) */
    if (v->workspace == FX_WORKSPACE_TAIL) {
        i128 ctas = (i128)v->cluster[0] * v->cluster[1], g_cl = sms / ctas, ct, rest, parts;
        if (g_cl < 1) return 0;
        tail_plan(v, g->M, g->N, g->K, g->L, g_cl, &ct, &rest, &parts);
        return parts > 1 && ct > g_cl && ct < g_cl * FX_TAIL_MAX_WAVES && 4 * rest <= 3 * g_cl;
    }
    if (v->workspace != FX_WORKSPACE_TILES) return tiles < sms;
    if (tiles >= (i128)sms * FX_SPLIT_MAX_WAVES) return 0;
    if (cdiv(g->K, v->tile[2]) < (int64_t)FX_SPLIT_MIN_KBLOCKS * v->split_k) return 0;
    if (split_words(v, g->M, g->N, g->L) > FX_SPLIT_MAX_WORKSPACE_WORDS) return 0;
    i128 rem = tiles % sms;
    if (rem == 0 || 4 * rem > 3 * (i128)sms) return 0;
    i128 units = tiles * v->split_k;
    /* fill = work / (waves x SMs): split fuller than unsplit, compared in integers */
    return units * (cdiv128(tiles, sms) * sms) > tiles * (cdiv128(units, sms) * sms);
}

/* The variant to run among fits (all fit, one target); -1 if fits is empty:
     1. a persistent grid fixed at build time for more SMs than this device has is used only where
        its launch grid for this problem fits (else a second wave of CTAs);
     2. the compiled-in tuning table's winner of the problem's bucket, where the device matches and
        the winner fits;
     3. sm90 (Hopper) and sm100 (Blackwell datacenter): the least predicted time of the family's
        cost model (estimate_us: fitted to H100 measurements, notes/gemm-sm90.md;
        sm100_estimate_us: a roofline from published B200 figures, unmeasured, notes/gemm-sm100.md),
        ties by name;
     4. sm80 (mma.sync): the largest tile that still gives at least one CTA per SM; else the tile
        with the most CTAs (on an H100 128x128 and 128x256 are within a few % at 4096^3, and 64x128
        wins once fewer than ~132 CTAs of 128x128 exist).  Split-K variants compete only when no
        unsplit tile fills the SMs and every split keeps >= 8 k-tiles; among grids that fill the
        SMs the fewest splits win (each split costs a workspace round trip). */
static int32_t gemm_choose(const gemm_ctx *g, int32_t *fits, int32_t n) {
    int32_t sms = g->dev->sm_count;
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[fits[i]];
        if (!v->persistent_ctas || launch_ctas_fixed(v, g->M, g->N, g->L) <= sms) kept++;
    }
    if (kept > 0 && kept < n) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *v = &fx_variants[fits[i]];
            if (!v->persistent_ctas || launch_ctas_fixed(v, g->M, g->N, g->L) <= sms) fits[m++] = fits[i];
        }
        n = m;
    }
    if (n == 0) return -1;
    if (tuning_applies(g->dev)) {
        const fx_bucket *b = find_bucket(g->ab, g->c, g->am, g->bm, g->M, g->N, g->K, g->L);
        if (b && b->winner >= 0 && contains(fits, n, b->winner)) return b->winner;
    }
    const int family = fx_variants[fits[0]].family;
    if (family == FX_FAMILY_SM100 || family == FX_FAMILY_SM90) {
        /* the family's cost model: the fastest estimate, ties by name.  sm90 split-K variants
           compete only where their unsplit tile grid is under one wave (fewer tiles than SMs),
           if an unsplit variant fits: measured on an H100 over 1155 (problem, split variant)
           pairs off the tuning grid, a split tile beat its unsplit twin in 25 % of the problems
           under one wave but in 8 % of those with a full wave (median 1.12x slower there). */
        int32_t unsplit = 0;
        for (int32_t i = 0; i < n; i++) unsplit += fx_variants[fits[i]].split_k == 1;
        int32_t others = 0; /* fits that are not 128x128 fp8 ping-pong tiles */
        for (int32_t i = 0; i < n; i++) others += !pp_fp8_128(&fx_variants[fits[i]]);
        int32_t best = -1;
        double best_t = 0;
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *v = &fx_variants[fits[i]];
            if (family == FX_FAMILY_SM90 && v->split_k > 1 && unsplit > 0 && !split_competes(v, g, sms))
                continue;
            /* the 128x128 fp8 ping-pong tiles in the M ranges where they were measured (H100, row
               scales: the 1x2 one 0.95-1.06x torch's row-wise kernel at M 2048-8192 against
               0.82-0.97x for the 128x256 2x1 tile; pp_fp8_competes) */
            if (family == FX_FAMILY_SM90 && pp_fp8_128(v) && others > 0 && !pp_fp8_competes(v, g->M)) continue;
            /* the clusterless 128x192 fp8 tile from M 128 (below it the swapped tiles ran faster) */
            if (family == FX_FAMILY_SM90 && wide_fp8_c1x1(v) && g->M < FX_WIDE_FP8_MIN_M) continue;
            double t = family == FX_FAMILY_SM100 ? sm100_estimate_us(v, g->M, g->N, g->K, g->L, sms)
                                                 : estimate_us(v, g->M, g->N, g->K, g->L, sms);
            if (best < 0 || t < best_t || (t == best_t && strcmp(v->name, fx_variants[best].name) < 0)) {
                best = fits[i];
                best_t = t;
            }
        }
        return best;
    }
    /* the sm80 rule: split-K only where the unsplit grid leaves SMs idle and each split keeps
       >= 8 k-tiles; among grids that fill the SMs the fewest splits, then the largest tile */
    i128 max_unsplit = 0;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[fits[i]];
        if (v->split_k == 1 && sm80_ctas(v, g) > max_unsplit) max_unsplit = sm80_ctas(v, g);
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[fits[i]];
        if (v->split_k == 1 || (max_unsplit < sms && g->K / v->tile[2] >= 8 * (int64_t)v->split_k)) fits[m++] = fits[i];
    }
    n = m;
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) { /* full grids: max (-split, area, -threads), first maximal */
        const fx_variant *v = &fx_variants[fits[i]];
        if (sm80_ctas(v, g) < sms) continue;
        if (best < 0) {
            best = fits[i];
            continue;
        }
        const fx_variant *b = &fx_variants[best];
        int64_t va = (int64_t)v->tile[0] * v->tile[1], ba = (int64_t)b->tile[0] * b->tile[1];
        if (-v->split_k > -b->split_k ||
            (v->split_k == b->split_k && (va > ba || (va == ba && -v->threads > -b->threads))))
            best = fits[i];
    }
    if (best >= 0) return best;
    for (int32_t i = 0; i < n; i++) { /* else: max (ctas, area), first maximal */
        const fx_variant *v = &fx_variants[fits[i]];
        if (best < 0) {
            best = fits[i];
            continue;
        }
        const fx_variant *b = &fx_variants[best];
        i128 vc = sm80_ctas(v, g), bc = sm80_ctas(b, g);
        int64_t va = (int64_t)v->tile[0] * v->tile[1], ba = (int64_t)b->tile[0] * b->tile[1];
        if (vc > bc || (vc == bc && va > ba)) best = fits[i];
    }
    return best;
}

/* b_constant (nothing still running writes B): the table's measured b_constant winner of the bucket
   (an early_b variant, or the plain winner where none was faster) where it fits, else the early_b
   twin of the plain choice (or the plain choice where it has none). */
static int32_t gemm_b_constant(const gemm_ctx *g, int32_t plain) {
    if (tuning_applies(g->dev)) {
        const fx_bucket *b = find_bucket(g->ab, g->c, g->am, g->bm, g->M, g->N, g->K, g->L);
        int32_t w = b ? b->b_constant : -1;
        if (w >= 0 && w == plain) return w;
        if (w >= 0) {
            int32_t *fits = NULL, n = 0;
            char keep[sizeof fx_msg];
            memcpy(keep, fx_msg, sizeof keep); /* a NoVariantError here is not the call's error */
            int32_t rc = gemm_fits(g, 1, &fits, &n);
            memcpy(fx_msg, keep, sizeof keep);
            int hit = rc == 0 && contains(fits, n, w);
            free(fits);
            if (hit) return w;
        }
    }
    return fx_variants[plain].twin;
}

/* Per thread, the last selections (as gemm.select caches per problem key): everything the answer
   depends on, pointers as their remainder mod 16 (every alignment in a contract divides 16;
   factory/compiler/selection.py checks), the device name only as whether the tuning table
   applies. */
typedef struct {
    int32_t cc_major, cc_minor, sm_count, tuned, ab, c, am, bm, b_constant, align[5], scale_mode;
    int32_t epilogue, epi_align[3];
    int64_t M, N, K, L, strides[13], n_out, res_strides[3], scale_out_stride;
} gemm_key;

#define FX_CACHE_SLOTS 64
static _Thread_local struct {
    gemm_key key;
    int32_t choice; /* variant + 1; 0: empty slot */
} fx_gemm_cache[FX_CACHE_SLOTS];

static void gemm_cache_clear(void) { memset(fx_gemm_cache, 0, sizeof fx_gemm_cache); }

static uint32_t gemm_key_of(const gemm_ctx *g, const fx_gemm_problem_t *p, const fx_gemm_scales_t *sc,
                            const fx_gemm_epilogue_t *ep, gemm_key *k) {
    memset(k, 0, sizeof *k);
    k->cc_major = g->dev->cc_major, k->cc_minor = g->dev->cc_minor, k->sm_count = g->dev->sm_count;
    k->tuned = tuning_applies(g->dev);
    k->ab = g->ab, k->c = g->c, k->am = g->am, k->bm = g->bm, k->b_constant = p->b_constant != 0;
    const void *ptrs[5] = {p->a, p->b, p->c, p->scale_a, p->scale_b};
    for (int i = 0; i < 5; i++) k->align[i] = (int32_t)((uintptr_t)ptrs[i] % 16);
    k->M = g->M, k->N = g->N, k->K = g->K, k->L = g->L;
    for (int i = 0; i < 3; i++) {
        k->strides[i] = p->a_stride[i];
        k->strides[3 + i] = p->b_stride[i];
        k->strides[6 + i] = p->c_stride[i];
    }
    if (sc) {
        k->scale_mode = sc->mode;
        for (int i = 0; i < 2; i++) {
            k->strides[9 + i] = sc->scale_a_stride[i];
            k->strides[11 + i] = sc->scale_b_stride[i];
        }
    }
    if (ep) {
        k->epilogue = ep->flags;
        k->n_out = ep->n_out;
        k->epi_align[0] = (int32_t)((uintptr_t)ep->bias % 16);
        k->epi_align[1] = (int32_t)((uintptr_t)ep->residual % 16);
        for (int i = 0; i < 3; i++) k->res_strides[i] = ep->residual_stride[i];
        k->epi_align[2] = (int32_t)((uintptr_t)ep->scale_out % 16);
        k->scale_out_stride = ep->scale_out_stride;
    }
    uint32_t h = 2166136261u; /* FNV-1a */
    const unsigned char *b = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 16777619u;
    return h % FX_CACHE_SLOTS;
}

static int32_t check_sizes(const char *const *names, const int64_t *xs, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (xs[i] < 0) return fail(FX_ERR_INPUT, "%s must not be negative, got %lld", names[i], (long long)xs[i]);
    return 0;
}

static int32_t check_stride(const char *what, const int64_t *s, int32_t first, int32_t n) {
    for (int32_t i = first; i < n; i++)
        if (s[i] < 0) return fail(FX_ERR_INPUT, "%s[%d] must not be negative, got %lld", what, i, (long long)s[i]);
    return 0;
}

static int64_t elem_bytes(int32_t dtype) {
    return dtype == FX_DTYPE_F32 ? 4 : dtype == FX_DTYPE_E4M3 ? 1 : 2;
}

/* The GEMM op's checks up to the launch (runtime/gemm.py), and the choice, cached per thread. */
static int32_t gemm_select(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *sc,
                           const fx_gemm_epilogue_t *ep, fx_selection_t *out, gemm_ctx *g) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_gemm: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    int32_t ab = p->ab_dtype, c = p->c_dtype;
    if (ab != FX_DTYPE_BF16 && ab != FX_DTYPE_F16 && ab != FX_DTYPE_E4M3)
        return fail(FX_ERR_INPUT, "unsupported dtype %d: gemm takes bfloat16, float16 or float8_e4m3fn", ab);
    if (c != FX_DTYPE_BF16 && c != FX_DTYPE_F16 && c != FX_DTYPE_F32 && c != FX_DTYPE_E4M3)
        return fail(FX_ERR_INPUT, "out dtype %d is not one the kernels write (bfloat16, float16, float32)", c);
    static const char *const size_names[4] = {"m", "n", "k", "l"};
    int64_t sizes[4] = {p->m, p->n, p->k, p->l};
    if ((rc = check_sizes(size_names, sizes, 4))) return rc;
    if ((rc = check_stride("a_stride", p->a_stride, 0, 3)) || (rc = check_stride("b_stride", p->b_stride, 0, 3)) ||
        (rc = check_stride("c_stride", p->c_stride, 0, 3)))
        return rc;
    if ((rc = check_bool("b_constant", p->b_constant))) return rc;
    int fp8 = ab == FX_DTYPE_E4M3;
    if (!fp8 && (p->scale_a || p->scale_b)) return fail(FX_ERR_INPUT, "scale_a/scale_b apply to fp8 GEMMs only");
    int32_t mode = sc ? sc->mode : FX_SCALE_TENSOR;
    if (mode != FX_SCALE_TENSOR && mode != FX_SCALE_ROW && mode != FX_SCALE_BLOCK)
        return fail(FX_ERR_INPUT, "unknown scale mode %d (tensor 0, row 1, block 2)", mode);
    if (mode != FX_SCALE_TENSOR && !fp8) return fail(FX_ERR_INPUT, "row and block scales apply to fp8 GEMMs only");
    if (mode != FX_SCALE_TENSOR && p->l != 1)
        return fail(FX_ERR_INPUT, "row and block scales take l = 1 (2-D a and b), got l = %lld", (long long)p->l);
    /* the scales' shapes and strides by form: (1), (1) / (m), (n) / (m, kb), (nb, kb) */
    int64_t kb = cdiv(p->k, FX_SCALE_BLOCK_K), nb = cdiv(p->n, FX_SCALE_BLOCK_K);
    int64_t ssa[2] = {1, 1}, ssb[2] = {1, 1}, tsa[2] = {1, 1}, tsb[2] = {1, 1};
    int32_t srank = mode == FX_SCALE_BLOCK ? 2 : 1;
    if (mode != FX_SCALE_TENSOR)
        if ((rc = check_stride("scale_a_stride", sc->scale_a_stride, 0, srank)) ||
            (rc = check_stride("scale_b_stride", sc->scale_b_stride, 0, srank)))
            return rc;
    if (mode == FX_SCALE_ROW) {
        ssa[0] = p->m, ssb[0] = p->n, tsa[0] = sc->scale_a_stride[0], tsb[0] = sc->scale_b_stride[0];
        if ((p->m > 1 && tsa[0] != 1) || (p->n > 1 && tsb[0] != 1))
            return fail(FX_ERR_INPUT, "row scales must be contiguous (scale_a stride %lld, scale_b stride %lld)",
                        (long long)tsa[0], (long long)tsb[0]);
    } else if (mode == FX_SCALE_BLOCK) {
        ssa[0] = p->m, ssa[1] = kb, ssb[0] = nb, ssb[1] = kb;
        for (int i = 0; i < 2; i++) tsa[i] = sc->scale_a_stride[i], tsb[i] = sc->scale_b_stride[i];
        if (p->m > 1 && tsa[0] != 1)
            return fail(FX_ERR_INPUT, "block scale_a (m, ceil(k/128)) must be M-major (stride 1 along m), got strides %lld,%lld",
                        (long long)tsa[0], (long long)tsa[1]);
        if (kb > 1 && tsa[1] < p->m)
            return fail(FX_ERR_INPUT, "block scale_a's k-block stride %lld must be >= m = %lld", (long long)tsa[1], (long long)p->m);
        if (kb > 1 && tsa[1] % 4)
            return fail(FX_ERR_INPUT, "block scale_a's k-block stride %lld must be a multiple of 4 (16-byte rows, read by TMA)",
                        (long long)tsa[1]);
        if ((uintptr_t)p->scale_a % 16)
            return fail(FX_ERR_INPUT, "block scale_a must be 16-byte aligned (read by TMA)");
        if (kb > 1 && tsb[1] != 1)
            return fail(FX_ERR_INPUT, "block scale_b (ceil(n/128), ceil(k/128)) must be K-contiguous, got strides %lld,%lld",
                        (long long)tsb[0], (long long)tsb[1]);
        if (nb > 1 && tsb[0] < kb)
            return fail(FX_ERR_INPUT, "block scale_b's row stride %lld must be >= ceil(k/128) = %lld", (long long)tsb[0], (long long)kb);
        /* modes of one element: any stride reads the same element; pass the packed one */
        if (p->m <= 1) tsa[0] = 1;
        if (kb <= 1) tsa[1] = cdiv(p->m > 1 ? p->m : 1, 4) * 4;
        if (kb <= 1) tsb[1] = 1;
        if (nb <= 1) tsb[0] = kb > 1 ? kb : 1;
    }
    if (mode == FX_SCALE_ROW) { /* one element: any stride reads it */
        if (p->m <= 1) tsa[0] = 1;
        if (p->n <= 1) tsb[0] = 1;
    }
    /* the operands' extents (checked: each fits int64, in elements and in bytes), c's layout, and
       c against every input */
    int32_t flags = ep ? ep->flags : 0;
    int64_t n_out = p->n;
    if (ep) {
        if (flags & ~(FX_EPI_BIAS | FX_EPI_SILU_MUL | FX_EPI_RESIDUAL | FX_EPI_FP8_GROUPS))
            return fail(FX_ERR_INPUT, "unknown epilogue flags %d (bias 1, silu_mul 2, residual 4, fp8_groups 8)", (int)flags);
        if (flags & FX_EPI_FP8_GROUPS) {
            if (c != FX_DTYPE_E4M3) return fail(FX_ERR_INPUT, "the fp8_groups epilogue writes float8_e4m3fn");
            if (flags & (FX_EPI_BIAS | FX_EPI_RESIDUAL))
                return fail(FX_ERR_INPUT, "the fp8_groups epilogue takes no bias or residual");
            if (p->l != 1) return fail(FX_ERR_INPUT, "the fp8_groups epilogue takes l = 1 (2-D a and b), got l = %lld", (long long)p->l);
            if (!ep->scale_out) return fail(FX_ERR_INPUT, "the fp8_groups epilogue needs a scale_out pointer");
            if ((uintptr_t)ep->scale_out % 16) return fail(FX_ERR_INPUT, "scale_out must be 16-byte aligned");
            int64_t s = ep->scale_out_stride;
            if (cdiv(ep->n_out, FX_FP8_GROUP) > 1 && (s < p->m || s % 4))
                return fail(FX_ERR_INPUT, "scale_out (m, ceil(n_out/%d)) must be M-major with a group stride >= m = %lld and "
                            "a multiple of 4, got %lld", FX_FP8_GROUP, (long long)p->m, (long long)s);
        } else if (c == FX_DTYPE_E4M3) {
            return fail(FX_ERR_INPUT, "epilogues write bfloat16, float16 or float32 (float8_e4m3fn with fp8_groups)");
        }
        n_out = ep->n_out;
        if (n_out < 0) return fail(FX_ERR_INPUT, "n_out must not be negative, got %lld", (long long)n_out);
        if (flags & FX_EPI_SILU_MUL) {
            if (p->n != 2 * cdiv(n_out, FX_GATE_UP_BLOCK) * FX_GATE_UP_BLOCK)
                return fail(FX_ERR_INPUT, "silu_mul: b must have 2·ceil(n_out/%d)·%d = %lld rows (gate and up in blocks of %d) "
                            "for %lld output columns, got %lld", FX_GATE_UP_BLOCK, FX_GATE_UP_BLOCK,
                            (long long)(2 * cdiv(n_out, FX_GATE_UP_BLOCK) * FX_GATE_UP_BLOCK), FX_GATE_UP_BLOCK,
                            (long long)n_out, (long long)p->n);
        } else if (n_out != p->n) {
            return fail(FX_ERR_INPUT, "n_out %lld must equal n %lld without silu_mul", (long long)n_out, (long long)p->n);
        }
        if ((flags & FX_EPI_BIAS) && !ep->bias) return fail(FX_ERR_INPUT, "the bias epilogue needs a bias pointer");
        if ((flags & FX_EPI_RESIDUAL) && !ep->residual)
            return fail(FX_ERR_INPUT, "the residual epilogue needs a residual pointer");
        if ((flags & FX_EPI_RESIDUAL) && (rc = check_stride("residual_stride", ep->residual_stride, 0, 3))) return rc;
        if ((flags & FX_EPI_RESIDUAL) && n_out > 1 && ep->residual_stride[1] != 1)
            return fail(FX_ERR_INPUT, "residual must be contiguous along n (stride %lld)", (long long)ep->residual_stride[1]);
    }
    int64_t sa[3] = {p->m, p->k, p->l}, sb[3] = {p->n, p->k, p->l}, sc3[3] = {p->m, n_out, p->l}, span;
    int64_t sbias[1] = {p->n}, tbias[1] = {1}, tres[3] = {0, 1, 0};
    if (ep && (flags & FX_EPI_RESIDUAL)) for (int i = 0; i < 3; i++) tres[i] = ep->residual_stride[i];
    if (n_out <= 1) tres[1] = 1;
    fx_range in[5], oc, ores, oso;
    memset(&in[4], 0, sizeof in[4]);
    memset(&ores, 0, sizeof ores);
    memset(&oso, 0, sizeof oso);
    int64_t so_shape[2] = {p->m, cdiv(n_out, FX_FP8_GROUP)}, so_stride[2] = {1, 0};
    if (flags & FX_EPI_FP8_GROUPS) /* one group: any stride reads the same element; pass a packed one */
        so_stride[1] = so_shape[1] > 1 ? ep->scale_out_stride : cdiv(p->m > 1 ? p->m : 1, 4) * 4;
    if ((rc = span_of("a", 3, sa, p->a_stride, &span)) || (rc = range_of(&in[0], "a", p->a, span, elem_bytes(ab))) ||
        (rc = span_of("b", 3, sb, p->b_stride, &span)) || (rc = range_of(&in[1], "b", p->b, span, elem_bytes(ab))) ||
        (rc = span_of("c", 3, sc3, p->c_stride, &span)) || (rc = range_of(&oc, "c", p->c, span, elem_bytes(c))))
        return rc;
    if ((rc = span_of("scale_a", srank, ssa, tsa, &span)) || (rc = range_of(&in[2], "scale_a", p->scale_a, fp8 ? span : 0, 4)) ||
        (rc = span_of("scale_b", srank, ssb, tsb, &span)) || (rc = range_of(&in[3], "scale_b", p->scale_b, fp8 ? span : 0, 4)))
        return rc;
    if ((flags & FX_EPI_BIAS) && ((rc = span_of("bias", 1, sbias, tbias, &span)) ||
                                  (rc = range_of(&in[4], "bias", ep->bias, span, elem_bytes(c)))))
        return rc;
    if ((flags & FX_EPI_RESIDUAL) && ((rc = span_of("residual", 3, sc3, tres, &span)) ||
                                      (rc = range_of(&ores, "residual", ep->residual, span, elem_bytes(c)))))
        return rc;
    if ((rc = check_distinct("c", 3, sc3, p->c_stride)) || (rc = check_disjoint(&oc, in, 5))) return rc;
    if (flags & FX_EPI_FP8_GROUPS) {
        if ((rc = span_of("scale_out", 2, so_shape, so_stride, &span)) || (rc = range_of(&oso, "scale_out", ep->scale_out, span, 4)) ||
            (rc = check_disjoint(&oso, in, 5)))
            return rc;
        if ((rc = check_disjoint(&oc, &oso, 1)))
            return fail(FX_ERR_INPUT, "scale_out overlaps c in memory");
    }
    if (flags & FX_EPI_RESIDUAL) { /* the residual is c itself (in place) or apart from it, and apart from a and b */
        int same = ep->residual == p->c && (p->m <= 1 || tres[0] == p->c_stride[0]) && (p->l <= 1 || tres[2] == p->c_stride[2]);
        if (!same && (rc = check_disjoint(&oc, &ores, 1)))
            return fail(FX_ERR_INPUT, "residual overlaps c in memory: pass c itself (same pointer and strides) for an "
                        "in-place add, or a residual apart from it");
    }
    if (p->m == 0 || p->n == 0 || p->l == 0 || p->k == 0) return 0; /* nothing to launch */

    memset(g, 0, sizeof *g);
    g->dev = dev;
    g->ab = ab;
    g->c = c;
    g->M = p->m, g->N = p->n, g->K = p->k, g->L = p->l;
    g->epilogue = flags;
    g->scale_mode = mode;
    spec(&g->vals[0], p->a, 3, sa, p->a_stride);
    spec(&g->vals[1], p->b, 3, sb, p->b_stride);
    spec(&g->vals[2], p->c, 3, sc3, p->c_stride);
    g->n_vals = 3;
    if (fp8) {
        spec(&g->vals[3], p->scale_a, srank, ssa, tsa);
        spec(&g->vals[4], p->scale_b, srank, ssb, tsb);
        g->n_vals = 5;
    }
    if (flags & FX_EPI_BIAS) spec(&g->vals[g->n_vals++], ep->bias, 1, sbias, tbias);
    if (flags & FX_EPI_RESIDUAL) spec(&g->vals[g->n_vals++], ep->residual, 3, sc3, tres);
    if (flags & FX_EPI_FP8_GROUPS) spec(&g->vals[g->n_vals++], ep->scale_out, 2, so_shape, so_stride);
    g->am = gemm_major(&g->vals[0].t, FX_MAJOR_M);
    g->bm = gemm_major(&g->vals[1].t, FX_MAJOR_N);
    if (!g->am || !g->bm)
        return fail(FX_ERR_INPUT, "a and b need a contiguous mode (a strides %lld,%lld,%lld; b strides %lld,%lld,%lld)",
                    (long long)p->a_stride[0], (long long)p->a_stride[1], (long long)p->a_stride[2],
                    (long long)p->b_stride[0], (long long)p->b_stride[1], (long long)p->b_stride[2]);
    gemm_key key;
    uint32_t slot = gemm_key_of(g, p, sc, ep, &key);
    int32_t choice;
    if (fx_gemm_cache[slot].choice && memcmp(&fx_gemm_cache[slot].key, &key, sizeof key) == 0) {
        choice = fx_gemm_cache[slot].choice - 1;
    } else {
        int32_t *fits, n;
        if ((rc = gemm_fits(g, 0, &fits, &n))) return rc;
        choice = gemm_choose(g, fits, n);
        free(fits);
        if (choice < 0) return fail(FX_ERR_NO_VARIANT, "no gemm variant fits (no unsplit variant and no split one qualifies)");
        if (p->b_constant) choice = gemm_b_constant(g, choice);
        fx_gemm_cache[slot].key = key;
        fx_gemm_cache[slot].choice = choice + 1;
    }
    const fx_variant *v = &fx_variants[choice];
    out->variant = choice;
    out->name = v->name;
    out->splits = v->split_k;
    if (v->workspace == FX_WORKSPACE_TILES || v->workspace == FX_WORKSPACE_TAIL) { /* semaphores + partial tiles, float32 words */
        int64_t w = split_words(v, p->m, p->n, p->l);
        if (w == INT64_MAX) return fail(FX_ERR_INPUT, "the split-K workspace overflows 64 bits");
        if ((rc = mulu64((uint64_t)w, 4u, &out->workspace_bytes, "the split-K workspace"))) return rc;
    } else if (v->workspace) { /* (split_k, M, N) float32 partials */
        uint64_t b;
        if ((rc = mulu64((uint64_t)v->split_k * 4u, (uint64_t)p->m, &b, "the split-K workspace")) ||
            (rc = mulu64(b, (uint64_t)p->n, &out->workspace_bytes, "the split-K workspace")))
            return rc;
    }
    if (v->cluster_ctas) {
        int32_t cap = dev->sm_count / v->cluster_ctas;
        out->max_clusters = cap > 1 ? cap : 1;
    }
    return 0;
}

FX_EXPORT int32_t fx_gemm_select(const fx_device_t *dev, const fx_gemm_problem_t *p, fx_selection_t *out) {
    fx_selection_t tmp;
    gemm_ctx g;
    if (!out) out = &tmp;
    return finish(gemm_select(dev, p, NULL, NULL, out, &g), out);
}

FX_EXPORT int32_t fx_gemm_epilogue_select(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                                          const fx_gemm_epilogue_t *ep, fx_selection_t *out) {
    fx_selection_t tmp;
    gemm_ctx g;
    if (!out) out = &tmp;
    if (!ep) {
        memset(out, 0, sizeof *out);
        out->variant = -1;
        return finish(fail(FX_ERR_INPUT, "fx_gemm_epilogue_select: ep must not be NULL"), out);
    }
    return finish(gemm_select(dev, p, scales, ep, out, &g), out);
}

FX_EXPORT int32_t fx_gemm_scaled_select(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                                        fx_selection_t *out) {
    fx_selection_t tmp;
    gemm_ctx g;
    if (!out) out = &tmp;
    if (!scales) {
        memset(out, 0, sizeof *out);
        out->variant = -1;
        return finish(fail(FX_ERR_INPUT, "fx_gemm_scaled_select: scales must not be NULL"), out);
    }
    return finish(gemm_select(dev, p, scales, NULL, out, &g), out);
}

/* --- attention: runtime/attention.py ----------------------------------------------------------- */
/* Split-KV count for a grid of `ctas` CTAs over `key_tiles` key tiles: 1 unless the grid leaves SMs
   idle; then the largest available count that keeps the grid within two waves and gives every
   split at least two key tiles (so its cp.async pipeline has something to overlap), or 1. */
static int32_t split_count(i128 ctas, int64_t key_tiles, int32_t sms, const int32_t *avail, int32_t n) {
    if (ctas >= sms) return 1;
    int32_t best = 1;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = avail[i];
        if (s > 1 && ctas * s <= 2 * (i128)sms && key_tiles >= 2 * (int64_t)s && s > best) best = s;
    }
    return best;
}

/* Split count of a packed-GQA decode variant (seqlen_q 1: a CTA's rows are the q heads of one kv
   head, so K/V are read once): the fewest splits whose grid fills the SMs, else the most; each
   split keeps a key tile; 0 when none does.  Grids past two waves are fine here: the alternative
   re-reads K/V once per q head (H100: B16 H32/8 Sk4096 D128 ran 249 us that way, SDPA 90 us). */
static int32_t pack_split_count(i128 ctas, int64_t key_tiles, int32_t sms, const int32_t *avail, int32_t n) {
    int32_t fill = 0, most = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = avail[i];
        if (s <= 1 || key_tiles < s) continue;
        if (s > most) most = s;
        if (ctas * s >= sms && (fill == 0 || s < fill)) fill = s;
    }
    return fill ? fill : most;
}

/* The split-KV entry (of one tile config) for `groups` row sets of `rows` query rows over `sk` keys;
   -1 when split_count says not to split. */
static int32_t split_pick(const int32_t *split, int32_t n, i128 groups, int64_t rows, int64_t sk, int32_t sms) {
    if (n == 0) return -1;
    const fx_variant *e0 = &fx_variants[split[0]];
    int32_t tm = e0->tile[0], tn = e0->tile[1];
    int32_t avail[FX_MAX_ARGS * 8], na = 0;
    for (int32_t i = 0; i < n && na < (int32_t)(sizeof avail / sizeof avail[0]); i++) {
        const fx_variant *e = &fx_variants[split[i]];
        if (e->tile[0] == tm && e->tile[1] == tn) avail[na++] = e->splits;
    }
    int32_t s = split_count(groups * cdiv(rows, tm), cdiv(sk, tn), sms, avail, na);
    if (s <= 1) return -1;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *e = &fx_variants[split[i]];
        if (e->tile[0] == tm && e->tile[1] == tn && e->splits == s) return split[i];
    }
    return -1;
}

typedef struct {
    int64_t b, hq, hkv, sq, sk;
} attn_decode;

/* Whether the smaller query tile's grid needs more waves than the bigger one's, for variants that
   state their resident CTAs per SM (H100, sm90 family: B4 H32/8 Sq128 Sk4096 causal ran 78.5 us on
   256 CTAs of 64 rows, 54.9 on 128 CTAs of 128 rows). */
static int more_waves(const fx_variant *small, const fx_variant *big, const attn_decode *d, int32_t sms) {
    if (!small->ctas_per_sm || !big->ctas_per_sm) return 0;
    i128 ws = cdiv128((i128)d->b * d->hq * cdiv(d->sq, small->tile[0]), (i128)sms * small->ctas_per_sm);
    i128 wb = cdiv128((i128)d->b * d->hq * cdiv(d->sq, big->tile[0]), (i128)sms * big->ctas_per_sm);
    return ws > wb;
}

/* Split-KV count of a decode-family variant for `groups` = batch x kv heads x row blocks CTAs per
   split, over the built split counts sp[i] (cl[i]: merged in a cluster).  H100
   (notes/attention-decode.md; 132 SMs, 2 CTAs per SM; the best split of every measured shape):
   groups >= 3/4 of the SMs: 1 (B16 H32/8 Sk512: split 2 ran 10.8 us vs 8.3); fewer: the fewest
   splits, at least 2, that give more than SMs/4 CTAs, or SMs/2 when a kv head has several row
   blocks (B4 H32/8 Sk4096: 2 splits 29.1 us, 4 splits 30.7); every split keeps at least 2 key
   tiles (B1 Sk512: 4 splits 6.4 us, 8 splits 7.4); when that is the largest cluster split, K/V fit
   in L2 and a second-kernel split keeps 2 tiles each: that one (B1 H32/8 Sk4096 10.1 us vs 11.3). */
static int32_t decode_split_count(i128 groups, int64_t tiles, i128 kv_bytes, int64_t row_blocks, i128 rows,
                                  int32_t sms, const int32_t *sp, const int32_t *cl, int32_t n) {
    if (groups * 4 >= 3 * (i128)sms) return 1;
    i128 target = row_blocks > 1 ? sms / 2 : sms / 4;
    int32_t first = 0, cl_fit = 0, cl_all = 0;
    for (int32_t i = 0; i < n; i++) {
        if (cl[i] && sp[i] > cl_all) cl_all = sp[i];
        if (!cl[i] || sp[i] < 2 || tiles < 2 * (int64_t)sp[i]) continue;
        if (sp[i] > cl_fit) cl_fit = sp[i];
        if (groups * sp[i] > target && (!first || sp[i] < first)) first = sp[i];
    }
    int32_t s = first ? first : (cl_fit ? cl_fit : 1);
    /* the second kernel merges 32 fp32 partials per query row: over 64 query rows it pays only where
       the cluster split keeps >= 16 tiles each */
    if (cl_fit && s == cl_all && kv_bytes <= (i128)model90()->l2_bytes && (rows <= 64 || tiles >= 16 * (int64_t)s)) {
        int32_t big = 0;
        for (int32_t i = 0; i < n; i++)
            if (!cl[i] && sp[i] > s && (sp[i] == 1 || tiles >= 2 * (int64_t)sp[i]) && sp[i] > big) big = sp[i];
        if (big) s = big;
    }
    return s;
}

/* The decode entries a split choice ranges over: those of the first entry's tile among the
   preferred ones (all, where none is preferred), at most 64; their split counts, cluster flags and
   indices into sp/cl/idx.  Returns how many; *tile_n the tile's key count. */
static int32_t decode_tile_entries(const int32_t *c, int32_t n, int32_t *sp, int32_t *cl, int32_t *idx,
                                   int32_t *tile_n) {
    int32_t npref = 0;
    for (int32_t i = 0; i < n; i++)
        npref += fx_variants[c[i]].preferred != 0 && fx_variants[c[i]].workspace != FX_WORKSPACE_COUNTERS;
    int32_t t0 = -1, t1 = -1, m = 0;
    for (int32_t i = 0; i < n && m < 64; i++) {
        const fx_variant *e = &fx_variants[c[i]];
        if ((npref && !e->preferred) || e->workspace == FX_WORKSPACE_COUNTERS) continue;
        if (t0 < 0) t0 = e->tile[0], t1 = e->tile[1];
        if (e->tile[0] != t0 || e->tile[1] != t1) continue;
        sp[m] = e->kv_splits, cl[m] = e->cluster[0] > 1, idx[m] = c[i], m++;
    }
    *tile_n = t1;
    return m;
}

/* kvcache_rules._wide_pick: the 8-warp 128-key-tile build (not preferred, one CTA per SM by the manifest),
   where built, for the preferred build's split count s: head_dim 64 at half of s (at least 1) where
   that grid is at most 4 CTAs per SM;
   head_dim >= 128 at s where 2 · groups · s <= SMs; its PDL twin where that grid leaves half the SMs
   idle.  -1: none. */
static int32_t decode_wide_pick(const int32_t *c, int32_t n, int32_t s, i128 groups, int64_t head_dim, int32_t sms) {
    int32_t half = s / 2 > 1 ? s / 2 : 1;
    int32_t want = head_dim <= 64 ? (groups * half <= 4 * (i128)sms ? half : 0) : (2 * groups * s <= (i128)sms ? s : 0);
    int32_t pdl = want > 1 && 2 * groups * want <= (i128)sms, first = -1;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *e = &fx_variants[c[i]];
        if (e->preferred || e->ctas_per_sm != 1 || e->kv_splits != want || e->workspace == FX_WORKSPACE_COUNTERS)
            continue;
        if (first < 0) first = c[i];
        if ((e->pdl != 0) == pdl) return c[i];
    }
    return first;
}

/* The decode-family entry (attention/decode.py) for a dense problem, over the family's entries
   dec[0..n) (candidates order); -1 when the family does not serve it: Sq > 16, or Sq > 1 without
   the causal mask (the family is built bottom-right causal; one query equals no mask).  Entries of
   one tile config (the preferred one), split count by decode_split_count; PDL for the
   second-kernel split and for a cluster split whose grid leaves half the SMs idle. */
static int32_t decode_pick(const int32_t *dec, int32_t n, const attn_decode *d, int32_t causal, int32_t sms) {
    if (n == 0 || d->sq > 16 || (d->sq > 1 && !causal) || d->hkv <= 0) return -1;
    int32_t t1, sp[64], cl[64], idx[64];
    int32_t m = decode_tile_entries(dec, n, sp, cl, idx, &t1);
    if (!m) return -1;
    const fx_variant *e0 = &fx_variants[idx[0]];
    int64_t row_blocks = cdiv((d->hq / d->hkv) * d->sq, 16);
    i128 kv_bytes = (i128)2 * d->b * d->sk * d->hkv * e0->head_dim * 2;
    i128 groups = (i128)d->b * d->hkv * row_blocks;
    int32_t s = decode_split_count(groups, cdiv(d->sk, t1), kv_bytes, row_blocks, (i128)d->b * d->hq * d->sq, sms,
                                   sp, cl, m);
    int32_t cluster = 0, first = -1;
    for (int32_t i = 0; i < m; i++)
        if (sp[i] == s && cl[i]) cluster = 1;
    int32_t pdl = s > 1 && (!cluster || 2 * groups * s <= (i128)sms);
    if (e0->head_dim >= 128) { /* the 8-warp build of that split count where built and its grid leaves half the SMs idle */
        int32_t w = decode_wide_pick(dec, n, s, groups, e0->head_dim, sms);
        if (w >= 0) return w;
    }
    for (int32_t i = 0; i < m; i++) {
        if (sp[i] != s) continue;
        if (first < 0) first = idx[i];
        if ((fx_variants[idx[i]].pdl != 0) == pdl) return idx[i];
    }
    return first;
}

/* The attention variant (rows < 0: varlen; decode NULL: varlen), best target first: a dense problem
   of at most 16 queries takes the decode family where decode_pick finds one; then, for one query
   with GQA, the packed split-KV variant, and for grids that leave SMs idle the split-KV one (both of
   the best target that has them); then the tuning table's winner of the dense bucket where it fits
   (after the min_seqlen_q filter: the sm90 family's 64-row slabs are padding for fewer queries);
   then the family's preferred tile, or the smallest query tile where the preferred grid leaves SMs
   idle, unless its grid needs more waves (more_waves; measured on the H100: B1 H8 S512 D64 runs
   32 CTAs of 128 rows on 132 SMs). */
static int32_t attn_choose(const fx_device_t *dev, int32_t dtype, int32_t head_dim, int32_t causal, int32_t varlen,
                           i128 rows, const attn_decode *decode) {
    int32_t sms = dev->sm_count;
    int32_t *cand, n = candidates(dev, FX_OP_ATTENTION, &cand), nf = 0;
    int32_t *fit = malloc(sizeof(int32_t) * (size_t)(n + 1)), *sub = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int32_t result = -1;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *e = &fx_variants[cand[i]];
        /* (dynamic tile-counter builds: taken only by name, beside the variant they twin) */
        if (e->dtype == dtype && e->head_dim == head_dim && e->varlen == varlen &&
            e->workspace != FX_WORKSPACE_TILE_COUNTERS)
            fit[nf++] = cand[i];
    }
    if (nf && decode && !varlen) {
        int32_t nd = 0;
        for (int32_t i = 0; i < nf; i++)
            if (fx_variants[fit[i]].decode_rows && fx_variants[fit[i]].causal) sub[nd++] = fit[i];
        result = decode_pick(sub, nd, decode, causal, sms);
        if (result >= 0) goto done;
    }
    {
        int32_t m = 0;
        for (int32_t i = 0; i < nf; i++)
            if (!fx_variants[fit[i]].decode_rows) fit[m++] = fit[i];
        nf = m;
    }
    if (nf && decode && !varlen) {
        int32_t top = -1;
        for (int32_t i = 0; i < nf && top < 0; i++)
            if (fx_variants[fit[i]].splits > 1) top = fx_variants[fit[i]].target;
        if (decode->sq == 1 && decode->hq > decode->hkv) {
            int32_t np = 0;
            for (int32_t i = 0; i < nf; i++)
                if (fx_variants[fit[i]].pack_gqa && fx_variants[fit[i]].target == top) sub[np++] = fit[i];
            if (np) {
                const fx_variant *p0 = &fx_variants[sub[0]];
                int32_t tn = p0->tile[1];
                int32_t avail[256], na = 0;
                for (int32_t i = 0; i < np && na < 256; i++)
                    if (fx_variants[sub[i]].tile[1] == tn) avail[na++] = fx_variants[sub[i]].splits;
                i128 ctas = (i128)decode->b * decode->hkv * cdiv(decode->hq / decode->hkv, p0->tile[0]);
                int32_t s = pack_split_count(ctas, cdiv(decode->sk, tn), sms, avail, na);
                for (int32_t i = 0; i < np && s; i++)
                    if (fx_variants[sub[i]].splits == s && fx_variants[sub[i]].tile[1] == tn) {
                        result = sub[i];
                        goto done;
                    }
            }
        }
        int32_t ns = 0;
        for (int32_t i = 0; i < nf; i++) {
            const fx_variant *e = &fx_variants[fit[i]];
            if (e->splits > 1 && !e->pack_gqa && e->causal == causal && e->target == top) sub[ns++] = fit[i];
        }
        result = split_pick(sub, ns, (i128)decode->b * decode->hq, decode->sq, decode->sk, sms);
        if (result >= 0) goto done;
    }
    {
        int32_t m = 0;
        for (int32_t i = 0; i < nf; i++)
            if (fx_variants[fit[i]].causal == causal) fit[m++] = fit[i];
        nf = m;
        if (decode && !varlen) {
            m = 0;
            for (int32_t i = 0; i < nf; i++)
                if (decode->sq >= fx_variants[fit[i]].min_seqlen_q) sub[m++] = fit[i];
            if (m) {
                memcpy(fit, sub, sizeof(int32_t) * (size_t)m);
                nf = m;
            }
        }
        if (!nf) goto done;
        /* the tuning table's winner of this dense problem's bucket, when among fit */
        if (decode && !varlen && tuning_applies(dev)) {
            const fx_bucket *tb = find_attention_bucket(dtype, head_dim, causal, decode->sq, decode->sk,
                                                        decode->b * decode->hq);
            for (int32_t i = 0; tb && tb->winner >= 0 && i < nf; i++)
                if (fit[i] == tb->winner && fx_variants[fit[i]].splits == 1) {
                    result = fit[i];
                    goto done;
                }
        }
        int32_t tgt = fx_variants[fit[0]].target, nb = 0, n1 = 0;
        for (int32_t i = 0; i < nf; i++)
            if (fx_variants[fit[i]].target == tgt) sub[nb++] = fit[i];
        for (int32_t i = 0; i < nb; i++)
            if (fx_variants[sub[i]].splits == 1) n1++;
        if (n1) {
            m = 0;
            for (int32_t i = 0; i < nb; i++)
                if (fx_variants[sub[i]].splits == 1) sub[m++] = sub[i];
            nb = m;
        }
        int32_t pref = sub[0];
        for (int32_t i = 0; i < nb; i++)
            if (fx_variants[sub[i]].preferred) {
                pref = sub[i];
                break;
            }
        const fx_variant *pe = &fx_variants[pref];
        result = pref;
        if (rows >= 0 && rows < (i128)pe->tile[0] * sms) {
            int32_t small = -1;
            for (int32_t i = 0; i < nb; i++) {
                const fx_variant *e = &fx_variants[sub[i]];
                if (e->tile[0] < pe->tile[0] && e->tile[1] == pe->tile[1] && e->stages == pe->stages && !e->kv_splits &&
                    (small < 0 || e->tile[0] < fx_variants[small].tile[0]))
                    small = sub[i];
            }
            if (small >= 0) result = (decode && more_waves(&fx_variants[small], pe, decode, sms)) ? pref : small;
            /* kv_split (manifest kv_splits 2: a cluster of CTAs per query tile, each on its share of
               the key tiles, merged in the launch): causal, for the small tile where its grid, times
               the cluster, is at most one CTA per SM and sees four key tiles or more.  H100 (graphs
               of 20 calls, notes/attention-sm90.md): B1 H8 S512 D64 causal 5.74 us vs 5.97; not
               causal 5.78 vs 5.71, S256 (two key tiles) 4.80 vs 4.16: not taken there. */
            if (small >= 0 && result == small && decode && causal) {
                const fx_variant *se = &fx_variants[small];
                i128 tiles = (i128)decode->b * decode->hq * cdiv(decode->sq, se->tile[0]);
                for (int32_t i = 0; i < nb && cdiv(decode->sk, se->tile[1]) >= 4; i++) {
                    const fx_variant *e = &fx_variants[sub[i]];
                    if (e->kv_splits == 2 && !e->decode_rows && e->tile[0] == se->tile[0] &&
                        e->tile[1] == se->tile[1] && tiles * (e->cluster[0] > 1 ? e->cluster[0] : 1) <= (i128)sms) {
                        result = sub[i];
                        break;
                    }
                }
            }
        }
        /* Short causal rows on a full grid: where the preferred query tile is over 128 rows, the next
           smaller one of at least 128 (same key tile and stages) when the keys are at most four key
           tiles: the larger tile's last query tile is part padding, and its diagonal tiles mask more.
           H100, B32 H32 S512 head_dim 64 causal (notes/attention-sm90.md): 128 rows 148.7 us vs 159.9
           for 192; from S2048 the 192-row tile is faster. */
        if (result == pref && decode && causal && pe->tile[0] > 128 && decode->sk <= 4 * (int64_t)pe->tile[1]) {
            int32_t mid = -1;
            for (int32_t i = 0; i < nb; i++) {
                const fx_variant *e = &fx_variants[sub[i]];
                if (e->tile[0] >= 128 && e->tile[0] < pe->tile[0] && e->tile[1] == pe->tile[1] &&
                    e->stages == pe->stages && !e->kv_splits && (mid < 0 || e->tile[0] > fx_variants[mid].tile[0]))
                    mid = sub[i];
            }
            if (mid >= 0) result = mid;
        }
        /* Short causal rows where the preferred variant's persistent CTAs pass O through Q's slabs
           (head_dim 256: each tile's Q load waits for the previous O store): its one-tile-per-CTA
           twin (same tiles, stages) for at most 512 keys.  H100, B32 H32 S512 head_dim 256 causal
           (notes/attention-sm90.md): 400.1 us vs 424.5 persistent; at S2048 persistent is faster. */
        if (result == pref && decode && causal && pe->attn_sched == 2 && decode->sk <= 512) {
            for (int32_t i = 0; i < nb; i++) {
                const fx_variant *e = &fx_variants[sub[i]];
                if (e->attn_sched == 0 && e->tile[0] == pe->tile[0] && e->tile[1] == pe->tile[1] &&
                    e->stages == pe->stages && !e->kv_splits) {
                    result = sub[i];
                    break;
                }
            }
        }
    }
done:
    /* Whichever rule or table chose it: the persistent variant's dynamic
       twin (the same build whose CTAs take each next tile from a global counter, manifest workspace
       "tile_counters", named as it with "_dy") where the bundle has it.  H100, interleaved by name, two calls
       (notes/attention-sm90.md): B32 H32 S512 head_dim 64 (128 rows) 140.2 / 142.6 us vs 147.8 / 148.9;
       head_dim 128 199.4 / 198.2 vs 201.4 / 205.9 (S512), 235.3 / 230.6 vs 239.5 / 234.4 (B8 H16 S2048),
       860.3 / 844.9 vs 872.0 / 856.3 (B4 H32 S4096), 1536.7 / 1518.1 vs 1631.7 / 1536.3 (B1 H16 S16384).
       Twins in this order of preference: the diagonal tile's masked upper half skipped and O into
       its smem slab by stmatrix, with the producer handing each tile's coordinates to the consumers
       ("_dh_om_sc_dy"; H200, B32 H32 S512 head_dim 64 130.6 vs 133.5 us, B8 H16 S2048 161.0 vs 164.8,
       192 rows); the coordinates alone ("_sc_dy": no divisions per tile in the consumer warps; H100,
       B32 H32 S512 head_dim 64 137.9 vs 140.7 us, head_dim 128 197.4 vs 197.9); the plain twin.
       Varlen too (the producer passes over the virtual grid's empty slots): H200, 8 packed sequences of
       2048, H16, by name, "_dh_om_sc_dy" vs the static build: head_dim 64 160.7 vs 182.0 us (cuDNN
       dense 181.1), head_dim 128 (lazy rescale) 227.0 vs 233.8.
       Not causal, head_dim 128 and 256 (the default tier: head_dim 128's, dense and varlen): the twin
       with the producer's coordinates and the stmatrix epilogue (dense head_dim 128 also with the
       deferred O-store wait: "_sd_om_sc_dy"), then
       "_om_sc_dy", "_sc_dy", "_dy".  H100, interleaved by name, two calls (notes/attention-sm90.md):
       B8 H16 S2048 head_dim 128 405.2 / 385.6 us vs 412.9 / 391.4, 256 749.6 / 732.1 vs 756.9 / 739.3,
       varlen 128 398.8 / 393.5 vs 403.0 / 397.3; head_dim 64 (192 rows) not: B8 H16 S2048 271.5 vs
       264.8, B1 H16 S16384 2157.5 vs 2092.3 (its twin gains at S512 only, 171.4 vs 173.2). */
    if (result >= 0 && (decode || varlen) && fx_variants[result].attn_sched >= 1 && (causal || head_dim >= 128)) {
        /* (persistent, O in Q's slabs too) */
        static const char *const twin_causal[3] = {"_dh_om_sc_dy", "_sc_dy", "_dy"};
        static const char *const twin_full[4] = {"_sd_om_sc_dy", "_om_sc_dy", "_sc_dy", "_dy"};
        const char *const *twin = causal ? twin_causal : twin_full;
        int32_t n_twin = causal ? 3 : 4;
        const char *rn = fx_variants[result].name;
        size_t ln = strlen(rn);
        int32_t found = -1;
        for (int32_t t = 0; t < n_twin && found < 0; t++)
            for (int32_t i = 0; i < n; i++) {
                const fx_variant *e = &fx_variants[cand[i]];
                if (e->workspace == FX_WORKSPACE_TILE_COUNTERS && e->target == fx_variants[result].target &&
                    strlen(e->name) == ln + strlen(twin[t]) && !strncmp(e->name, rn, ln) &&
                    !strcmp(e->name + ln, twin[t])) {
                    found = cand[i];
                    break;
                }
            }
        if (found >= 0) result = found;
    }
    free(cand);
    free(fit);
    free(sub);
    return result;
}

typedef struct {
    fx_value vals[FX_MAX_ARGS];
    int32_t n_vals;
    int32_t splits;
    uint64_t split_bytes, lse_offset; /* workspace layout: [o_partial | lse_partial][counters][lse scratch] */
    uint64_t counter_offset, counter_bytes; /* the last-arrival merge's counters (0 bytes: none) */
} attn_ctx;

static int is_head_dim(int64_t d) {
    for (int32_t i = 0; i < fx_n_attention_head_dims; i++)
        if (fx_attention_head_dims[i] == d) return 1;
    return 0;
}

/* The strides and alignment of a q/k/v/o of numel elements (head_dim contiguous by construction). */
static int32_t check_strides(const char *what, const void *ptr, const int64_t *stride, int32_t first, int64_t numel) {
    if (numel == 0) return 0;
    for (int32_t i = first; i < 3; i++)
        if (stride[i] % 8)
            return fail(FX_ERR_INPUT, "%s: strides must be multiples of 8 elements (16 bytes) except the last, got %lld",
                        what, (long long)stride[i]);
    if ((uintptr_t)ptr % 16) return fail(FX_ERR_INPUT, "%s: data pointer must be 16-byte aligned", what);
    return 0;
}

/* The attention op's checks (runtime/attention.py), the choice and the launch's contract check; the values
   are built for a workspace at `workspace` (0 while only selecting). */
static int32_t attn_select(const fx_device_t *dev, const fx_attention_problem_t *p, fx_selection_t *out, attn_ctx *a,
                           uintptr_t workspace) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    a->counter_offset = a->counter_bytes = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_attention: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("varlen", p->varlen)) || (rc = check_bool("causal", p->causal))) return rc;
    float scale = p->softmax_scale;
    if (scale != 0.0f && !(scale > 0.0f && isfinite(scale)))
        return fail(FX_ERR_INPUT, "softmax_scale must be a positive finite number, got %g", (double)scale);
    if (p->dtype != FX_DTYPE_BF16 && p->dtype != FX_DTYPE_F16)
        return fail(FX_ERR_INPUT, "dtype %d not supported (bfloat16, float16)", p->dtype);
    int64_t B = p->batch, Sq = p->seqlen_q, Sk = p->seqlen_k, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    static const char *const size_names[5] = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv"};
    int64_t sizes[5] = {B, Sq, Sk, Hq, Hkv};
    int varlen = p->varlen;
    int32_t first = varlen ? 1 : 0;
    if ((rc = check_sizes(size_names, sizes, 5))) return rc;
    if ((rc = check_stride("q_stride", p->q_stride, first, 3)) || (rc = check_stride("k_stride", p->k_stride, first, 3)) ||
        (rc = check_stride("v_stride", p->v_stride, first, 3)) || (rc = check_stride("o_stride", p->o_stride, first, 3)) ||
        (rc = check_stride("lse_stride", p->lse_stride, first, 2)))
        return rc;
    if (!is_head_dim(D)) return fail(FX_ERR_INPUT, "head_dim %lld not supported", (long long)D);
    if (Hkv == 0 || Hq % Hkv)
        return fail(FX_ERR_INPUT, "q heads (%lld) must be a multiple of kv heads (%lld)", (long long)Hq, (long long)Hkv);
    /* q/o (B, Sq, Hq, D) and k/v (B, Sk, Hkv, D) (varlen: no B), lse (B, Hq, Sq) (varlen: (Hq, Sq)):
       element counts and extents checked against int64, o and lse laid out without overlap and
       disjoint from the inputs and from each other */
    int64_t qd[4] = {B, Sq, Hq, D}, kd[4] = {B, Sk, Hkv, D}, ld[3] = {B, Hq, Sq};
    int64_t qst[4] = {p->q_stride[0], p->q_stride[1], p->q_stride[2], 1};
    int64_t kst[4] = {p->k_stride[0], p->k_stride[1], p->k_stride[2], 1};
    int64_t vst[4] = {p->v_stride[0], p->v_stride[1], p->v_stride[2], 1};
    int64_t ost[4] = {p->o_stride[0], p->o_stride[1], p->o_stride[2], 1};
    int64_t lst_[3] = {p->lse_stride[0], p->lse_stride[1], 1};
    int64_t qn, kn, ln, span;
    int64_t eb = 2;
    fx_range in[5], ro, rl;
    if ((rc = product(qd + first, 4 - first, &qn, "q's element count (batch x seqlen_q x heads_q x head_dim)")) ||
        (rc = product(kd + first, 4 - first, &kn, "k's element count (batch x seqlen_k x heads_kv x head_dim)")) ||
        (rc = product(ld + first, 3 - first, &ln, "lse's element count (batch x heads_q x seqlen_q)")) ||
        (rc = span_of("q", 4 - first, qd + first, qst + first, &span)) || (rc = range_of(&in[0], "q", p->q, span, eb)) ||
        (rc = span_of("k", 4 - first, kd + first, kst + first, &span)) || (rc = range_of(&in[1], "k", p->k, span, eb)) ||
        (rc = span_of("v", 4 - first, kd + first, vst + first, &span)) || (rc = range_of(&in[2], "v", p->v, span, eb)) ||
        (rc = span_of("o", 4 - first, qd + first, ost + first, &span)) || (rc = range_of(&ro, "o", p->o, span, eb)))
        return rc;
    if (p->lse) {
        if ((rc = span_of("lse", 3 - first, ld + first, lst_ + first, &span)) ||
            (rc = range_of(&rl, "lse", p->lse, span, 4)) || (rc = check_distinct("lse", 3 - first, ld + first, lst_ + first)))
            return rc;
    } else {
        range_of(&rl, "lse", NULL, 0, 4);
    }
    in[3] = rl;
    if ((rc = check_distinct("o", 4 - first, qd + first, ost + first)) || (rc = check_disjoint(&ro, in, 4)))
        return rc;
    in[3] = ro;
    if ((rc = check_disjoint(&rl, in, 4))) return rc;
    (void)ln;
    if ((rc = check_strides("q", p->q, p->q_stride, first, qn)) || (rc = check_strides("k", p->k, p->k_stride, first, kn)) ||
        (rc = check_strides("v", p->v, p->v_stride, first, kn)))
        return rc;
    if (scale == 0.0f) scale = (float)(1.0 / sqrt((double)D));
    int64_t grid_max = fx_attention_grid_yz_max;
    memset(a, 0, sizeof *a);
    a->splits = 1;
    fx_value *vals = a->vals;
    int64_t one = 1;
    if (varlen) {
        if (p->max_seqlen_q > Sq)
            return fail(FX_ERR_INPUT, "max_seqlen_q = %d exceeds the %lld query tokens", p->max_seqlen_q, (long long)Sq);
        if (p->max_seqlen_q < 0 || (p->max_seqlen_q == 0 && Sq > 0 && B > 0))
            return fail(FX_ERR_INPUT, "max_seqlen_q = %d: with %lld query tokens in %lld sequences it must be at least 1 "
                        "(the longest query sequence)", p->max_seqlen_q, (long long)Sq, (long long)B);
        if (Sq == 0 || B == 0) return 0; /* nothing to launch */
        if (Sk == 0)
            return fail(FX_ERR_INPUT, "no keys (seqlen_k = 0): o is 0 and lse -inf by definition; fx_attention does "
                        "not launch for it, write those yourself");
        if (B > grid_max || Hq > grid_max)
            return fail(FX_ERR_INPUT, "batch (%lld) and heads (%lld) must each be <= %lld", (long long)B, (long long)Hq,
                        (long long)grid_max);
        if ((rc = check_strides("o", p->o, p->o_stride, 1, qn))) return rc;
        int64_t sq3[3] = {Sq, Hq, D}, sk3[3] = {Sk, Hkv, D}, b1 = B + 1;
        int64_t qs[3] = {p->q_stride[1], p->q_stride[2], 1}, ks[3] = {p->k_stride[1], p->k_stride[2], 1};
        int64_t vs[3] = {p->v_stride[1], p->v_stride[2], 1}, os[3] = {p->o_stride[1], p->o_stride[2], 1};
        spec(&vals[0], p->q, 3, sq3, qs);
        spec(&vals[1], p->k, 3, sk3, ks);
        spec(&vals[2], p->v, 3, sk3, vs);
        spec(&vals[3], p->o, 3, sq3, os);
        int32_t choice = attn_choose(dev, p->dtype, (int32_t)D, p->causal != 0, 1, -1, NULL);
        if (choice < 0)
            return fail(FX_ERR_NO_VARIANT, "no attention kernel in this bundle for dtype=%s head_dim=%lld causal=%d varlen=1 "
                        "on compute capability %d.%d", dtype_name(p->dtype), (long long)D, p->causal != 0,
                        dev->cc_major, dev->cc_minor);
        /* a dynamic variant's two tile counters (16 bytes, zeroed per launch by attn_run), then the lse */
        a->counter_offset = 0;
        a->counter_bytes = fx_variants[choice].workspace == FX_WORKSPACE_TILE_COUNTERS ? 16u : 0u;
        a->lse_offset = a->counter_bytes;
        int64_t ls[2] = {Hq, Sq}, lst[2] = {p->lse ? p->lse_stride[1] : Sq, 1};
        spec(&vals[4], p->lse ? (const void *)p->lse : (const void *)(workspace + a->lse_offset), 2, ls, lst);
        int32_t k = 5;
        if (a->counter_bytes) { /* the tile counters: the workspace's words at counter_offset */
            int64_t two = 2;
            spec(&vals[k++], (const void *)(workspace + a->counter_offset), 1, &two, &one);
        }
        spec(&vals[k++], p->cu_seqlens_q, 1, &b1, &one);
        spec(&vals[k++], p->cu_seqlens_k, 1, &b1, &one);
        vals[k++].f = scale;
        vals[k++].i = p->max_seqlen_q;
        a->n_vals = k;
        if (__builtin_add_overflow(a->counter_bytes, p->lse ? 0 : (uint64_t)ln * 4u, &out->workspace_bytes)) /* ln < 2^63 */
            return fail(FX_ERR_INPUT, "the attention workspace overflows 64 bits");
        out->variant = choice;
    } else {
        if (qn == 0) return 0; /* nothing to launch */
        if (Sk == 0)
            return fail(FX_ERR_INPUT, "no keys (seqlen_k = 0): o is 0 and lse -inf by definition; fx_attention does "
                        "not launch for it, write those yourself");
        if (B > grid_max || Hq > grid_max)
            return fail(FX_ERR_INPUT, "batch (%lld) and heads (%lld) must each be <= %lld", (long long)B, (long long)Hq,
                        (long long)grid_max);
        if ((rc = check_strides("o", p->o, p->o_stride, 0, qn))) return rc;
        attn_decode d = {B, Hq, Hkv, Sq, Sk};
        int32_t choice = attn_choose(dev, p->dtype, (int32_t)D, p->causal != 0, 0, (i128)B * Hq * Sq, &d);
        if (choice < 0)
            return fail(FX_ERR_NO_VARIANT, "no attention kernel in this bundle for dtype=%s head_dim=%lld causal=%d varlen=0 "
                        "on compute capability %d.%d", dtype_name(p->dtype), (long long)D, p->causal != 0,
                        dev->cc_major, dev->cc_minor);
        const fx_variant *e = &fx_variants[choice];
        int64_t s = e->splits > 1 ? e->splits : 1;
        /* the split partials: s x B x Hq x Sq rows of D + 1 float32 (o_partial, lse_partial) */
        uint64_t nsplit = 0, lse_bytes = p->lse ? 0 : (uint64_t)ln * 4u;
        a->split_bytes = 0;
        if (s > 1 && ((rc = mulu64((uint64_t)s, (uint64_t)ln, &nsplit, "the split-KV workspace")) ||
                      (rc = mulu64(nsplit, ((uint64_t)D + 1u) * 4u, &a->split_bytes, "the split-KV workspace"))))
            return rc;
        a->splits = (int32_t)s;
        /* a dynamic variant's two tile counters (16 bytes, zeroed per launch by attn_run), then the lse */
        a->counter_offset = a->split_bytes;
        a->counter_bytes = e->workspace == FX_WORKSPACE_TILE_COUNTERS ? 16u : 0u;
        a->lse_offset = a->split_bytes + a->counter_bytes;
        if (__builtin_add_overflow(a->lse_offset, lse_bytes, &out->workspace_bytes))
            return fail(FX_ERR_INPUT, "the attention workspace overflows 64 bits (%llu + %llu bytes)",
                        (unsigned long long)a->split_bytes, (unsigned long long)lse_bytes);
        int64_t sq4[4] = {B, Sq, Hq, D}, sk4[4] = {B, Sk, Hkv, D};
        int64_t qs[4] = {p->q_stride[0], p->q_stride[1], p->q_stride[2], 1};
        int64_t ks[4] = {p->k_stride[0], p->k_stride[1], p->k_stride[2], 1};
        int64_t vs[4] = {p->v_stride[0], p->v_stride[1], p->v_stride[2], 1};
        int64_t os[4] = {p->o_stride[0], p->o_stride[1], p->o_stride[2], 1};
        spec(&vals[0], p->q, 4, sq4, qs);
        spec(&vals[1], p->k, 4, sk4, ks);
        spec(&vals[2], p->v, 4, sk4, vs);
        spec(&vals[3], p->o, 4, sq4, os);
        int64_t ls[3] = {B, Hq, Sq};
        int64_t lst[3] = {p->lse ? p->lse_stride[0] : Hq * Sq, p->lse ? p->lse_stride[1] : Sq, 1};
        spec(&vals[4], p->lse ? (const void *)p->lse : (const void *)(workspace + a->lse_offset), 3, ls, lst);
        int32_t k = 5;
        if (s > 1) { /* the split workspace (runtime/attention.py split_workspace): o_partial (s,B,Hq,Sq,D), lse_partial (s,B,Hq,Sq), one buffer */
            int64_t op[5] = {s, B, Hq, Sq, D}, ops[5] = {B * Hq * Sq * D, Hq * Sq * D, Sq * D, D, 1};
            int64_t lp[4] = {s, B, Hq, Sq}, lps[4] = {B * Hq * Sq, Hq * Sq, Sq, 1};
            spec(&vals[k++], (const void *)workspace, 5, op, ops);
            spec(&vals[k++], (const void *)(workspace + nsplit * (uint64_t)D * 4u), 4, lp, lps);
        }
        if (a->counter_bytes) { /* the tile counters: the workspace's words at counter_offset */
            int64_t two = 2;
            spec(&vals[k++], (const void *)(workspace + a->counter_offset), 1, &two, &one);
        }
        vals[k++].f = scale;
        a->n_vals = k;
        out->variant = choice;
    }
    const fx_variant *e = &fx_variants[out->variant];
    out->name = e->name;
    out->splits = a->splits;
    if (a->n_vals != e->n_args) { /* loader.Binder.bind */
        out->variant = -1;
        out->name = NULL;
        return fail(FX_ERR_INPUT, "%s takes %d arguments, got %d", e->name, e->n_args, a->n_vals);
    }
    if ((rc = check_contract(e, a->vals, a->n_vals))) {
        out->variant = -1;
        out->name = NULL;
        return rc;
    }
    return 0;
}

FX_EXPORT int32_t fx_attention_select(const fx_device_t *dev, const fx_attention_problem_t *p, fx_selection_t *out) {
    fx_selection_t tmp;
    attn_ctx a;
    if (!out) out = &tmp;
    return finish(attn_select(dev, p, out, &a, 0), out);
}

/* --- packed-weight decode GEMM: runtime/packed.py's rule ------------------------------------------ */
typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* a (M, K), b (N/8, K/64, 32, 16), c (M, N), scale_a, scale_b */
    int32_t n_vals;
} packed_ctx;

/* CTAs of decode variant v for N weight rows, and the CTAs the device holds at once (clusters
   that fit on sm_count SMs at ctas_per_sm each, times the cluster). */
static int64_t packed_ctas(const fx_variant *v, int64_t N) {
    return N / v->rows_per_cta * v->cluster[0] * v->cluster[1];
}

static int64_t packed_wave(const fx_variant *v, int32_t sms) {
    int64_t ck = (int64_t)v->cluster[0] * v->cluster[1];
    int64_t clusters = (int64_t)sms * (v->ctas_per_sm > 0 ? v->ctas_per_sm : 1) / ck;
    return ck * (clusters > 1 ? clusters : 1);
}

/* The decode variants that take the problem: the tuning table's measured winner on packed weights
   (where it fits, and is early_b only for a constant b), else the most CTAs among the variants
   whose grid is one wave, else the most CTAs (ties: the greater name); then, for a constant b
   and a one-wave grid, that variant's early_b twin where it fits. */
static int32_t packed_select(const fx_device_t *dev, const fx_gemm_packed_problem_t *p, fx_selection_t *out,
                             packed_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_gemm_packed: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    static const char *const size_names[3] = {"m", "n", "k"};
    int64_t sizes[3] = {p->m, p->n, p->k};
    if ((rc = check_sizes(size_names, sizes, 3))) return rc;
    if ((rc = check_stride("a_stride", p->a_stride, 0, 2)) || (rc = check_stride("b_stride", p->b_stride, 0, 4)) ||
        (rc = check_stride("c_stride", p->c_stride, 0, 2)) || (rc = check_bool("b_constant", p->b_constant)))
        return rc;
    int64_t M = p->m, N = p->n, K = p->k;
    if (N % 8 || K % 64 || K == 0)
        return fail(FX_ERR_INPUT, "packed weights need N %% 8 == 0 and K a positive multiple of 64, got N=%lld K=%lld",
                    (long long)N, (long long)K);
    int64_t sa[2] = {M, K}, sb[4] = {N / 8, K / 64, 32, 16}, sc[2] = {M, N}, one = 1, span;
    fx_range in[4], oc;
    if ((rc = span_of("a", 2, sa, p->a_stride, &span)) || (rc = range_of(&in[0], "a", p->a, span, 1)) ||
        (rc = span_of("b_packed", 4, sb, p->b_stride, &span)) || (rc = range_of(&in[1], "b_packed", p->b_packed, span, 1)) ||
        (rc = span_of("c", 2, sc, p->c_stride, &span)) || (rc = range_of(&oc, "c", p->c, span, 2)))
        return rc;
    range_of(&in[2], "scale_a", p->scale_a, 1, 4);
    range_of(&in[3], "scale_b", p->scale_b, 1, 4);
    if ((rc = check_distinct("c", 2, sc, p->c_stride)) || (rc = check_disjoint(&oc, in, 4))) return rc;
    if (M == 0 || N == 0) return 0; /* nothing to launch */
    memset(x, 0, sizeof *x);
    spec(&x->vals[0], p->a, 2, sa, p->a_stride);
    spec(&x->vals[1], p->b_packed, 4, sb, p->b_stride);
    spec(&x->vals[2], p->c, 2, sc, p->c_stride);
    spec(&x->vals[3], p->scale_a, 1, &one, &one);
    spec(&x->vals[4], p->scale_b, 1, &one, &one);
    x->n_vals = 5;

    int32_t *fits, n = candidates(dev, FX_OP_GEMM, &fits), k = 0, plain = 0;
    char reason[1024] = "";
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[fits[i]];
        if (v->family != FX_FAMILY_DECODE || M > v->max_m) continue;
        if (check_contract(v, x->vals, x->n_vals)) {
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", fx_msg);
            continue;
        }
        plain += !v->early_b;
        fits[k++] = fits[i];
    }
    if (!plain) {
        free(fits);
        return fail(FX_ERR_NO_VARIANT, "no decode variant for packed weights N=%lld K=%lld, M=%lld on compute capability "
                    "%d.%d%s%s%s: use the unpacked weights", (long long)N, (long long)K, (long long)M, dev->cc_major,
                    dev->cc_minor, reason[0] ? " (closest: " : "", reason, reason[0] ? ")" : "");
    }
    int32_t choice = -1;
    if (tuning_applies(dev)) {
        const fx_bucket *b = find_bucket(FX_DTYPE_E4M3, FX_DTYPE_BF16, FX_MAJOR_K, FX_MAJOR_K, M, N, K, 1);
        int32_t w = b ? (p->b_constant ? b->packed_b_constant : b->packed) : -1;
        if (w >= 0 && contains(fits, k, w) && (p->b_constant || !fx_variants[w].early_b)) choice = w;
    }
    if (choice < 0) {
        int any_wave = 0;
        for (int32_t i = 0; i < k; i++) {
            const fx_variant *v = &fx_variants[fits[i]];
            if (!v->early_b && packed_ctas(v, N) <= packed_wave(v, dev->sm_count)) any_wave = 1;
        }
        for (int32_t i = 0; i < k; i++) {
            const fx_variant *v = &fx_variants[fits[i]];
            if (v->early_b || (any_wave && packed_ctas(v, N) > packed_wave(v, dev->sm_count))) continue;
            if (choice < 0) {
                choice = fits[i];
                continue;
            }
            const fx_variant *b = &fx_variants[choice];
            int64_t vc = packed_ctas(v, N), bc = packed_ctas(b, N);
            if (vc > bc || (vc == bc && strcmp(v->name, b->name) > 0)) choice = fits[i];
        }
        int32_t twin = fx_variants[choice].twin;
        if (any_wave && p->b_constant && twin != choice && contains(fits, k, twin)) choice = twin;
    }
    free(fits);
    out->variant = choice;
    out->name = fx_variants[choice].name;
    out->splits = 1;
    return 0;
}

FX_EXPORT int32_t fx_gemm_packed_select(const fx_device_t *dev, const fx_gemm_packed_problem_t *p,
                                        fx_selection_t *out) {
    fx_selection_t tmp;
    packed_ctx x;
    if (!out) out = &tmp;
    return finish(packed_select(dev, p, out, &x), out);
}

/* A persistent GEMM variant chosen: its index and name, no split, and (cluster_ctas > 0) the grid cap
   without the driver, max(1, SMs / CTAs per cluster). */
static int32_t chosen(const fx_device_t *dev, int32_t best, fx_selection_t *out) {
    const fx_variant *v = &fx_variants[best];
    out->variant = best;
    out->name = v->name;
    out->splits = 1;
    if (v->cluster_ctas) {
        int32_t cap = dev->sm_count / v->cluster_ctas;
        out->max_clusters = cap > 1 ? cap : 1;
    }
    return 0;
}

/* --- block-scaled GEMM: runtime/blockscaled.py's rule ----------------------------------------------- */
typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* a, b, c, a_scale, b_scale [, a_global, b_global] */
    int32_t n_vals;
} bs_ctx;

static const char *format_name(int32_t f) {
    switch (f) {
    case FX_FORMAT_MXF8E4M3: return "mxf8e4m3";
    case FX_FORMAT_MXF8E5M2: return "mxf8e5m2";
    case FX_FORMAT_NVF4: return "nvf4";
    default: return "?";
    }
}

/* Among the variants of the format and output dtype that take the problem: where M > 128 a CTA
   pair (one MMA over 256 rows), else a single CTA; then the most CTAs; then the largest tile (the
   first of equals, best target first).  A rule, not a measurement: no Blackwell GPU has run these. */
static int32_t bs_select(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p, fx_selection_t *out,
                         bs_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_gemm_blockscaled: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    int32_t f = p->format, c = p->c_dtype;
    if (f != FX_FORMAT_MXF8E4M3 && f != FX_FORMAT_MXF8E5M2 && f != FX_FORMAT_NVF4)
        return fail(FX_ERR_INPUT, "unknown block-scaled format %d (mxf8e4m3 1, mxf8e5m2 2, nvf4 3)", f);
    if (c != FX_DTYPE_BF16 && c != FX_DTYPE_F16 && c != FX_DTYPE_F32)
        return fail(FX_ERR_INPUT, "out dtype %d is not one the kernels write (bfloat16, float16, float32)", c);
    static const char *const size_names[4] = {"m", "n", "k", "l"};
    int64_t sizes[4] = {p->m, p->n, p->k, p->l};
    if ((rc = check_sizes(size_names, sizes, 4))) return rc;
    if ((rc = check_stride("a_stride", p->a_stride, 0, 3)) || (rc = check_stride("b_stride", p->b_stride, 0, 3)) ||
        (rc = check_stride("c_stride", p->c_stride, 0, 3)))
        return rc;
    int64_t M = p->m, N = p->n, K = p->k, L = p->l, vec = f == FX_FORMAT_NVF4 ? 16 : 32;
    int nvf4 = f == FX_FORMAT_NVF4;
    int64_t sa[3] = {M, K, L}, sb[3] = {N, K, L}, sc[3] = {M, N, L}, span, one = 1;
    /* scale factors: L x ceil(R/128) x ceil(ceil(K/vec)/4) atoms of 512 bytes */
    int64_t fa[4] = {L, cdiv(M, 128), cdiv(cdiv(K, vec), 4), 512}, fb[4] = {L, cdiv(N, 128), cdiv(cdiv(K, vec), 4), 512};
    int64_t na, nb;
    fx_range in[6], oc;
    if ((rc = product(fa, 4, &na, "a_scale's bytes")) || (rc = product(fb, 4, &nb, "b_scale's bytes")) ||
        (rc = span_of("a", 3, sa, p->a_stride, &span)) || (rc = range_of(&in[0], "a", p->a, nvf4 ? span / 2 + 1 : span, 1)) ||
        (rc = span_of("b", 3, sb, p->b_stride, &span)) || (rc = range_of(&in[1], "b", p->b, nvf4 ? span / 2 + 1 : span, 1)) ||
        (rc = span_of("c", 3, sc, p->c_stride, &span)) || (rc = range_of(&oc, "c", p->c, span, elem_bytes(c))))
        return rc;
    range_of(&in[2], "a_scale", p->a_scale, na, 1);
    range_of(&in[3], "b_scale", p->b_scale, nb, 1);
    range_of(&in[4], "a_global", p->a_global, nvf4, 4);
    range_of(&in[5], "b_global", p->b_global, nvf4, 4);
    if ((rc = check_distinct("c", 3, sc, p->c_stride)) || (rc = check_disjoint(&oc, in, 6))) return rc;
    if (!nvf4 && (p->a_global || p->b_global)) return fail(FX_ERR_INPUT, "%s has no global scale (only nvf4 does)", format_name(f));
    if (M == 0 || N == 0 || L == 0) return 0; /* nothing to launch */
    if (K == 0 || K % 32)
        return fail(FX_ERR_INPUT, "gemm_blockscaled: K = %lld must be a positive multiple of 32 (16-byte rows of fp4, "
                    "whole MXFP8 blocks)", (long long)K);
    memset(x, 0, sizeof *x);
    spec(&x->vals[0], p->a, 3, sa, p->a_stride);
    spec(&x->vals[1], p->b, 3, sb, p->b_stride);
    spec(&x->vals[2], p->c, 3, sc, p->c_stride);
    spec(&x->vals[3], p->a_scale, 1, &na, &one);
    spec(&x->vals[4], p->b_scale, 1, &nb, &one);
    x->n_vals = 5;
    if (nvf4) {
        spec(&x->vals[5], p->a_global, 1, &one, &one);
        spec(&x->vals[6], p->b_global, 1, &one, &one);
        x->n_vals = 7;
    }
    int32_t *cand, n = candidates(dev, FX_OP_GEMM_BLOCKSCALED, &cand), best = -1;
    char reason[1024] = "";
    i128 best_ctas = 0;
    int best_pair = 0;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[cand[i]];
        if (v->format != f || v->c != c) continue;
        if (check_contract(v, x->vals, x->n_vals)) {
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", fx_msg);
            continue;
        }
        int pair = (v->cta_group == 2) == (M > 128);
        i128 ctas = (i128)cdiv(M, v->tile[0]) * cdiv(N, v->tile[1]) * L;
        if (best >= 0) {
            const fx_variant *b = &fx_variants[best];
            int64_t va = (int64_t)v->tile[0] * v->tile[1], ba = (int64_t)b->tile[0] * b->tile[1];
            if (!(pair > best_pair || (pair == best_pair && (ctas > best_ctas || (ctas == best_ctas && va > ba)))))
                continue;
        }
        best = cand[i], best_ctas = ctas, best_pair = pair;
    }
    free(cand);
    if (best < 0)
        return fail(FX_ERR_NO_VARIANT, "no gemm_blockscaled variant for %s -> %s, M=%lld N=%lld K=%lld L=%lld on compute "
                    "capability %d.%d%s%s%s", format_name(f), dtype_name(c), (long long)M, (long long)N, (long long)K,
                    (long long)L, dev->cc_major, dev->cc_minor, reason[0] ? " (closest: " : "", reason, reason[0] ? ")" : "");
    return chosen(dev, best, out);
}

FX_EXPORT int32_t fx_gemm_blockscaled_select(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p,
                                             fx_selection_t *out) {
    fx_selection_t tmp;
    bs_ctx x;
    if (!out) out = &tmp;
    return finish(bs_select(dev, p, out, &x), out);
}

/* --- grouped GEMM: runtime/grouped.py ---------------------------------------------------------------- */
#define FX_MAX_GROUPS 1024 /* gemm/sm90_grouped.py MAX_GROUPS: the kernels' shared-memory tile table */

typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* a, b, c, offs | masked_m[, scale_a, scale_b] */
    int32_t n_vals;
} grouped_ctx;

/* The fp8 grouped forms' scales (fx_api.h): their shapes and the strides the kernels take, in the
   kernels' mode order (scale_a (m[, kb][, groups]), scale_b (n | nb[, kb], groups)); checks each
   form's layout rules. */
static int32_t grouped_scales(const fx_gemm_grouped_problem_t *p, int32_t *ra, int64_t sa[3], int64_t ta[3],
                              int32_t *rb, int64_t sb[3], int64_t tb[3]) {
    int64_t M = p->m, N = p->n, E = p->groups, kb = cdiv(p->k, FX_SCALE_BLOCK_K), nb = cdiv(p->n, FX_SCALE_BLOCK_K);
    const int64_t *xa = p->scale_a_stride, *xb = p->scale_b_stride;
    int32_t rc, masked = p->masked;
    if ((rc = check_stride("scale_a_stride", xa, 0, 3)) || (rc = check_stride("scale_b_stride", xb, 0, 3))) return rc;
    if (p->scale_mode == FX_SCALE_ROW) {
        if (M > 1 && xa[0] != 1) return fail(FX_ERR_INPUT, "row scale_a must be contiguous along the rows, got stride %lld", (long long)xa[0]);
        if (N > 1 && xb[0] != 1) return fail(FX_ERR_INPUT, "row scale_b (groups, n) must be contiguous along n, got stride %lld", (long long)xb[0]);
        *ra = masked ? 2 : 1, sa[0] = M, sa[1] = E, ta[0] = 1, ta[1] = masked ? xa[2] : 0;
        *rb = 2, sb[0] = N, sb[1] = E, tb[0] = 1, tb[1] = xb[2];
        if (masked && E <= 1) ta[1] = M > 0 ? M : 1;
        if (E <= 1) tb[1] = N > 0 ? N : 1;
        return 0;
    }
    /* block */
    if (M > 1 && xa[0] != 1)
        return fail(FX_ERR_INPUT, "block scale_a must be M-major (stride 1 along the rows), got strides %lld,%lld,%lld",
                    (long long)xa[0], (long long)xa[1], (long long)xa[2]);
    if (kb > 1 && (xa[1] < M || xa[1] % 4))
        return fail(FX_ERR_INPUT, "block scale_a's k-block stride %lld must be >= m = %lld and a multiple of 4 (16-byte "
                    "rows, read by TMA)", (long long)xa[1], (long long)M);
    if (masked && E > 1 && (xa[2] % 4 || xa[2] < 1))
        return fail(FX_ERR_INPUT, "block scale_a's group stride %lld must be a positive multiple of 4 (read by TMA)",
                    (long long)xa[2]);
    if ((uintptr_t)p->scale_a % 16) return fail(FX_ERR_INPUT, "block scale_a must be 16-byte aligned (read by TMA)");
    if (kb > 1 && xb[1] != 1)
        return fail(FX_ERR_INPUT, "block scale_b (groups, ceil(n/128), ceil(k/128)) must be K-contiguous, got strides "
                    "%lld,%lld,%lld", (long long)xb[0], (long long)xb[1], (long long)xb[2]);
    if (nb > 1 && xb[0] < kb)
        return fail(FX_ERR_INPUT, "block scale_b's n-block stride %lld must be >= ceil(k/128) = %lld", (long long)xb[0],
                    (long long)kb);
    *ra = masked ? 3 : 2, sa[0] = M, sa[1] = kb, sa[2] = E;
    ta[0] = 1, ta[1] = kb > 1 ? xa[1] : cdiv(M > 1 ? M : 1, 4) * 4, ta[2] = masked ? xa[2] : 0;
    if (masked && E <= 1) ta[2] = ta[1] * kb;
    *rb = 3, sb[0] = nb, sb[1] = kb, sb[2] = E;
    tb[0] = nb > 1 ? xb[0] : kb, tb[1] = 1, tb[2] = E > 1 ? xb[2] : nb * kb;
    return 0;
}

/* A grouped variant's relative time for `rows` rows in each of E groups: waves of its tiles over
   the SMs (the persistent CTAs take the walk's tiles in turn) times one tile's MMA work over the
   tile shape's efficiency: 128x256 1 (0.97 in a 2-CTA cluster: measured up to 27 % slower), other 128-
   and 256-row tiles 0.9, 64x256 0.8, 64x128 0.7, 64x64 0.5, 64-row tiles x 0.6 past 48 rows per
   group (H100 runs of every variant on the bench's expert shapes: notes/gemm-grouped.md); a 2-CTA
   cluster walks pairs of m-tiles (a group's rows rounded up to two tiles).  A rule, not a fitted
   model. */
static double grouped_cost(const fx_variant *v, int64_t rows, int64_t N, int64_t K, int64_t E, int32_t sms) {
    int64_t tm = v->tile[0] > 0 ? v->tile[0] : 1, tn = v->tile[1] > 0 ? v->tile[1] : 1;
    int64_t cm = v->cluster[0] > 1 ? v->cluster[0] : 1;
    double eff = tm >= 128 ? (tn >= 256 ? (cm > 1 ? 0.97 : 1.0) : 0.9) : tn >= 256 ? 0.8 : tn >= 128 ? 0.7 : 0.5;
    if (tm < 128 && rows > 48) eff *= 0.6; /* past ~48 rows per group 128-row tiles won (weight reuse) */
    i128 tiles = (i128)E * cdiv(rows, tm * cm) * cm * cdiv(N, tn);
    i128 waves = cdiv128(tiles, sms > 0 ? sms : 1);
    return (double)waves * (double)tm * (double)tn * (double)K / eff;
}

/* The grouped op's checks up to the launch, then the choice: among the variants of the layout and
   dtypes whose contract takes the problem, the least grouped_cost for the expected rows per group
   (expected_m, else M / groups contiguous, M masked); the first of equals, best target first. */
static int32_t grouped_select(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p, fx_selection_t *out,
                              grouped_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_gemm_grouped: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("masked", p->masked))) return rc;
    int32_t ab = p->ab_dtype, c = p->c_dtype, masked = p->masked, mode = p->scale_mode;
    int fp8 = ab == FX_DTYPE_E4M3;
    if (fp8 ? c != FX_DTYPE_BF16 : ((ab != FX_DTYPE_BF16 && ab != FX_DTYPE_F16) || c != ab))
        return fail(FX_ERR_INPUT, "grouped GEMM takes a, b and c of one dtype, bfloat16 or float16, or e4m3 a and b with "
                    "a bfloat16 c (got a/b %s, c %s)", dtype_name(ab), dtype_name(c));
    if (fp8 ? (mode != FX_SCALE_ROW && mode != FX_SCALE_BLOCK) : mode != FX_SCALE_TENSOR)
        return fail(FX_ERR_INPUT, "grouped GEMM scale_mode %d: e4m3 takes row (1) or block (2) scales, bfloat16/float16 "
                    "none (0)", (int)mode);
    if (!fp8 && (p->scale_a || p->scale_b))
        return fail(FX_ERR_INPUT, "scale_a/scale_b apply to the e4m3 grouped GEMM only");
    static const char *const size_names[5] = {"m", "n", "k", "groups", "expected_m"};
    int64_t sizes[5] = {p->m, p->n, p->k, p->groups, p->expected_m};
    if ((rc = check_sizes(size_names, sizes, 5))) return rc;
    if ((rc = check_stride("a_stride", p->a_stride, 0, 3)) || (rc = check_stride("b_stride", p->b_stride, 0, 3)) ||
        (rc = check_stride("c_stride", p->c_stride, 0, 3)))
        return rc;
    int64_t M = p->m, N = p->n, K = p->k, E = p->groups, L = masked ? E : 1, one = 1, span;
    if (E > FX_MAX_GROUPS)
        return fail(FX_ERR_INPUT, "grouped GEMM takes at most %d groups, got %lld", FX_MAX_GROUPS, (long long)E);
    const int32_t *grp = masked ? p->masked_m : p->offs;
    if (masked ? p->offs != NULL : p->masked_m != NULL)
        return fail(FX_ERR_INPUT, "give offs for the contiguous layout (masked 0) and masked_m for the masked one, not both");
    int64_t sa[3] = {M, K, L}, sb[3] = {N, K, E}, sc[3] = {M, N, L};
    int64_t ast[3] = {p->a_stride[0], p->a_stride[1], masked ? p->a_stride[2] : 0};
    int64_t cst[3] = {p->c_stride[0], p->c_stride[1], masked ? p->c_stride[2] : 0};
    int64_t eb = elem_bytes(ab);
    fx_range in[5], oc;
    int32_t n_in = 3, rsa = 0, rsb = 0;
    int64_t ssa[3] = {0}, tsa[3] = {0}, ssb[3] = {0}, tsb[3] = {0};
    if ((rc = span_of("a", 3, sa, ast, &span)) || (rc = range_of(&in[0], "a", p->a, span, eb)) ||
        (rc = span_of("b", 3, sb, p->b_stride, &span)) || (rc = range_of(&in[1], "b", p->b, span, eb)) ||
        (rc = range_of(&in[2], masked ? "masked_m" : "offs", grp, E, 4)) ||
        (rc = span_of("c", 3, sc, cst, &span)) || (rc = range_of(&oc, "c", p->c, span, elem_bytes(c))))
        return rc;
    if (fp8) {
        if ((rc = grouped_scales(p, &rsa, ssa, tsa, &rsb, ssb, tsb)) ||
            (rc = span_of("scale_a", rsa, ssa, tsa, &span)) || (rc = range_of(&in[3], "scale_a", p->scale_a, span, 4)) ||
            (rc = span_of("scale_b", rsb, ssb, tsb, &span)) || (rc = range_of(&in[4], "scale_b", p->scale_b, span, 4)))
            return rc;
        n_in = 5;
    }
    if ((rc = check_distinct("c", 3, sc, cst)) || (rc = check_disjoint(&oc, in, n_in))) return rc;
    if (M == 0 || N == 0 || E == 0) return 0; /* nothing to launch */
    if (K == 0) return fail(FX_ERR_INPUT, "grouped GEMM: K must be positive (got 0)");
    memset(x, 0, sizeof *x);
    spec(&x->vals[0], p->a, 3, sa, ast);
    spec(&x->vals[1], p->b, 3, sb, p->b_stride);
    spec(&x->vals[2], p->c, 3, sc, cst);
    spec(&x->vals[3], grp, 1, &E, &one);
    x->n_vals = 4;
    if (fp8) {
        spec(&x->vals[4], p->scale_a, rsa, ssa, tsa);
        spec(&x->vals[5], p->scale_b, rsb, ssb, tsb);
        x->n_vals = 6;
    }
    int64_t rows = p->expected_m > 0 ? p->expected_m : masked ? M : cdiv(M, E);
    int32_t *cand, n = candidates(dev, FX_OP_GEMM_GROUPED, &cand), best = -1;
    char reason[1024] = "";
    double best_cost = 0;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *v = &fx_variants[cand[i]];
        if (v->grouped != (masked ? 2 : 1) || v->ab != ab || v->c != c) continue;
        if (check_contract(v, x->vals, x->n_vals)) {
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", fx_msg);
            continue;
        }
        double cost = grouped_cost(v, rows > 0 ? rows : 1, N, K, E, dev->sm_count);
        if (best >= 0 && !(cost < best_cost)) continue;
        best = cand[i], best_cost = cost;
    }
    free(cand);
    if (best < 0)
        return fail(FX_ERR_NO_VARIANT, "no gemm_grouped variant for %s %s%s, M=%lld N=%lld K=%lld groups=%lld on compute "
                    "capability %d.%d%s%s", masked ? "masked" : "contiguous", dtype_name(ab),
                    !fp8 ? "" : mode == FX_SCALE_ROW ? " row-scaled" : " block-scaled", (long long)M, (long long)N,
                    (long long)K, (long long)E, (int)dev->cc_major, (int)dev->cc_minor, reason[0] ? ": " : "", reason);
    return chosen(dev, best, out);
}

FX_EXPORT int32_t fx_gemm_grouped_select(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p,
                                         fx_selection_t *out) {
    fx_selection_t tmp;
    grouped_ctx x;
    if (!out) out = &tmp;
    return finish(grouped_select(dev, p, out, &x), out);
}

/* --- attention over a KV cache: runtime/kvcache.py ------------------------------------------------ */
/* kvcache.paged_split_count over the built split counts sp[i] (cl[i]: merged in a cluster). */
static int32_t paged_split_count(i128 groups, int64_t tiles, int32_t sms, const int32_t *sp, const int32_t *cl,
                                 int32_t n, int64_t head_dim, int fp8, i128 rows) {
    if (groups * 4 >= 3 * (i128)sms) return 1;
    int32_t fits[64], fcl[64], m = 0;
    for (int32_t i = 0; i < n && m < 64; i++) /* sorted ascending, duplicates dropped */
        if (sp[i] == 1 || tiles >= 4 * (int64_t)sp[i] ||
            (!fp8 && !cl[i] && rows <= 32 && tiles >= 2 * (int64_t)sp[i])) {
            int32_t j = m, dup = 0;
            for (int32_t k = 0; k < m; k++) dup |= fits[k] == sp[i];
            if (dup) continue;
            while (j > 0 && fits[j - 1] > sp[i]) fits[j] = fits[j - 1], fcl[j] = fcl[j - 1], j--;
            fits[j] = sp[i], fcl[j] = cl[i], m++;
        }
    if (!m) return 1; /* (Python: fits is never empty when 1 is built) */
    int32_t s = fits[m - 1], scl = fcl[m - 1];
    for (int32_t i = 0; i < m; i++) /* groups · s >= 1.9 · SMs, in Python's float arithmetic */
        if ((double)(groups * fits[i]) >= 1.9 * (double)sms) { s = fits[i], scl = fcl[i]; break; }
    if (s > 1 && scl && s >= 8 && groups * s > (i128)sms) /* bf16/f16 head_dim >= 128: >= 8 tiles a split */
        for (int32_t i = 0; i < m; i++)
            if (fits[i] > s && !fcl[i] && (fp8 || head_dim < 128 || tiles >= 8 * (int64_t)fits[i])) return fits[i];
    if ((fp8 || head_dim >= 128) && s > 1 && scl && groups * s > (i128)sms) { /* at most one CTA per SM */
        int32_t down = 0;
        for (int32_t i = 0; i < m; i++)
            if (fits[i] >= 2 && fcl[i] && groups * fits[i] <= (i128)sms) down = fits[i];
        if (down) return down;
    }
    return s;
}

typedef struct {
    int64_t b, sq, hq, hkv, d, sk, page_size; /* page_size 0: dense cache */
    int32_t dtype, kv_dtype, causal, local, softcap, sinks, varlen_q; /* varlen_q: sq is max_seqlen_q */
} kv_problem;

/* kvcache._admits */
static int kv_admits(const fx_variant *e, const kv_problem *q) {
    if (e->dtype != q->dtype || e->kv_dtype != q->kv_dtype || e->head_dim != q->d || e->varlen != q->varlen_q ||
        e->paged != (q->page_size > 0))
        return 0;
    if (q->page_size > 0 && !(e->page_size_mask >> (63 - __builtin_clzll((unsigned long long)q->page_size)) & 1))
        return 0;
    if (e->causal != q->causal && q->sq > 1) return 0;
    return (e->local || !q->local) && (e->softcap || !q->softcap) && (e->sinks || !q->sinks);
}

/* The entry of the last-arrival merge (fx_variant.workspace FX_WORKSPACE_COUNTERS) with `splits` key
   splits, `per_sm` CTAs per SM and no PDL: -1 where not built. */
static int32_t kv_last_built(const int32_t *c, int32_t n, int32_t splits, int32_t per_sm) {
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *e = &fx_variants[c[i]];
        if (e->workspace == FX_WORKSPACE_COUNTERS && e->kv_splits == splits && e->ctas_per_sm == per_sm && !e->pdl)
            return c[i];
    }
    return -1;
}

/* kvcache_rules._last_pick: head_dim >= 128; the one-CTA-per-SM build at the largest of 32 and 16
   splits whose grid is over a quarter of the SMs and within them, each split keeping >= 2 of 128
   keys' tiles; else the two-CTAs-per-SM build at 16 splits for a grid within two CTAs per SM whose
   splits keep >= 4 of 64 keys' tiles.  -1: none. */
static int32_t kv_last_pick(const int32_t *c, int32_t n, const kv_problem *q, i128 groups, int32_t sms) {
    if (q->d < 128) return -1;
    static const int32_t splits[2] = {32, 16};
    for (int32_t i = 0; i < 2; i++) {
        int32_t s = splits[i], w;
        if (4 * groups * s > (i128)sms && groups * s <= (i128)sms && q->sk >= 256 * (int64_t)s &&
            (w = kv_last_built(c, n, s, 1)) >= 0)
            return w;
    }
    if ((i128)sms < groups * 16 && groups * 16 <= 2 * (i128)sms && q->sk >= 16 * 256) return kv_last_built(c, n, 16, 2);
    return -1;
}

/* kvcache._pick_decode over one family's entries of the least switch cost: -1 for None. */
static int32_t kv_pick_decode(const int32_t *c, int32_t n, const kv_problem *q, int32_t sms) {
    if (q->sq > 16) return -1;
    int64_t row_blocks = q->hkv > 0 ? cdiv((q->hq / q->hkv) * q->sq, 16) : 0;
    i128 groups = (i128)q->b * q->hkv * row_blocks;
    int32_t last = kv_last_pick(c, n, q, groups, sms);
    if (last >= 0) return last;
    if (q->page_size == 0) {
        attn_decode d = {q->b, q->hq, q->hkv, q->sq, q->sk};
        return decode_pick(c, n, &d, 1, sms);
    }
    int32_t t1, sp[64], cl[64], idx[64];
    int32_t m = decode_tile_entries(c, n, sp, cl, idx, &t1);
    if (!m) return -1;
    /* Python builds {splits: cluster} from the entries in order: a later entry of a split count wins */
    int32_t cl_last[64];
    for (int32_t i = 0; i < m; i++) {
        cl_last[i] = cl[i];
        for (int32_t j = i + 1; j < m; j++)
            if (sp[j] == sp[i]) cl_last[i] = cl[j];
    }
    int32_t s = paged_split_count(groups, cdiv(q->sk, t1), sms, sp, cl_last, m, q->d, q->kv_dtype == FX_DTYPE_E4M3,
                                  (i128)q->b * q->hq * q->sq);
    /* the one-CTA-per-SM fp8 build of that split count, its PDL twin first, where built, for a grid that
       leaves half the SMs idle */
    if (q->kv_dtype == FX_DTYPE_E4M3 && 2 * groups * s <= (i128)sms) {
        int32_t first = -1;
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *e = &fx_variants[c[i]];
            if (e->preferred || e->kv_splits != s || e->ctas_per_sm != 1) continue;
            if (e->pdl) return c[i];
            if (first < 0) first = c[i];
        }
        if (first >= 0) return first;
    }
    if (q->kv_dtype != FX_DTYPE_E4M3) {
        int32_t w = decode_wide_pick(c, n, s, groups, q->d, sms);
        if (w >= 0) return w;
    }
    for (int32_t i = 0; i < m; i++)
        if (sp[i] == s) return idx[i];
    return -1;
}

/* kvcache._pick_prefill: the entry taking the fewest page sizes, then a preferred one; the first of
   equals. */
static int32_t kv_pick_prefill(const int32_t *c, int32_t n) {
    int32_t best = -1, best_sizes = 65, best_other = 2;
    for (int32_t i = 0; i < n; i++) {
        const fx_variant *e = &fx_variants[c[i]];
        int32_t sizes = __builtin_popcountll((unsigned long long)e->page_size_mask), other = !e->preferred;
        if (sizes < best_sizes || (sizes == best_sizes && other < best_other))
            best = c[i], best_sizes = sizes, best_other = other;
    }
    return best;
}

/* kvcache.select: the families in FAMILIES order; within one, the entries of the least switch
   cost.  -1: none (FX_ERR_NO_VARIANT). */
static int32_t kv_choose(const fx_device_t *dev, const kv_problem *q) {
    static const int32_t families[] = {FX_FAMILY_SM90_DECODE, FX_FAMILY_SM90, FX_FAMILY_SM80};
    int32_t *c, n = candidates(dev, FX_OP_ATTENTION_KVCACHE, &c), choice = -1;
    int32_t *mine = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (size_t f = 0; f < sizeof families / sizeof families[0] && choice < 0; f++) {
        int32_t m = 0, least = 4;
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *e = &fx_variants[c[i]];
            if (e->family != families[f] || !kv_admits(e, q)) continue;
            int32_t cost = e->local + e->softcap + e->sinks;
            if (cost < least) least = cost;
        }
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *e = &fx_variants[c[i]];
            if (e->family == families[f] && kv_admits(e, q) && e->local + e->softcap + e->sinks == least)
                mine[m++] = c[i];
        }
        if (m && families[f] == FX_FAMILY_SM90_DECODE) choice = kv_pick_decode(mine, m, q, dev->sm_count);
        else if (m) choice = kv_pick_prefill(mine, m);
    }
    free(mine);
    free(c);
    return choice;
}

static int is_page_size(int64_t ps) {
    return ps == 1 || ps == 8 || ps == 16 || ps == 32 || ps == 64 || ps == 128 || ps == 256;
}

/* kvcache.check's checks, kvcache.choose and the launch's contract check; values for a workspace
   at `workspace` (0 while only selecting). */
static int32_t kv_select(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p, fx_selection_t *out,
                         attn_ctx *a, uintptr_t workspace) {
    memset(out, 0, sizeof *out);
    a->counter_offset = a->counter_bytes = 0;
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!p) return fail(FX_ERR_INPUT, "the problem pointer is NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("causal", p->causal)) || (rc = check_bool("varlen_q", p->varlen_q))) return rc;
    if (p->dtype != FX_DTYPE_BF16 && p->dtype != FX_DTYPE_F16)
        return fail(FX_ERR_INPUT, "q dtype %s not supported (bf16, f16)", dtype_name(p->dtype));
    /* packed q: q/o (Sq, Hq, D) and lse (Hq, Sq), Sq the query tokens; the arrays below are the
       dense forms, read from index `first` on */
    const int varlen = p->varlen_q;
    const int32_t first = varlen ? 1 : 0;
    if (p->kv_dtype != p->dtype && p->kv_dtype != FX_DTYPE_E4M3)
        return fail(FX_ERR_INPUT, "k_cache/v_cache dtype %s must be q's (%s) or e4m3", dtype_name(p->kv_dtype),
                    dtype_name(p->dtype));
    static const char *const names[] = {"batch", "seqlen_q", "heads_q", "heads_kv", "head_dim", "num_pages",
                                        "page_size", "max_pages"};
    const int64_t sizes[] = {p->batch, p->seqlen_q, p->heads_q, p->heads_kv, p->head_dim, p->num_pages,
                             p->page_size, p->max_pages};
    if ((rc = check_sizes(names, sizes, 8))) return rc;
    const int64_t B = p->batch, Sq = p->seqlen_q, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    if (!is_head_dim(D)) return fail(FX_ERR_INPUT, "head_dim %lld not supported", (long long)D);
    if (Hkv == 0 || Hq % Hkv) return fail(FX_ERR_INPUT, "q heads (%lld) must be a multiple of kv heads (%lld)",
                                          (long long)Hq, (long long)Hkv);
    const int paged = p->max_pages > 0;
    if (paged) {
        if (!is_page_size(p->page_size))
            return fail(FX_ERR_INPUT, "page size %lld not offered: one of (1, 8, 16, 32, 64, 128, 256)",
                        (long long)p->page_size);
        if (p->num_pages < 1) return fail(FX_ERR_INPUT, "a paged k_cache needs at least one page");
        if (p->block_table_stride < 0) return fail(FX_ERR_INPUT, "block_table_stride must not be negative");
    } else if (p->num_pages != B) {
        return fail(FX_ERR_INPUT, "a dense cache (max_pages 0) must have num_pages = batch (%lld), got %lld",
                    (long long)B, (long long)p->num_pages);
    }
    if ((rc = check_stride("q_stride", p->q_stride, first, 3)) || (rc = check_stride("k_stride", p->k_stride, 0, 3)) ||
        (rc = check_stride("v_stride", p->v_stride, 0, 3)) || (rc = check_stride("o_stride", p->o_stride, first, 3)))
        return rc;
    if (varlen && (p->max_seqlen_q < 0 || p->max_seqlen_q > Sq))
        return fail(FX_ERR_INPUT, "max_seqlen_q = %d must be in [0, %lld] (the query tokens)", p->max_seqlen_q,
                    (long long)Sq);
    if (varlen && p->max_seqlen_q == 0 && Sq > 0 && B > 0)
        return fail(FX_ERR_INPUT, "max_seqlen_q = 0: with %lld query tokens in %lld sequences it must be at least 1 "
                    "(the longest query sequence)", (long long)Sq, (long long)B);
    if (p->window_left < -1 || p->window_right < -1)
        return fail(FX_ERR_INPUT, "window_size entries must be >= -1 (-1: unbounded)");
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return fail(FX_ERR_INPUT, "softcap must be a finite number >= 0 (0: off), got %g", (double)p->softcap);
    float scale = p->softmax_scale;
    if (scale == 0.0f) scale = (float)(1.0 / sqrt((double)D));
    if (!(scale > 0.0f) || isinf(scale))
        return fail(FX_ERR_INPUT, "softmax_scale must be a positive finite number, got %g", (double)p->softmax_scale);
    if (p->kv_descale && p->kv_dtype != FX_DTYPE_E4M3)
        return fail(FX_ERR_INPUT, "kv_descale applies to e4m3 caches only");
    if (!p->kv_descale && p->kv_dtype == FX_DTYPE_E4M3)
        return fail(FX_ERR_INPUT, "kv_descale: an e4m3 cache needs its (2, heads_kv) float32 descales (1.0: none)");
    if (B > fx_attention_grid_yz_max)
        return fail(FX_ERR_INPUT, "batch (%lld) must be <= %lld", (long long)B, (long long)fx_attention_grid_yz_max);
    int64_t numel_q, max_k;
    const int64_t q4[4] = {B, Sq, Hq, D};
    if ((rc = product(q4 + first, 4 - first, &numel_q, "q's element count"))) return rc;
    if ((rc = mul64(paged ? p->max_pages : 1, p->page_size, &max_k, "the cache's rows per sequence"))) return rc;
    const int64_t qs_[3] = {p->q_stride[0], p->q_stride[1], p->q_stride[2]};
    int64_t numel_k;
    const int64_t k4[4] = {p->num_pages, p->page_size, Hkv, D};
    if ((rc = product(k4, 4, &numel_k, "the cache's element count"))) return rc;
    int32_t kvec = p->kv_dtype == FX_DTYPE_E4M3 ? 16 : 8;
    if ((rc = check_strides("q", p->q, qs_, first, numel_q)) ||
        (rc = check_strides("o", p->o, p->o_stride, first, numel_q)))
        return rc;
    for (int32_t w = 0; w < 2 && numel_k; w++) {
        const int64_t *st = w ? p->v_stride : p->k_stride;
        const void *ptr = w ? p->v_cache : p->k_cache;
        for (int32_t i = 0; i < 3; i++)
            if (st[i] % kvec)
                return fail(FX_ERR_INPUT, "%s: strides must be multiples of %d elements (16 bytes) except the last",
                            w ? "v_cache" : "k_cache", kvec);
        if ((uintptr_t)ptr % 16) return fail(FX_ERR_INPUT, "%s: data pointer must be 16-byte aligned",
                                             w ? "v_cache" : "k_cache");
    }
    { /* outputs: every element its own address, no byte shared with an input or the other output */
        const int64_t qst[4] = {p->q_stride[0], p->q_stride[1], p->q_stride[2], 1};
        const int64_t ost[4] = {p->o_stride[0], p->o_stride[1], p->o_stride[2], 1};
        const int64_t kst[4] = {p->k_stride[0], p->k_stride[1], p->k_stride[2], 1};
        const int64_t vst[4] = {p->v_stride[0], p->v_stride[1], p->v_stride[2], 1};
        const int64_t eb = 2, kb = p->kv_dtype == FX_DTYPE_E4M3 ? 1 : 2;
        int64_t span;
        fx_range in[8], ro, rl;
        if ((rc = span_of("q", 4 - first, q4 + first, qst + first, &span)) || (rc = range_of(&in[0], "q", p->q, span, eb)) ||
            (rc = span_of("k_cache", 4, k4, kst, &span)) || (rc = range_of(&in[1], "k_cache", p->k_cache, span, kb)) ||
            (rc = span_of("v_cache", 4, k4, vst, &span)) || (rc = range_of(&in[2], "v_cache", p->v_cache, span, kb)) ||
            (rc = span_of("o", 4 - first, q4 + first, ost + first, &span)) || (rc = range_of(&ro, "o", p->o, span, eb)))
            return rc;
        const int64_t bt2[2] = {B, p->max_pages}, bts2[2] = {p->block_table_stride, 1};
        if ((rc = span_of("block_table", 2, bt2, bts2, &span)) ||
            (rc = range_of(&in[3], "block_table", p->max_pages > 0 ? (const void *)p->block_table : NULL, span, 4)))
            return rc;
        range_of(&in[4], "cache_seqlens", p->cache_seqlens, B, 4);
        range_of(&in[5], "sinks", p->sinks, Hq, 4);
        range_of(&in[6], "kv_descale", p->kv_descale, 2 * Hkv, 4);
        range_of(&in[7], "cu_seqlens_q", varlen ? (const void *)p->cu_seqlens_q : NULL, B + 1, 4);
        if ((rc = check_distinct("o", 4 - first, q4 + first, ost + first)) || (rc = check_disjoint(&ro, in, 8)))
            return rc;
        if (p->lse) {
            const int64_t ld[3] = {B, Hq, Sq}, lst_[3] = {p->lse_stride[0], p->lse_stride[1], 1};
            if ((rc = check_stride("lse_stride", p->lse_stride, first, 2)) ||
                (rc = span_of("lse", 3 - first, ld + first, lst_ + first, &span)) ||
                (rc = range_of(&rl, "lse", p->lse, span, 4)) || (rc = check_distinct("lse", 3 - first, ld + first, lst_ + first)) ||
                (rc = check_disjoint(&rl, in, 8)) || (rc = check_disjoint(&rl, &ro, 1)))
                return rc;
        }
    }
    int local = p->window_left >= 0 || (p->window_right >= 0 && !p->causal);
    if ((local || p->softcap > 0.0f) && !p->sinks)
        return fail(FX_ERR_INPUT, "sinks: the window/softcap build reads sinks: pass heads_q float32 logits "
                                  "(-inf where the model has none)");
    uint64_t lse_bytes = 0, ln = (varlen ? 1u : (uint64_t)B) * (uint64_t)Hq * (uint64_t)Sq;
    if (!p->lse && (rc = mulu64(ln, 4u, &lse_bytes, "the lse scratch"))) return rc;
    if (numel_q == 0) { /* kvcache.attention_kvcache: nothing to launch */
        out->workspace_bytes = 0;
        return 0;
    }
    kv_problem q = {B, varlen ? p->max_seqlen_q : Sq, Hq, Hkv, D, max_k, paged ? p->page_size : 0, p->dtype,
                    p->kv_dtype, p->causal, local, p->softcap > 0.0f, p->sinks != NULL, varlen};
    int32_t choice = kv_choose(dev, &q);
    if (choice < 0)
        return fail(FX_ERR_NO_VARIANT, "no attention_kvcache kernel in this bundle for dtype=%s kv_dtype=%s head_dim=%lld "
                    "%s %sseqlen_q=%lld causal=%d (on compute capability %d.%d)", dtype_name(p->dtype),
                    dtype_name(p->kv_dtype), (long long)D, paged ? "paged" : "dense cache", varlen ? "packed q max_" : "",
                    (long long)q.sq, p->causal, dev->cc_major, dev->cc_minor);
    const fx_variant *e = &fx_variants[choice];
    int64_t s = e->splits > 1 ? e->splits : 1; /* the workspace splits (cluster merges take none) */
    if (varlen && s > 1) return fail(FX_ERR_NO_VARIANT, "%s: a packed-q build with a split workspace", e->name);
    uint64_t nsplit = 0;
    a->split_bytes = 0;
    if (s > 1 && ((rc = mulu64((uint64_t)s, ln, &nsplit, "the split-KV workspace")) ||
                  (rc = mulu64(nsplit, ((uint64_t)D + 1u) * 4u, &a->split_bytes, "the split-KV workspace"))))
        return rc;
    a->splits = e->kv_splits > 0 ? e->kv_splits : 1;
    /* the last-arrival merge: one int32 counter per (b, q head, query) after the partials (16-byte
       multiple), zeroed by fx_attention_kvcache before each launch */
    a->counter_offset = a->split_bytes;
    a->counter_bytes = s > 1 && e->workspace == FX_WORKSPACE_COUNTERS ? (ln * 4u + 15u) / 16u * 16u : 0;
    if (__builtin_add_overflow(a->split_bytes, a->counter_bytes, &a->lse_offset) ||
        __builtin_add_overflow(a->lse_offset, lse_bytes, &out->workspace_bytes))
        return fail(FX_ERR_INPUT, "the attention workspace overflows 64 bits");
    fx_value *vals = a->vals;
    const int64_t kshape[4] = {p->num_pages, p->page_size, Hkv, D};
    const int64_t qs[4] = {p->q_stride[0], p->q_stride[1], p->q_stride[2], 1};
    const int64_t os[4] = {p->o_stride[0], p->o_stride[1], p->o_stride[2], 1};
    const int64_t ks[4] = {p->k_stride[0], p->k_stride[1], p->k_stride[2], 1};
    const int64_t vs[4] = {p->v_stride[0], p->v_stride[1], p->v_stride[2], 1};
    spec(&vals[0], p->q, 4 - first, q4 + first, qs + first);
    spec(&vals[1], p->k_cache, 4, kshape, ks);
    spec(&vals[2], p->v_cache, 4, kshape, vs);
    spec(&vals[3], p->o, 4 - first, q4 + first, os + first);
    const int64_t ls[3] = {B, Hq, Sq};
    const int64_t lst[3] = {p->lse ? p->lse_stride[0] : Hq * Sq, p->lse ? p->lse_stride[1] : Sq, 1};
    spec(&vals[4], p->lse ? (const void *)p->lse : (const void *)(workspace + a->lse_offset), 3 - first, ls + first,
         lst + first);
    int32_t k = 5;
    if (s > 1) {
        int64_t op[5] = {s, B, Hq, Sq, D}, ops[5] = {B * Hq * Sq * D, Hq * Sq * D, Sq * D, D, 1};
        int64_t lp[4] = {s, B, Hq, Sq}, lps[4] = {B * Hq * Sq, Hq * Sq, Sq, 1};
        spec(&vals[k++], (const void *)workspace, 5, op, ops);
        spec(&vals[k++], (const void *)(workspace + nsplit * (uint64_t)D * 4u), 4, lp, lps);
        if (a->counter_bytes) {
            int64_t cs[3] = {B, Hq, Sq}, css[3] = {Hq * Sq, Sq, 1};
            spec(&vals[k++], (const void *)(workspace + a->counter_offset), 3, cs, css);
        }
    }
    /* arguments a variant's switches leave unread get a valid pointer of the contract's shape:
       the dense cache's (B, 1) block table and the sinks / descales of builds without them */
    const void *any = p->cache_seqlens ? (const void *)p->cache_seqlens : (const void *)p->q;
    const int64_t bts[2] = {B, paged ? p->max_pages : 1}, btst[2] = {paged ? p->block_table_stride : 1, 1};
    spec(&vals[k++], paged ? (const void *)p->block_table : any, 2, bts, btst);
    const int64_t bsh[1] = {B}, one[1] = {1};
    spec(&vals[k++], p->cache_seqlens, 1, bsh, one);
    const int64_t b1[1] = {B + 1};
    if (varlen) spec(&vals[k++], p->cu_seqlens_q, 1, b1, one);
    const int64_t hsh[1] = {Hq};
    spec(&vals[k++], p->sinks ? (const void *)p->sinks : any, 1, hsh, one);
    if (p->kv_dtype == FX_DTYPE_E4M3) { /* e4m3 caches: k_descale and v_descale, rows 0 and 1 of kv_descale */
        const int64_t hkv1[1] = {Hkv};
        spec(&vals[k++], p->kv_descale, 1, hkv1, one);
        spec(&vals[k++], (const void *)(p->kv_descale ? p->kv_descale + Hkv : NULL), 1, hkv1, one);
    } else {
        const int64_t dsh[2] = {2, Hkv}, dst[2] = {Hkv, 1};
        spec(&vals[k++], p->kv_descale ? (const void *)p->kv_descale : any, 2, dsh, dst);
    }
    vals[k++].f = scale;
    vals[k++].f = p->softcap;
    vals[k++].i = p->window_left;
    vals[k++].i = p->window_right;
    if (varlen) vals[k++].i = p->max_seqlen_q;
    a->n_vals = k;
    out->variant = choice;
    out->name = e->name;
    out->splits = a->splits;
    if (a->n_vals != e->n_args || (rc = check_contract(e, a->vals, a->n_vals))) {
        out->variant = -1;
        out->name = NULL;
        return rc ? rc : fail(FX_ERR_INPUT, "%s takes %d arguments, got %d", e->name, e->n_args, a->n_vals);
    }
    return 0;
}

FX_EXPORT int32_t fx_attention_kvcache_select(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p,
                                              fx_selection_t *out) {
    fx_selection_t tmp;
    attn_ctx a;
    if (!out) out = &tmp;
    return finish(kv_select(dev, p, out, &a, 0), out);
}

/* --- fp8 attention: runtime/attention_fp8.py (selection only) ------------------------------------- */
/* The checks of the problem's sizes and flags (the tensors' own checks are the runtime's), then the
   variant: head_dim and mask, taking v in the caller's layout; for v as k where no variant
   transposes it, one taking v pre-transposed (the runtime copies v); the preferred tile first,
   best target first. */
static int32_t fp8_select(const fx_device_t *dev, const fx_attention_fp8_problem_t *p, fx_selection_t *out) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_attention_fp8: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("causal", p->causal)) || (rc = check_bool("v_layout", p->v_layout)) ||
        (rc = check_bool("varlen", p->varlen)))
        return rc;
    float scale = p->softmax_scale;
    if (scale != 0.0f && !(scale > 0.0f && isfinite(scale)))
        return fail(FX_ERR_INPUT, "softmax_scale must be a positive finite number, got %g", (double)scale);
    static const char *const names[6] = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"};
    int64_t sizes[6] = {p->batch, p->seqlen_q, p->seqlen_k, p->heads_q, p->heads_kv, p->head_dim};
    if ((rc = check_sizes(names, sizes, 6))) return rc;
    if (!is_head_dim(p->head_dim)) return fail(FX_ERR_INPUT, "head_dim %lld not supported", (long long)p->head_dim);
    if (p->heads_kv == 0 || p->heads_q % p->heads_kv)
        return fail(FX_ERR_INPUT, "q heads (%lld) must be a multiple of kv heads (%lld)", (long long)p->heads_q,
                    (long long)p->heads_kv);
    if (p->batch > fx_attention_grid_yz_max || p->heads_q > fx_attention_grid_yz_max)
        return fail(FX_ERR_INPUT, "batch (%lld) and heads (%lld) must each be <= %lld", (long long)p->batch,
                    (long long)p->heads_q, (long long)fx_attention_grid_yz_max);
    int64_t qn, kn;
    if ((rc = product((int64_t[4]){p->batch, p->seqlen_q, p->heads_q, p->head_dim}, 4, &qn,
                      "the queries (batch x seqlen_q x heads_q x head_dim)")) ||
        (rc = product((int64_t[4]){p->batch, p->seqlen_k, p->heads_kv, p->head_dim}, 4, &kn,
                      "the keys (batch x seqlen_k x heads_kv x head_dim)")))
        return rc;
    int32_t *cand, n = candidates(dev, FX_OP_ATTENTION_FP8, &cand), pick = -1, fallback = -1;
    for (int32_t pass = 0; pass < 2 && pick < 0; pass++)
        for (int32_t i = 0; i < n; i++) {
            const fx_variant *e = &fx_variants[cand[i]];
            if (e->head_dim != p->head_dim || e->causal != p->causal || e->varlen != p->varlen) continue;
            if (pass == 0 && !e->preferred) continue;
            if (e->v_pretransposed == p->v_layout) {
                if (pick < 0) pick = cand[i];
            } else if (!p->v_layout && fallback < 0) {
                fallback = cand[i];
            }
        }
    free(cand);
    if (pick < 0) pick = fallback;
    if (pick < 0)
        return fail(FX_ERR_NO_VARIANT, "no fp8 attention variant for head_dim %lld, causal=%d, v_layout=%s%s on "
                    "compute capability %d.%d", (long long)p->head_dim, p->causal, p->v_layout ? "bhds" : "bshd",
                    p->varlen ? ", varlen" : "", dev->cc_major, dev->cc_minor);
    if (qn == 0 || p->seqlen_k == 0) return FX_OK; /* nothing to launch (no keys: the runtime writes 0 / -inf) */
    out->variant = pick;
    out->name = fx_variants[pick].name;
    out->splits = 1;
    return FX_OK;
}

FX_EXPORT int32_t fx_attention_fp8_select(const fx_device_t *dev, const fx_attention_fp8_problem_t *p,
                                          fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(fp8_select(dev, p, out), out);
}

/* --- the row-wise ops (elementwise/): RMSNorm, fp8 rows ------------------------------------------- */
/* The least max_n of the best target whose rows hold n (then the first name): fused._pick. */
static int32_t rowwise_pick(const fx_device_t *dev, int32_t op, int32_t dtype, int32_t flags, int64_t n,
                            const fx_value *vals, int32_t n_vals, char *reason, size_t reason_size) {
    int32_t *cand, k = candidates(dev, op, &cand), best = -1, top = -1;
    for (int32_t i = 0; i < k; i++) {
        const fx_variant *v = &fx_variants[cand[i]];
        if ((dtype >= 0 && v->dtype != dtype) || v->rowwise != flags || v->max_n < n) continue;
        if (top < 0) top = v->target;
        if (v->target != top) continue;
        if (check_contract(v, vals, n_vals)) {
            if (!reason[0]) snprintf(reason, reason_size, "%s", fx_msg);
            continue;
        }
        if (best >= 0) {
            const fx_variant *b = &fx_variants[best];
            if (v->max_n > b->max_n || (v->max_n == b->max_n && strcmp(v->name, b->name) >= 0)) continue;
        }
        best = cand[i];
    }
    free(cand);
    return best;
}

/* rowwise_pick's variant into ``out`` (0); the layout's reason as FX_ERR_INPUT naming ``name``; or 1
   where no variant of the bundle serves the problem (the caller says what is missing). */
static int32_t rowwise_take(const fx_device_t *dev, int32_t op, const char *name, int32_t dtype, int32_t flags,
                            int64_t n, const fx_value *vals, int32_t n_vals, fx_selection_t *out) {
    char reason[1024] = "";
    int32_t best = rowwise_pick(dev, op, dtype, flags, n, vals, n_vals, reason, sizeof reason);
    if (best < 0) return reason[0] ? fail(FX_ERR_INPUT, "%s: %s", name, reason) : 1;
    out->variant = best;
    out->name = fx_variants[best].name;
    out->splits = 1;
    return 0;
}

/* --- RMSNorm (+ residual, + e4m3 output): runtime/fused.py ----------------------------------------- */
typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* x, weight [, residual], y [, scale], eps */
    int32_t n_vals;
} rms_ctx;

/* fused.rms_norm_check's checks, the aliasing of the outputs, and fused.rms_norm_choose: among the
   variants of the dtype and switches whose rows hold n, those of the best target, the fewest chunks
   (the least max_n; then the first name). */
static int32_t rms_select(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_selection_t *out, rms_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_rms_norm: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("residual_add", p->residual_add)) || (rc = check_bool("quantize", p->quantize))) return rc;
    if (p->dtype != FX_DTYPE_BF16 && p->dtype != FX_DTYPE_F16)
        return fail(FX_ERR_INPUT, "x must be bf16 or f16, got dtype %d", (int)p->dtype);
    static const char *const names[2] = {"m", "n"};
    const int64_t sizes[2] = {p->m, p->n};
    if ((rc = check_sizes(names, sizes, 2))) return rc;
    const int64_t M = p->m, N = p->n, one = 1;
    if (N == 0 || N % 8)
        return fail(FX_ERR_INPUT, "the hidden size %lld must be a positive multiple of 8 (16-byte vectors)", (long long)N);
    if (!(p->eps >= 0.0f) || !isfinite(p->eps)) return fail(FX_ERR_INPUT, "eps must be a finite number >= 0");
    const int res = p->residual_add, quant = p->quantize;
    const int64_t rs[3] = {p->x_stride, res ? p->residual_stride : N, p->y_stride};
    static const char *const rnames[3] = {"x_stride", "residual_stride", "y_stride"};
    for (int32_t i = 0; i < 3; i++)
        if (rs[i] < N && M > 1)
            return fail(FX_ERR_INPUT, "%s %lld: rows of %lld elements must not overlap (a row stride >= n)", rnames[i],
                        (long long)rs[i], (long long)N);
    const int64_t eb = elem_bytes(p->dtype);
    int64_t sx[2] = {M, N}, stx[2] = {p->x_stride, 1}, str[2] = {rs[1], 1}, sty[2] = {p->y_stride, 1}, span;
    fx_range in[4], oy, ores, osc;
    if ((rc = span_of("x", 2, sx, stx, &span)) || (rc = range_of(&in[0], "x", p->x, span, eb)) ||
        (rc = range_of(&in[1], "weight", p->weight, N, eb)) ||
        (rc = span_of("residual", 2, sx, str, &span)) ||
        (rc = range_of(&ores, "residual", res ? p->residual : NULL, span, eb)) ||
        (rc = span_of("y", 2, sx, sty, &span)) || (rc = range_of(&oy, "y", p->y, span, quant ? 1 : eb)) ||
        (rc = range_of(&osc, "scale", quant ? p->scale : NULL, M, 4)))
        return rc;
    in[2] = ores;
    in[3] = osc;
    /* y against x, weight, residual, scale; residual (written) against x, weight, scale; scale against x, weight */
    fx_range r_in[3] = {in[0], in[1], osc}, s_in[2] = {in[0], in[1]};
    if ((rc = check_disjoint(&oy, in, 4)) || (rc = check_disjoint(&ores, r_in, 3)) || (rc = check_disjoint(&osc, s_in, 2)))
        return rc;
    if (M == 0) return 0; /* nothing to launch */
    memset(x, 0, sizeof *x);
    int32_t k = 0;
    spec(&x->vals[k++], p->x, 2, sx, stx);
    spec(&x->vals[k++], p->weight, 1, &N, &one);
    if (res) spec(&x->vals[k++], p->residual, 2, sx, str);
    spec(&x->vals[k++], p->y, 2, sx, sty);
    if (quant) spec(&x->vals[k++], p->scale, 1, &M, &one);
    x->vals[k++].f = p->eps;
    x->n_vals = k;
    const int32_t want = (res ? FX_RW_RESIDUAL : 0) | (quant ? FX_RW_QUANT : 0);
    if ((rc = rowwise_take(dev, FX_OP_RMS_NORM, "rms_norm", p->dtype, want, N, x->vals, x->n_vals, out)) != 1)
        return rc;
    return fail(FX_ERR_NO_VARIANT, "no rms_norm variant for %s rows of %lld%s%s on compute capability %d.%d",
                dtype_name(p->dtype), (long long)N, res ? " with residual" : "", quant ? " to e4m3" : "",
                dev->cc_major, dev->cc_minor);
}

FX_EXPORT int32_t fx_rms_norm_select(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_selection_t *out) {
    fx_selection_t tmp;
    rms_ctx x;
    if (!out) out = &tmp;
    return finish(rms_select(dev, p, out, &x), out);
}

/* --- e4m3 rows re-scaled: runtime/fused.py fp8_rows -------------------------------------------------- */
typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* codes, group_scale, out, scale */
    int32_t n_vals;
} f8r_ctx;

static int32_t f8r_select(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_selection_t *out, f8r_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_fp8_rows: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    static const char *const names[2] = {"m", "n"};
    const int64_t sizes[2] = {p->m, p->n};
    if ((rc = check_sizes(names, sizes, 2))) return rc;
    const int64_t M = p->m, N = p->n, G = cdiv(N > 0 ? N : 1, 128), one = 1;
    if (N == 0 || N % 16)
        return fail(FX_ERR_INPUT, "the row length %lld must be a positive multiple of 16 (16-byte vectors)",
                    (long long)N);
    if (M > 1 && (p->codes_stride < N || p->codes_stride % 16 || p->out_stride < N || p->out_stride % 16))
        return fail(FX_ERR_INPUT, "codes / out: rows must have a row stride >= %lld and a multiple of 16, got %lld / "
                    "%lld", (long long)N, (long long)p->codes_stride, (long long)p->out_stride);
    if (M > 1 && G > 1 && p->group_scale_stride < M)
        return fail(FX_ERR_INPUT, "group_scale must be M-major: its column stride %lld must be >= m = %lld",
                    (long long)p->group_scale_stride, (long long)M);
    /* one row: any row stride reads the same elements (fused.fp8_rows passes a 16-multiple) */
    const int64_t cs = M > 1 ? p->codes_stride : cdiv(N, 16) * 16, os = M > 1 ? p->out_stride : cdiv(N, 16) * 16;
    const int64_t gs = G > 1 ? p->group_scale_stride : cdiv(M, 4) * 4;
    int64_t sh[2] = {M, N}, stc[2] = {cs, 1}, sto[2] = {os, 1}, shg[2] = {M, G}, stg[2] = {1, gs}, span;
    fx_range in[2], oo, osc;
    if ((rc = span_of("codes", 2, sh, stc, &span)) || (rc = range_of(&in[0], "codes", p->codes, span, 1)) ||
        (rc = span_of("group_scale", 2, shg, stg, &span)) || (rc = range_of(&in[1], "group_scale", p->group_scale, span, 4)) ||
        (rc = span_of("out", 2, sh, sto, &span)) || (rc = range_of(&oo, "out", p->out, span, 1)) ||
        (rc = range_of(&osc, "scale", p->scale, M, 4)))
        return rc;
    const int in_place = p->out && p->out == p->codes && os == cs;
    fx_range o_in[3] = {in[1], osc, in[0]}, s_in[3] = {in[0], in[1], oo};
    if ((rc = check_disjoint(&oo, o_in, in_place ? 2 : 3)) || (rc = check_disjoint(&osc, s_in, 3))) return rc;
    if (M == 0) return 0;
    memset(x, 0, sizeof *x);
    spec(&x->vals[0], p->codes, 2, sh, stc);
    spec(&x->vals[1], p->group_scale, 2, shg, stg);
    spec(&x->vals[2], p->out, 2, sh, sto);
    spec(&x->vals[3], p->scale, 1, &M, &one);
    x->n_vals = 4;
    if ((rc = rowwise_take(dev, FX_OP_FP8_ROWS, "fp8_rows", -1, 0, N, x->vals, x->n_vals, out)) != 1) return rc;
    return fail(FX_ERR_NO_VARIANT, "no fp8_rows variant for e4m3 rows of %lld on compute capability %d.%d",
                (long long)N, dev->cc_major, dev->cc_minor);
}

FX_EXPORT int32_t fx_fp8_rows_select(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_selection_t *out) {
    fx_selection_t tmp;
    f8r_ctx x;
    if (!out) out = &tmp;
    return finish(f8r_select(dev, p, out, &x), out);
}

/* --- rotary embedding + KV-cache write: runtime/fused.py rope_kvcache --------------------------------- */
typedef struct {
    fx_value vals[FX_MAX_ARGS]; /* q, k, v, positions | cache_seqlens, cos_sin, k_cache, v_cache, slots | table [, scales] */
    int32_t n_vals;
} rope_ctx;

/* fused.rope_kvcache_check's checks, the caches' layout and aliasing, and fused.rope_kvcache_choose. */
static int32_t rope_select(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p, fx_selection_t *out,
                           rope_ctx *x) {
    memset(out, 0, sizeof *out);
    out->variant = -1;
    fx_msg[0] = 0;
    int32_t rc;
    if (!dev || !p) return fail(FX_ERR_INPUT, "fx_rope_kvcache: dev and problem must not be NULL");
    if ((rc = check_device(dev))) return rc;
    if ((rc = check_bool("neox", p->neox)) || (rc = check_bool("table", p->table))) return rc;
    if (p->dtype != FX_DTYPE_BF16 && p->dtype != FX_DTYPE_F16)
        return fail(FX_ERR_INPUT, "q must be bf16 or f16, got dtype %d", (int)p->dtype);
    const int fp8 = p->cache_dtype == FX_DTYPE_E4M3;
    if (p->cache_dtype != p->dtype && !fp8)
        return fail(FX_ERR_INPUT, "k_cache / v_cache must be %s (q's dtype) or e4m3, got dtype %d", dtype_name(p->dtype),
                    (int)p->cache_dtype);
    static const char *const names[10] = {"tokens", "heads_q", "heads_kv", "head_dim", "rotary_dim", "max_position",
                                          "num_pages", "page_size", "batch", "max_pages"};
    const int64_t sizes[10] = {p->tokens, p->heads_q, p->heads_kv, p->head_dim, p->rotary_dim, p->max_position,
                               p->num_pages, p->page_size, p->batch, p->max_pages};
    if ((rc = check_sizes(names, sizes, 10))) return rc;
    const int64_t T = p->tokens, HQ = p->heads_q, HKV = p->heads_kv, D = p->head_dim, R = p->rotary_dim;
    const int64_t P = p->num_pages, PS = p->page_size, B = p->batch, MP = p->max_pages, MAXPOS = p->max_position;
    if (D == 0 || D % 8) return fail(FX_ERR_INPUT, "head_dim %lld must be a positive multiple of 8", (long long)D);
    if (R == 0 || R % 16 || R > D)
        return fail(FX_ERR_INPUT, "rotary_dim %lld must be a positive multiple of 16 and at most head_dim %lld",
                    (long long)R, (long long)D);
    if (MAXPOS == 0) return fail(FX_ERR_INPUT, "cos_sin_cache has no positions");
    if (p->table) {
        if (B == 0 || T % B) return fail(FX_ERR_INPUT, "the block-table form needs batch >= 1 dividing tokens (%lld)",
                                         (long long)T);
        if (MP == 0) return fail(FX_ERR_INPUT, "block_table has no columns");
    }
    if ((rc = check_stride("q_stride", p->q_stride, 0, 2)) || (rc = check_stride("k_stride", p->k_stride, 0, 2)) ||
        (rc = check_stride("v_stride", p->v_stride, 0, 2)) || (rc = check_stride("k_cache_stride", p->k_cache_stride, 0, 3)) ||
        (rc = check_stride("v_cache_stride", p->v_cache_stride, 0, 3)))
        return rc;
    if (p->block_table_stride < 0 || p->cos_sin_stride < 0)
        return fail(FX_ERR_INPUT, "block_table_stride and cos_sin_stride must not be negative");
    if (fp8 && ((p->k_scale_stride != 0 && p->k_scale_stride != 1) || (p->v_scale_stride != 0 && p->v_scale_stride != 1)))
        return fail(FX_ERR_INPUT, "k_scale / v_scale strides must be 0 (one per tensor) or 1 (one per kv head)");
    const int64_t eb = elem_bytes(p->dtype), cb = fp8 ? 1 : eb, one = 1, zero = 0;
    int64_t sq[3] = {T, HQ, D}, stq[3] = {p->q_stride[0], p->q_stride[1], 1};
    int64_t sk[3] = {T, HKV, D}, stk[3] = {p->k_stride[0], p->k_stride[1], 1}, stv[3] = {p->v_stride[0], p->v_stride[1], 1};
    int64_t sc[4] = {P, PS, HKV, D}, stkc[4] = {p->k_cache_stride[0], p->k_cache_stride[1], p->k_cache_stride[2], 1};
    int64_t stvc[4] = {p->v_cache_stride[0], p->v_cache_stride[1], p->v_cache_stride[2], 1};
    int64_t scs[2] = {MAXPOS, R}, stcs[2] = {p->cos_sin_stride, 1}, sbt[2] = {B, MP}, stbt[2] = {p->block_table_stride, 1};
    int64_t span;
    fx_range in[8], okc, ovc;
    if ((rc = check_distinct("q", 3, sq, stq)) || (rc = check_distinct("k", 3, sk, stk)) ||
        (rc = check_distinct("k_cache", 4, sc, stkc)) || (rc = check_distinct("v_cache", 4, sc, stvc)))
        return rc;
    if ((rc = span_of("q", 3, sq, stq, &span)) || (rc = range_of(&in[0], "q", p->q, span, eb)) ||
        (rc = span_of("k", 3, sk, stk, &span)) || (rc = range_of(&in[1], "k", p->k, span, eb)) ||
        (rc = span_of("v", 3, sk, stv, &span)) || (rc = range_of(&in[2], "v", p->v, span, eb)) ||
        (rc = span_of("cos_sin_cache", 2, scs, stcs, &span)) || (rc = range_of(&in[3], "cos_sin_cache", p->cos_sin_cache, span, 4)) ||
        (rc = range_of(&in[4], p->table ? "cache_seqlens" : "positions", p->table ? (const void *)p->cache_seqlens
                       : (const void *)p->positions, p->table ? B : T, p->table ? 4 : 8)))
        return rc;
    if (p->table) {
        if ((rc = span_of("block_table", 2, sbt, stbt, &span)) || (rc = range_of(&in[5], "block_table", p->block_table, span, 4)))
            return rc;
    } else if ((rc = range_of(&in[5], "slot_mapping", p->slot_mapping, T, 8))) {
        return rc;
    }
    if ((rc = range_of(&in[6], "k_scale", fp8 ? p->k_scale : NULL, p->k_scale_stride ? HKV : 1, 4)) ||
        (rc = range_of(&in[7], "v_scale", fp8 ? p->v_scale : NULL, p->v_scale_stride ? HKV : 1, 4)) ||
        (rc = span_of("k_cache", 4, sc, stkc, &span)) || (rc = range_of(&okc, "k_cache", p->k_cache, span, cb)) ||
        (rc = span_of("v_cache", 4, sc, stvc, &span)) || (rc = range_of(&ovc, "v_cache", p->v_cache, span, cb)))
        return rc;
    fx_range kin[9], vin[9];
    for (int32_t i = 0; i < 8; i++) kin[i] = vin[i] = in[i];
    kin[8] = ovc;
    vin[8] = okc;
    if ((rc = check_disjoint(&okc, kin, 9)) || (rc = check_disjoint(&ovc, vin, 9))) return rc;
    if (T == 0 || P == 0 || PS == 0 || HKV == 0) return 0; /* nothing to launch */
    memset(x, 0, sizeof *x);
    int32_t k = 0;
    spec(&x->vals[k++], p->q, 3, sq, stq);
    spec(&x->vals[k++], p->k, 3, sk, stk);
    spec(&x->vals[k++], p->v, 3, sk, stv);
    if (p->table) spec(&x->vals[k++], p->cache_seqlens, 1, &B, &one);
    else spec(&x->vals[k++], p->positions, 1, &T, &one);
    spec(&x->vals[k++], p->cos_sin_cache, 2, scs, stcs);
    spec(&x->vals[k++], p->k_cache, 4, sc, stkc);
    spec(&x->vals[k++], p->v_cache, 4, sc, stvc);
    if (p->table) spec(&x->vals[k++], p->block_table, 2, sbt, stbt);
    else spec(&x->vals[k++], p->slot_mapping, 1, &T, &one);
    if (fp8) {
        spec(&x->vals[k++], p->k_scale, 1, &HKV, p->k_scale_stride ? &one : &zero);
        spec(&x->vals[k++], p->v_scale, 1, &HKV, p->v_scale_stride ? &one : &zero);
    }
    x->n_vals = k;
    const int32_t want = (p->neox ? FX_RW_NEOX : 0) | (p->table ? FX_RW_TABLE : 0) | (fp8 ? FX_RW_FP8_CACHE : 0);
    if ((rc = rowwise_take(dev, FX_OP_ROPE_KVCACHE, "rope_kvcache", p->dtype, want, 0, x->vals, x->n_vals, out)) != 1)
        return rc;
    return fail(FX_ERR_NO_VARIANT, "no rope_kvcache variant for %s %s rotary%s%s on compute capability %d.%d",
                dtype_name(p->dtype), p->neox ? "neox" : "interleaved", p->table ? " with a block table" : "",
                fp8 ? " into e4m3 caches" : "", dev->cc_major, dev->cc_minor);
}

FX_EXPORT int32_t fx_rope_kvcache_select(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p,
                                         fx_selection_t *out) {
    fx_selection_t tmp;
    rope_ctx x;
    if (!out) out = &tmp;
    return finish(rope_select(dev, p, out, &x), out);
}

FX_EXPORT int32_t fx_variant_v_layout(int32_t i) {
    return i >= 0 && i < fx_n_variants ? fx_variants[i].v_pretransposed : -1;
}

/* --- launching ------------------------------------------------------------------------------------ */
static pthread_mutex_t fx_load_lock = PTHREAD_MUTEX_INITIALIZER;

static int32_t ensure_loaded(int32_t i) {
    fx_state *st = &fx_states[i];
    if (__atomic_load_n(&st->loaded, __ATOMIC_ACQUIRE)) return 0;
    pthread_mutex_lock(&fx_load_lock);
    int32_t rc = 0;
    if (!st->loaded) {
        rc = fx_variants[i].load();
        if (rc == 0) __atomic_store_n(&st->loaded, 1, __ATOMIC_RELEASE); /* (else the load named the error) */
    }
    pthread_mutex_unlock(&fx_load_lock);
    return rc;
}

/* Clusters of this persistent variant's kernel the current device holds at once
   (cudaOccupancyMaxActiveClusters on the loaded kernel, as runtime/occupancy.py asks the driver),
   asked once per device; 0 when the driver gives no answer. */
static int32_t driver_clusters(int32_t i) {
    const fx_variant *v = &fx_variants[i];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= FX_MAX_DEVICES) {
        cudaGetLastError();
        return 0;
    }
    int32_t *slot = &fx_states[i].clusters[dev];
    int32_t c = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (c) return c > 0 ? c : 0;
    int n = 0;
    cudaKernel_t k = NULL;
    cudaError_t e = v->kernel ? cudaLibraryGetKernel(&k, *v->module, v->kernel) : cudaErrorInvalidValue;
    if (e == cudaSuccess) { /* the occupancy of its shared memory: raise the kernel's limit to it, never lower it */
        struct cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, (const void *)k) != cudaSuccess) {
            cudaGetLastError();
            fa.maxDynamicSharedSizeBytes = 0;
        }
        if (fa.maxDynamicSharedSizeBytes < v->smem_bytes)
            e = cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize, v->smem_bytes, dev);
    }
    if (e == cudaSuccess) e = cudaKernelSetAttributeForDevice(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1, dev);
    if (e == cudaSuccess) {
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute attr;
        memset(&cfg, 0, sizeof cfg);
        memset(&attr, 0, sizeof attr);
        cfg.gridDim.x = (unsigned)v->cluster_ctas, cfg.gridDim.y = 1, cfg.gridDim.z = 1;
        cfg.blockDim.x = (unsigned)v->threads, cfg.blockDim.y = 1, cfg.blockDim.z = 1;
        cfg.dynamicSmemBytes = (size_t)v->smem_bytes;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = (unsigned)v->cluster_ctas, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        e = cudaOccupancyMaxActiveClusters(&n, (const void *)k, &cfg);
    }
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError(); /* not this call's error: the launch must not see it */
        n = -1;
    }
    __atomic_store_n(slot, n, __ATOMIC_RELEASE);
    return n > 0 ? n : 0;
}

/* A launch's return code, its error named in fx_last_error_message. */
static int32_t launched(int32_t i, int32_t rc) {
    if (rc > 0) return fail(rc, "launching %s: %s: %s", fx_variants[i].name, cudaGetErrorName((cudaError_t)rc),
                            cudaGetErrorString((cudaError_t)rc));
    return rc;
}

static int32_t check_workspace(uint64_t need, void *workspace, uint64_t bytes) {
    if (!need) return 0;
    if (!workspace || bytes < need || (uintptr_t)workspace % 16)
        return fail(FX_ERR_WORKSPACE, "this launch needs %llu bytes of 16-byte aligned workspace, got %llu at %p",
                    (unsigned long long)need, (unsigned long long)bytes, workspace);
    return 0;
}

/* Every pointer a launch uses must be device (or managed) memory of the current device, and the
   stream must belong to that device: a kernel given another device's stream or pointers would
   run where the data is not (seen on two H200s: cuda:1 pointers on the default stream with cuda:0
   current returned success and left c unwritten).  names[i] names ptrs[i]; NULL pointers are
   skipped (optional ones). */
static int32_t check_launch_device(fx_stream_t stream, int32_t n, const void *const *ptrs, const char *const *names) {
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess) {
        cudaGetLastError();
        int32_t rc = fx_require_device("the call"); /* no driver or device: its cudaError_t, named */
        return rc ? rc : fail(FX_ERR_INPUT, "no current CUDA device (%s)", cudaGetErrorString(e));
    }
    if ((uintptr_t)stream > 2) { /* 0, 1, 2: the current device's default, legacy and per-thread streams */
        int sd = -1;
        e = cudaStreamGetDevice((cudaStream_t)stream, &sd);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail(FX_ERR_INPUT, "the stream is not a CUDA stream of this process (%s)", cudaGetErrorString(e));
        }
        if (sd != cur)
            return fail(FX_ERR_INPUT, "the stream belongs to device %d but the current device is %d: "
                        "cudaSetDevice(%d) before the call", sd, cur, sd);
    }
    for (int32_t i = 0; i < n; i++) {
        if (!ptrs[i]) continue;
        struct cudaPointerAttributes pa;
        e = cudaPointerGetAttributes(&pa, ptrs[i]);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail(FX_ERR_INPUT, "%s (%p): %s", names[i], ptrs[i], cudaGetErrorString(e));
        }
        if (pa.type != cudaMemoryTypeDevice && pa.type != cudaMemoryTypeManaged)
            return fail(FX_ERR_INPUT, "%s (%p) is not device memory", names[i], ptrs[i]);
        if (pa.type == cudaMemoryTypeDevice && pa.device != cur)
            return fail(FX_ERR_INPUT, "%s is on device %d but the current device is %d: cudaSetDevice(%d) "
                        "before the call", names[i], pa.device, cur, pa.device);
    }
    return 0;
}

/* K = 0: c is a sum of nothing, zeros (cudaMemset2DAsync per batch; c's rows or columns contiguous). */
static int32_t gemm_zero(const fx_gemm_problem_t *p, cudaStream_t stream) {
    if (p->m == 0 || p->n == 0 || p->l == 0) return 0;
    if (!p->c) return fail(FX_ERR_INPUT, "fx_gemm needs c");
    size_t es = p->c_dtype == FX_DTYPE_F32 ? 4 : p->c_dtype == FX_DTYPE_E4M3 ? 1 : 2;
    int64_t rows = p->m, cols = p->n, pitch = p->c_stride[0];
    if (p->c_stride[1] != 1 && p->n != 1) {
        if (p->c_stride[0] != 1 && p->m != 1)
            return fail(FX_ERR_INPUT, "K = 0: c must have contiguous rows or columns to be zeroed");
        rows = p->n, cols = p->m, pitch = p->c_stride[1];
    }
    if (rows == 1) pitch = cols;
    if (pitch < cols) return fail(FX_ERR_INPUT, "K = 0: c's rows overlap");
    for (int64_t l = 0; l < p->l; l++) {
        char *base = (char *)p->c + (size_t)(l * p->c_stride[2]) * es;
        cudaError_t e = cudaMemset2DAsync(base, (size_t)pitch * es, 0, (size_t)cols * es, (size_t)rows, stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail((int32_t)e, "fx_gemm (K = 0): zeroing c: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        }
    }
    return 0;
}

static int32_t gemm_run(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *sc, void *workspace,
                        uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out) {
    gemm_ctx g;
    int32_t rc = gemm_select(dev, p, sc, NULL, out, &g);
    if (rc) return rc;
    if (out->variant < 0) {
        if (p->k != 0) return 0;
        const void *c[1] = {p->m && p->n && p->l ? p->c : NULL};
        const char *cn[1] = {"c"};
        return (rc = check_launch_device(stream, 1, c, cn)) ? rc : gemm_zero(p, stream);
    }
    if (!p->a || !p->b || !p->c) return fail(FX_ERR_INPUT, "fx_gemm needs the a, b and c pointers");
    if (p->ab_dtype == FX_DTYPE_E4M3 && (!p->scale_a || !p->scale_b))
        return fail(FX_ERR_INPUT, "fp8 GEMMs need scale_a and scale_b (device pointers to float32 scales)");
    if ((rc = check_workspace(out->workspace_bytes, workspace, workspace_bytes))) return rc;
    {
        const void *ptrs[6] = {p->a, p->b, p->c, p->scale_a, p->scale_b, out->workspace_bytes ? workspace : NULL};
        static const char *const names[6] = {"a", "b", "c", "scale_a", "scale_b", "workspace"};
        if ((rc = check_launch_device(stream, 6, ptrs, names))) return rc;
    }
    const fx_variant *v = &fx_variants[out->variant];
    if ((rc = ensure_loaded(out->variant))) return rc;
    int32_t n = g.n_vals;
    if (v->workspace) workspace_spec(&g.vals[n++], v, g.M, g.N, g.L, (uintptr_t)workspace);
    if (v->workspace == FX_WORKSPACE_TILES || v->workspace == FX_WORKSPACE_TAIL) { /* the semaphores start at zero */
        cudaError_t e = cudaMemsetAsync(workspace, 0, (size_t)split_sem_words(v, g.M, g.N, g.L) * 4u, stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail((int32_t)e, "fx_gemm: zeroing the split-K semaphores: %s: %s", cudaGetErrorName(e),
                        cudaGetErrorString(e));
        }
    }
    if (v->cluster_ctas) {
        int32_t drv = driver_clusters(out->variant);
        if (drv > 0 && drv < out->max_clusters) out->max_clusters = drv;
        g.vals[n++].i = out->max_clusters;
    }
    return launched(out->variant, v->bind(g.vals, stream));
}

FX_EXPORT int32_t fx_gemm(const fx_device_t *dev, const fx_gemm_problem_t *p, void *workspace, uint64_t workspace_bytes,
                          fx_stream_t stream, fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(gemm_run(dev, p, NULL, workspace, workspace_bytes, stream, out), out);
}

FX_EXPORT int32_t fx_gemm_scaled(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                                 void *workspace, uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    if (!scales) {
        memset(out, 0, sizeof *out);
        out->variant = -1;
        return finish(fail(FX_ERR_INPUT, "fx_gemm_scaled: scales must not be NULL"), out);
    }
    return finish(gemm_run(dev, p, scales, workspace, workspace_bytes, stream, out), out);
}

static int32_t attn_run(const fx_device_t *dev, const fx_attention_problem_t *p, void *workspace,
                        uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out) {
    attn_ctx a;
    int32_t rc = attn_select(dev, p, out, &a, (uintptr_t)workspace);
    if (rc || out->variant < 0) return rc;
    if (!p->q || !p->k || !p->v || !p->o) return fail(FX_ERR_INPUT, "fx_attention needs the q, k, v and o pointers");
    if (p->varlen && (!p->cu_seqlens_q || !p->cu_seqlens_k))
        return fail(FX_ERR_INPUT, "varlen needs both cu_seqlens_q and cu_seqlens_k");
    if ((rc = check_workspace(out->workspace_bytes, workspace, workspace_bytes))) return rc;
    {
        const void *ptrs[8] = {p->q, p->k, p->v, p->o, p->lse, p->varlen ? p->cu_seqlens_q : NULL,
                               p->varlen ? p->cu_seqlens_k : NULL, out->workspace_bytes ? workspace : NULL};
        static const char *const names[8] = {"q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "workspace"};
        if ((rc = check_launch_device(stream, 8, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    if (a.counter_bytes) { /* a dynamic variant's tile counters start at zero (its last CTA leaves them so) */
        cudaError_t e = cudaMemsetAsync((char *)workspace + a.counter_offset, 0, (size_t)a.counter_bytes, stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail((int32_t)e, "fx_attention: zeroing the tile counters: %s: %s", cudaGetErrorName(e),
                        cudaGetErrorString(e));
        }
    }
    return launched(out->variant, fx_variants[out->variant].bind(a.vals, stream));
}

FX_EXPORT int32_t fx_attention(const fx_device_t *dev, const fx_attention_problem_t *p, void *workspace,
                               uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(attn_run(dev, p, workspace, workspace_bytes, stream, out), out);
}

static int32_t packed_run(const fx_device_t *dev, const fx_gemm_packed_problem_t *p, fx_stream_t stream,
                          fx_selection_t *out) {
    packed_ctx x;
    int32_t rc = packed_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    if (!p->a || !p->b_packed || !p->c || !p->scale_a || !p->scale_b)
        return fail(FX_ERR_INPUT, "fx_gemm_packed needs the a, b_packed, c, scale_a and scale_b pointers");
    {
        const void *ptrs[5] = {p->a, p->b_packed, p->c, p->scale_a, p->scale_b};
        static const char *const names[5] = {"a", "b_packed", "c", "scale_a", "scale_b"};
        if ((rc = check_launch_device(stream, 5, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    return launched(out->variant, fx_variants[out->variant].bind(x.vals, stream));
}

FX_EXPORT int32_t fx_gemm_packed(const fx_device_t *dev, const fx_gemm_packed_problem_t *p, fx_stream_t stream,
                                 fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(packed_run(dev, p, stream, out), out);
}

/* Load the chosen variant, append its grid cap (persistent variants: the driver's resident clusters
   where lower than the selection's) to the n launch values, and launch. */
static int32_t launch_chosen(fx_selection_t *out, fx_value *vals, int32_t n, fx_stream_t stream) {
    const fx_variant *v = &fx_variants[out->variant];
    int32_t rc = ensure_loaded(out->variant);
    if (rc) return rc;
    if (v->cluster_ctas) {
        int32_t drv = driver_clusters(out->variant);
        if (drv > 0 && drv < out->max_clusters) out->max_clusters = drv;
        vals[n++].i = out->max_clusters;
    }
    return launched(out->variant, v->bind(vals, stream));
}

static int32_t bs_run(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p, fx_stream_t stream,
                      fx_selection_t *out) {
    bs_ctx x;
    int32_t rc = bs_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    if (!p->a || !p->b || !p->c || !p->a_scale || !p->b_scale)
        return fail(FX_ERR_INPUT, "fx_gemm_blockscaled needs the a, b, c, a_scale and b_scale pointers");
    if (p->format == FX_FORMAT_NVF4 && (!p->a_global || !p->b_global))
        return fail(FX_ERR_INPUT, "nvf4 needs a_global and b_global (one float32 each)");
    {
        const void *ptrs[7] = {p->a, p->b, p->c, p->a_scale, p->b_scale, p->a_global, p->b_global};
        static const char *const names[7] = {"a", "b", "c", "a_scale", "b_scale", "a_global", "b_global"};
        if ((rc = check_launch_device(stream, 7, ptrs, names))) return rc;
    }
    return launch_chosen(out, x.vals, x.n_vals, stream);
}

FX_EXPORT int32_t fx_gemm_blockscaled(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p,
                                      fx_stream_t stream, fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(bs_run(dev, p, stream, out), out);
}

static int32_t grouped_run(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p, fx_stream_t stream,
                           fx_selection_t *out) {
    grouped_ctx x;
    int32_t rc = grouped_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    const int32_t *grp = p->masked ? p->masked_m : p->offs;
    int fp8 = p->ab_dtype == FX_DTYPE_E4M3;
    if (!p->a || !p->b || !p->c || !grp || (fp8 && (!p->scale_a || !p->scale_b)))
        return fail(FX_ERR_INPUT, "fx_gemm_grouped needs the a, b, c, %s%s pointers", p->masked ? "masked_m" : "offs",
                    fp8 ? ", scale_a and scale_b" : "");
    {
        const void *ptrs[6] = {p->a, p->b, p->c, grp, p->scale_a, p->scale_b};
        const char *const names[6] = {"a", "b", "c", p->masked ? "masked_m" : "offs", "scale_a", "scale_b"};
        if ((rc = check_launch_device(stream, fp8 ? 6 : 4, ptrs, names))) return rc;
    }
    return launch_chosen(out, x.vals, x.n_vals, stream);
}

FX_EXPORT int32_t fx_gemm_grouped(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p, fx_stream_t stream,
                                  fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(grouped_run(dev, p, stream, out), out);
}

static int32_t rms_run(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_stream_t stream,
                       fx_selection_t *out) {
    rms_ctx x;
    int32_t rc = rms_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    if (!p->x || !p->weight || !p->y || (p->residual_add && !p->residual) || (p->quantize && !p->scale))
        return fail(FX_ERR_INPUT, "fx_rms_norm needs the x, weight, y (residual_add: residual; quantize: scale) "
                                  "pointers");
    {
        const void *ptrs[5] = {p->x, p->weight, p->y, p->residual_add ? p->residual : NULL,
                               p->quantize ? p->scale : NULL};
        static const char *const names[5] = {"x", "weight", "y", "residual", "scale"};
        if ((rc = check_launch_device(stream, 5, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    return launched(out->variant, fx_variants[out->variant].bind(x.vals, stream));
}

FX_EXPORT int32_t fx_rms_norm(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_stream_t stream,
                              fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(rms_run(dev, p, stream, out), out);
}

static int32_t f8r_run(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_stream_t stream, fx_selection_t *out) {
    f8r_ctx x;
    int32_t rc = f8r_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    if (!p->codes || !p->group_scale || !p->out || !p->scale)
        return fail(FX_ERR_INPUT, "fx_fp8_rows needs the codes, group_scale, out and scale pointers");
    {
        const void *ptrs[4] = {p->codes, p->group_scale, p->out, p->scale};
        static const char *const names[4] = {"codes", "group_scale", "out", "scale"};
        if ((rc = check_launch_device(stream, 4, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    return launched(out->variant, fx_variants[out->variant].bind(x.vals, stream));
}

FX_EXPORT int32_t fx_fp8_rows(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_stream_t stream,
                              fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(f8r_run(dev, p, stream, out), out);
}

static int32_t rope_run(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p, fx_stream_t stream,
                        fx_selection_t *out) {
    rope_ctx x;
    int32_t rc = rope_select(dev, p, out, &x);
    if (rc || out->variant < 0) return rc;
    const int fp8 = p->cache_dtype == FX_DTYPE_E4M3;
    const void *idx = p->table ? (const void *)p->cache_seqlens : (const void *)p->positions;
    const void *tab = p->table ? (const void *)p->block_table : (const void *)p->slot_mapping;
    if ((!p->q && p->heads_q > 0) || !p->k || !p->v || !idx || !tab || !p->cos_sin_cache || !p->k_cache || !p->v_cache ||
        (fp8 && (!p->k_scale || !p->v_scale)))
        return fail(FX_ERR_INPUT, "fx_rope_kvcache needs the q, k, v, %s, %s, cos_sin_cache, k_cache, v_cache%s pointers",
                    p->table ? "cache_seqlens" : "positions", p->table ? "block_table" : "slot_mapping",
                    fp8 ? ", k_scale and v_scale" : "");
    {
        const void *ptrs[10] = {p->q, p->k, p->v, idx, tab, p->cos_sin_cache, p->k_cache, p->v_cache,
                                fp8 ? p->k_scale : NULL, fp8 ? p->v_scale : NULL};
        const char *const names[10] = {"q", "k", "v", p->table ? "cache_seqlens" : "positions",
                                       p->table ? "block_table" : "slot_mapping", "cos_sin_cache", "k_cache", "v_cache",
                                       "k_scale", "v_scale"};
        if ((rc = check_launch_device(stream, 10, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    return launched(out->variant, fx_variants[out->variant].bind(x.vals, stream));
}

FX_EXPORT int32_t fx_rope_kvcache(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p, fx_stream_t stream,
                                  fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(rope_run(dev, p, stream, out), out);
}

static int32_t kv_run(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p, void *workspace,
                      uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out) {
    attn_ctx a;
    int32_t rc = kv_select(dev, p, out, &a, (uintptr_t)workspace);
    if (rc || out->variant < 0) return rc;
    if (!p->q || !p->k_cache || !p->v_cache || !p->o || !p->cache_seqlens || (p->max_pages > 0 && !p->block_table) ||
        (p->varlen_q && !p->cu_seqlens_q))
        return fail(FX_ERR_INPUT, "fx_attention_kvcache needs the q, k_cache, v_cache, o, cache_seqlens (and, paged, "
                                  "block_table; packed q, cu_seqlens_q) pointers");
    if ((rc = check_workspace(out->workspace_bytes, workspace, workspace_bytes))) return rc;
    {
        const void *ptrs[11] = {p->q, p->k_cache, p->v_cache, p->o, p->lse, p->max_pages > 0 ? p->block_table : NULL,
                                p->cache_seqlens, p->sinks, p->kv_descale, p->varlen_q ? p->cu_seqlens_q : NULL,
                                out->workspace_bytes ? workspace : NULL};
        static const char *const names[11] = {"q", "k_cache", "v_cache", "o", "lse", "block_table", "cache_seqlens",
                                              "sinks", "kv_descale", "cu_seqlens_q", "workspace"};
        if ((rc = check_launch_device(stream, 11, ptrs, names))) return rc;
    }
    if ((rc = ensure_loaded(out->variant))) return rc;
    if (a.counter_bytes) { /* the arrival counters start at zero (the kernel leaves them so) */
        cudaError_t e = cudaMemsetAsync((char *)workspace + a.counter_offset, 0, (size_t)a.counter_bytes, stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail((int32_t)e, "fx_attention_kvcache: zeroing the split-KV arrival counters: %s: %s",
                        cudaGetErrorName(e), cudaGetErrorString(e));
        }
    }
    return launched(out->variant, fx_variants[out->variant].bind(a.vals, stream));
}

FX_EXPORT int32_t fx_attention_kvcache(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p,
                                       void *workspace, uint64_t workspace_bytes, fx_stream_t stream,
                                       fx_selection_t *out) {
    fx_selection_t tmp;
    if (!out) out = &tmp;
    return finish(kv_run(dev, p, workspace, workspace_bytes, stream, out), out);
}
