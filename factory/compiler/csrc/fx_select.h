/* The selection tables that factory/compiler/selection.py generates into fx_glue.c, as
 * fx_select.c reads them.  Internal to the host library (not installed in include/). */
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>

#define FX_MAX_RANK 6
#define FX_MAX_SYMS 64
#define FX_MAX_ARGS 20
#define FX_MAX_DEVICES 64

enum { FX_OP_GEMM = 1, FX_OP_ATTENTION = 2, FX_OP_GEMM_BLOCKSCALED = 3, FX_OP_ATTENTION_KVCACHE = 4,
       FX_OP_ATTENTION_FP8 = 5, FX_OP_GEMM_GROUPED = 9, FX_OP_RMS_NORM = 11,
       FX_OP_FP8_ROWS = 12, FX_OP_ROPE_KVCACHE = 13 };
enum { FX_FAMILY_OTHER = 0, FX_FAMILY_SM80 = 1, FX_FAMILY_SM90 = 2, FX_FAMILY_SM100 = 3, FX_FAMILY_DECODE = 4,
       FX_FAMILY_SM90_DECODE = 5, FX_FAMILY_SM90_GROUPED = 9,
       FX_FAMILY_SM100_GROUPED = 10 };
enum { FX_MAJOR_K = 1, FX_MAJOR_M = 2, FX_MAJOR_N = 3 }; /* 0: anything else */
enum { FX_ACC_DEFAULT = 0, FX_ACC_PROMOTED = 1, FX_ACC_FAST = 2 };

/* One mode of a tensor argument: a symbol of the variant (sym >= 0: a size known at launch), or a
   size fixed at compile time (sym < 0). */
typedef struct {
    int32_t sym;
    int64_t value;
} fx_dim;

/* One argument of the variant's signature (factory/abi.py). */
typedef struct {
    const char *name;
    int32_t scalar;  /* 1: a number (f32 or i32); 0: a tensor */
    int32_t rank;
    int32_t shape32; /* the header's struct holds 32-bit sizes */
    int32_t align;   /* bytes the data pointer must be aligned to */
    const fx_dim *shape, *stride;
} fx_arg;

/* A tensor as the contract sees it: data pointer, shape and strides (elements). */
typedef struct {
    uintptr_t ptr;
    int32_t rank;
    int64_t shape[FX_MAX_RANK];
    int64_t stride[FX_MAX_RANK];
} fx_spec;

/* One launch argument: a tensor spec, or a scalar (f for f32, i for i32). */
typedef struct {
    fx_spec t;
    float f;
    int32_t i;
} fx_value;

/* What the selection reads of one manifest entry (fields absent there hold the defaults that
   factory/runtime uses: split_k 1, cluster 1x1, swizzle 1, splits 1, ...). */
typedef struct {
    const char *name;
    int32_t op, family, target; /* target: index into fx_targets */
    /* GEMM */
    int32_t ab, c, a_major, b_major; /* fx_dtype_t / FX_MAJOR_*; -1 / 0 for a name C does not know */
    int32_t tile[3];                 /* attention: tile_m, tile_n, 0 */
    int32_t cluster[2];
    int32_t split_k, threads, swizzle;
    int32_t swizzle_exact;   /* 1: the swizzle's last group of clusters along N is not padded */
    int32_t persistent_ctas; /* a grid fixed at build time (older bundles); 0: none */
    int32_t cluster_ctas;    /* persistent: CTAs per launched cluster (max_clusters); 0: not persistent */
    int32_t swap_ab, sched_pp, deep, early_b, fp8_acc, workspace;
    int32_t twin;            /* the early_b twin's index; its own index when it has none */
    double peak_tflops;      /* of its a dtype (tuning._PEAK_TFLOPS) */
    int32_t a_bytes, c_bytes; /* bytes per element (tuning._BYTES) */
    /* attention */
    int32_t dtype, head_dim, causal, varlen, pack_gqa, preferred, splits, stages, min_seqlen_q;
    int32_t ctas_per_sm;     /* 0: the entry does not state it */
    int32_t decode_rows, kv_splits, pdl; /* decode family (attention/decode.py): rows per CTA, key splits, PDL; 0: other */
    /* attention_kvcache (runtime/kvcache.py): cache dtype, paged, the page sizes taken (bit i:
       2^i rows), the window / softcap / sink switches */
    int32_t kv_dtype, paged, page_size_mask, local, softcap, sinks;
    /* the contract (loader.Binder.check) */
    int32_t n_args;
    const fx_arg *args;
    int32_t n_syms;
    const int64_t *divisors;
    /* launch */
    int32_t (*load)(void);
    int32_t (*bind)(const fx_value *values, cudaStream_t stream);
    cudaLibrary_t *module;
    const char *kernel;      /* persistent: the kernel the occupancy query asks about */
    int32_t smem_bytes;      /* its dynamic shared memory */
    /* the Blackwell cost model (runtime/cost_sm100.py): MMA tile rows, CTAs per MMA, tensor FLOPs
       per clock per SM of its a dtype */
    int32_t mma_m, cta_group;
    double flops_per_clk;
    /* the packed-weight decode family (gemm/decode.py): largest M, weight rows per CTA */
    int32_t max_m, rows_per_cta;
    /* block-scaled GEMM: its format (fx_block_format_t; 0: none) */
    int32_t format;
    /* grouped GEMM (runtime/grouped.py): 1 contiguous, 2 masked; 0: other ops */
    int32_t grouped;
    /* GEMM epilogue fields (fx_gemm_epilogue_flags_t): bias, silu_mul, residual; 0: none */
    int32_t epilogue;
    /* fp8 attention (attention/sm90_fp8.py): 1 takes v pre-transposed (batch, heads_kv,
       head_dim, seqlen_k), 0 takes v as k (the kernel transposes it) */
    int32_t v_pretransposed;
    /* row-wise ops (elementwise/): the longest row a variant takes; FX_RW_* flags */
    int32_t max_n, rowwise;
    /* attention (manifest tile_scheduler): 0 one tile per CTA, 1 persistent CTAs, 2 persistent
       with O leaving through Q's smem slabs (the next tile's Q waits for the O store) */
    int32_t attn_sched;
} fx_variant;
/* rms_norm: residual add, e4m3 output with row scales; rope_kvcache: neox, block-table form, e4m3 caches */
enum { FX_RW_RESIDUAL = 1, FX_RW_QUANT = 2, FX_RW_NEOX = 4, FX_RW_TABLE = 8, FX_RW_FP8_CACHE = 16 };

#define FX_MAX_TARGET_CCS 8

/* A target (atoms/targets.py Target): its capability, specificity (2 arch-specific, 1
   family-specific, 0 plain) and the compute capabilities its cubins run on (ccs, n_ccs > 0 for
   arch- and family-specific targets; plain ones run on every minor >= theirs of their major). */
typedef struct {
    const char *name;
    int32_t major, minor, specificity;
    int32_t n_ccs;
    int32_t ccs[FX_MAX_TARGET_CCS][2];
} fx_target;

/* A tuning.json bucket: its key (tuning.bucket_key / attention_bucket_key) and winners (-1:
   none). Sorted by key. */
typedef struct {
    const char *key;
    int32_t winner, b_constant;
    int32_t packed, packed_b_constant; /* decode buckets: the winners on packed weights */
} fx_bucket;

/* tuning.MODEL and the constants estimate_us uses beside it. */
typedef struct {
    double eff_256x128_c1x2, eff_128x256_c2x1, eff_large, eff_pp, eff_coop_mc, eff_coop, eff_small;
    double eff_swap_base, eff_swap_slope, fp8_promoted, fp8_fast;
    double split_us, fixed_us, overlap, grid_bw_exp, split_tile_exp, narrow_exp, tile_us;
    double deep_bw, wide_k_bw, eff_coop_narrow, wsplit_us, tail_us;
    double eff_pp_fp8, tail_us_fp8;
    double stream_tbs;
    int64_t l2_bytes;
} fx_model;

/* runtime/cost_sm100.py: MODEL, then the published B200 figures it uses. */
typedef struct {
    double smem_bytes_per_clk, rate_m64, issue_overlap, hbm_eff, latency_us, l2_tbs, mem_overlap, fixed_us,
        wave_us;
    double clock_ghz, hbm_tbs;
    int64_t l2_bytes;
} fx_model_sm100;

/* Per variant, written at run time: loaded (0/1) and the driver's resident clusters per device
   (0: not asked yet, -1: no answer). */
typedef struct {
    int32_t loaded;
    int32_t clusters[FX_MAX_DEVICES];
} fx_state;

extern const fx_variant fx_variants[];
extern const int32_t fx_n_variants;
extern fx_state fx_states[];
extern const fx_target fx_targets[];
extern const int32_t fx_n_targets;
extern const fx_bucket fx_buckets[];
extern const int32_t fx_n_buckets;
extern const char fx_tuning_device[]; /* "" when no tuning table was compiled in */
extern const int32_t fx_tuning_sm_count;
extern const fx_model fx_model_constants;
extern const fx_model_sm100 fx_model_sm100_constants;
extern const int32_t fx_known_ccs[][2]; /* atoms/targets.py KNOWN_CAPABILITIES */
extern const int32_t fx_n_known_ccs;
extern const int32_t fx_attention_head_dims[];
extern const int32_t fx_n_attention_head_dims;
extern const int64_t fx_attention_grid_yz_max;
extern const char fx_selection_summary[];

/* For the glue (fx_glue.c), in fx_select.c: set this thread's fx_last_error_message, return code. */
int32_t fx_record_error(int32_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 when the CUDA driver answers and sees a device; else its cudaError_t (cudaErrorNoDevice for
   none), with a message naming `what` and the reason. */
int32_t fx_require_device(const char *what);
