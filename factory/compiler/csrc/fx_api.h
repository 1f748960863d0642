/* ---- Selection: one call per problem (factory/compiler/csrc/fx_select.c) ----------------------
 *
 * fx_gemm / fx_attention / fx_gemm_packed / fx_gemm_blockscaled choose the variant for a problem
 * (the one selection: the Python loader calls these fx_*_select too), from tables generated from
 * this bundle's manifest (and its tuning.json, when `python -m factory link` compiled it in), then
 * launch it through the variant's fx_launch_<name>.  fx_*_select only choose: no GPU, no CUDA call.
 *
 * Sizes and strides are in elements.  Every pointer is a device pointer.  The selection reads only
 * the pointers' alignment (NULL counts as aligned), so a problem without pointers plans for
 * aligned data; fx_gemm / fx_attention need the real ones.
 *
 * Return values: FX_OK (0); a negative FX_ERR_* below; or a positive cudaError_t from loading or
 * launching the variant.  fx_error_string(err) names any of them; fx_last_error_message() says
 * what was wrong with this thread's last failed fx_* call (e.g. which contract a tensor broke). */

#define FX_OK 0
#define FX_ERR_INPUT (-1)      /* bad arguments (Python: InputError); nothing was launched */
#define FX_ERR_NO_VARIANT (-2) /* valid arguments, but no variant of this bundle runs them on this
                                  device (Python: NoVariantError); nothing was launched */
#define FX_ERR_WORKSPACE (-3)  /* the workspace is missing, too small or not 16-byte aligned */

/* A cudaStream_t (the same type; cuda_runtime.h is not needed to include this header). */
typedef struct CUstream_st *fx_stream_t;

typedef enum {
    FX_DTYPE_BF16 = 1,
    FX_DTYPE_F16 = 2,
    FX_DTYPE_F32 = 3,
    FX_DTYPE_E4M3 = 4, /* float8 e4m3fn */
} fx_dtype_t;

/* The device a call is for.  The tuning table compiled into this library applies only where name
   and sm_count equal those it was measured on (as in Python); name "" never matches. */
typedef struct {
    int32_t cc_major, cc_minor; /* compute capability, e.g. 9, 0 */
    int32_t sm_count;           /* multiprocessors, e.g. 132 */
    char name[256];             /* cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3" */
} fx_device_t;

/* Fills *out from cudaGetDeviceProperties(device); returns a cudaError_t. */
int32_t fx_device_query(int32_t device, fx_device_t *out);

/* c (L, M, N) = a (L, M, K) · b (L, N, K)ᵀ, each operand's strides given per mode.
   A row-major (M, K) a has a_stride = {K, 1, 0}; an M-major a (its transpose stored (K, M)
   row-major) has {1, M, 0}.  The batch stride of L = 1 is best given as 0 (what Python passes for
   2-D tensors).  b: {n, k, l} strides; c: {m, n, l} strides (the kernels write N-contiguous c). */
typedef struct {
    fx_dtype_t ab_dtype;    /* a and b: BF16, F16 or E4M3 */
    fx_dtype_t c_dtype;     /* BF16, F16 or F32 (what the bundle's variants write) */
    int64_t m, n, k, l;     /* l: batch count (1 for a plain GEMM) */
    const void *a;
    int64_t a_stride[3];    /* m, k, l */
    const void *b;
    int64_t b_stride[3];    /* n, k, l */
    void *c;
    int64_t c_stride[3];    /* m, n, l */
    const float *scale_a;   /* E4M3 only, and required there: one float32 each (per-tensor scales) */
    const float *scale_b;
    int32_t b_constant;     /* 1: no kernel still running in the stream writes b (weights): a
                               variant may start loading b before the previous kernel ends */
} fx_gemm_problem_t;

/* fp8 scale forms for fx_gemm_scaled / fx_gemm_scaled_select (fx_gemm's fp8 scales are per tensor).
   The problem's scale_a / scale_b point to float32 device memory laid out as:
   FX_SCALE_TENSOR: one element each: c = sa·sb·a·bᵀ.
   FX_SCALE_ROW (torch _scaled_mm row-wise): scale_a (m), scale_b (n), unit stride:
     c[m][n] = sa[m]·sb[n]·Σ_k a[m][k]·b[n][k].
   FX_SCALE_BLOCK (DeepSeek-V3): kb = ceil(k/128), nb = ceil(n/128); scale_a (m, kb) M-major,
     strides {1, s} with s >= m and a multiple of 4, 16-byte aligned (DeepGEMM's TMA-aligned
     layout: s = m rounded up to 4); scale_b (nb, kb)
     strides {s, 1} with s >= kb: c[m][n] = Σ_kb sa[m][kb]·sb[n/128][kb]·Σ_{k in block kb} a[m][k]·b[n][k].
   Row and block scales take l = 1.  Strides are in elements: scale_a_stride / scale_b_stride[0]
   is the stride of the m / n (or nb) mode, [1] of the kb mode (unused by the row form). */
typedef enum { FX_SCALE_TENSOR = 0, FX_SCALE_ROW = 1, FX_SCALE_BLOCK = 2 } fx_scale_mode_t;
typedef struct {
    int32_t mode; /* fx_scale_mode_t */
    int64_t scale_a_stride[2];
    int64_t scale_b_stride[2];
} fx_gemm_scales_t;

/* Fused GEMM epilogues for fx_gemm_epilogue_select: the fp32 product (times the fp8 scales) gets,
   in this order, + bias[n] (FX_EPI_BIAS), then out[:, j] = silu(gate_j)·up_j (FX_EPI_SILU_MUL),
   then + residual[m][j] (FX_EPI_RESIDUAL), and is written in c's dtype.
   The problem's n is b's rows (the product's columns); c has n_out columns: n_out = n, or with
   FX_EPI_SILU_MUL n = 2·ceil(n_out/64)·64, b's rows holding gate and up rows in blocks of 64
   ([gate 0..63; up 0..63; gate 64..127; up 64..127; ...], zero rows past n_out).
   bias: n elements of c's dtype, unit stride (in b's row order).  residual: (m, n_out, l) of c's
   dtype with residual_stride {m, n, l}, the n stride 1; it may be c itself (same pointer and
   strides: an in-place add), else it must not overlap c.
   FX_EPI_FP8_GROUPS (c is E4M3, with neither bias nor residual, l = 1): each row of the result is
   quantised per 128 columns, scale = max(amax / 448, 1 / (448·512)), c = e4m3(x / scale)
   (saturating), the scale written to scale_out[i + g·scale_out_stride] for row i and group g
   (an (m, ceil(n_out/128)) float32 array, M-major: scale_out_stride >= m, a multiple of 4, 16-byte
   aligned -- the form fx_gemm_scaled_select's block scale_a takes for a k of n_out); it must not
   overlap a, b or c. */
typedef enum { FX_EPI_BIAS = 1, FX_EPI_SILU_MUL = 2, FX_EPI_RESIDUAL = 4, FX_EPI_FP8_GROUPS = 8 } fx_gemm_epilogue_flags_t;
typedef struct {
    int32_t flags;          /* fx_gemm_epilogue_flags_t, or'ed */
    int64_t n_out;          /* c's columns */
    const void *bias;
    const void *residual;
    int64_t residual_stride[3];
    float *scale_out;       /* FX_EPI_FP8_GROUPS only */
    int64_t scale_out_stride;
} fx_gemm_epilogue_t;

/* softmax(q·kᵀ·scale [+ bottom-right causal mask])·v.
   Dense: q/o (batch, seqlen_q, heads_q, head_dim), k/v (batch, seqlen_k, heads_kv, head_dim),
   lse float32 (batch, heads_q, seqlen_q).  Varlen (packed sequences): seqlen_q / seqlen_k are the
   total token counts, q/o (seqlen_q, heads_q, head_dim), k/v (seqlen_k, heads_kv, head_dim), lse
   (heads_q, seqlen_q), batch the number of sequences, cu_seqlens_q/k (batch + 1) int32 offsets.
   Strides: [0] batch (dense only), [1] token, [2] head; head_dim is contiguous.
   lse_stride: [0] batch (dense only), [1] head; the token stride is 1. */
typedef struct {
    fx_dtype_t dtype;       /* BF16 or F16: q, k, v and o */
    int32_t varlen;         /* 1: packed sequences (cu_seqlens) */
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim; /* heads_q % heads_kv == 0 */
    const void *q, *k, *v;
    void *o;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    float *lse;             /* NULL: written into the workspace (fx_*_select counts it) */
    int64_t lse_stride[2];
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* varlen: trusted, as FlashAttention trusts them */
    int32_t max_seqlen_q;   /* varlen: >= the longest query sequence */
    int32_t causal;
    float softmax_scale;    /* 0: 1/sqrt(head_dim); else > 0 and finite */
} fx_attention_problem_t;

/* c (M, N) bf16 = a (M, K) e4m3 · bᵀ, b an (N, K) e4m3 weight matrix packed once for the decode
   kernels (runtime/packed.py, "rows8_k64"): b_packed is the (N/8, K/64, 32, 16) byte array whose
   [nb, kc, r, j] ... = b[8 nb + r, 64 kc + j]; M <= the variants' max_m (16). */
typedef struct {
    int64_t m, n, k;
    const void *a;
    int64_t a_stride[2];     /* m, k */
    const void *b_packed;
    int64_t b_stride[4];     /* of the (N/8, K/64, 32, 16) array */
    void *c;                 /* bfloat16 */
    int64_t c_stride[2];     /* m, n */
    const float *scale_a, *scale_b; /* one float32 each; required to launch */
    int32_t b_constant;      /* as fx_gemm_problem_t's */
} fx_gemm_packed_problem_t;

/* Block-scaled formats (runtime/blockscaled.py): MXFP8 (e4m3 or e5m2 elements, an e8m0 scale per
   32) and NVFP4 (e2m1 elements two a byte, an e4m3 scale per 16, a float32 global scale). */
typedef enum {
    FX_FORMAT_MXF8E4M3 = 1,
    FX_FORMAT_MXF8E5M2 = 2,
    FX_FORMAT_NVF4 = 3,
} fx_block_format_t;

/* c (L, M, N) = dequantize(a) (L, M, K) · dequantize(b) (L, N, K)ᵀ.  Strides in elements (NVFP4:
   two elements a byte, so twice the byte strides); a and b K-contiguous.  a_scale / b_scale: the
   scale factors in the sf128x4 layout (factory/abi.py SF_LAYOUT), L x ceil(R/128) x
   ceil(ceil(K/vec)/4) x 512 bytes each. */
typedef struct {
    fx_block_format_t format;
    fx_dtype_t c_dtype;      /* BF16, F16 or F32 (what the bundle's variants write) */
    int64_t m, n, k, l;
    const void *a;
    int64_t a_stride[3];     /* m, k, l */
    const void *b;
    int64_t b_stride[3];     /* n, k, l */
    void *c;
    int64_t c_stride[3];     /* m, n, l */
    const void *a_scale, *b_scale;
    const float *a_global, *b_global; /* NVFP4 only, and required there to launch */
} fx_gemm_blockscaled_problem_t;

/* Attention over a KV cache (FlashAttention's flash_attn_with_kvcache; Python:
   bundle.attention_kvcache, runtime/kvcache.py).  q/o (batch, seqlen_q, heads_q, head_dim), lse
   float32 (batch, heads_q, seqlen_q).  Paged (max_pages > 0): k_cache/v_cache (num_pages,
   page_size, heads_kv, head_dim) with page_size one of 1, 8, 16, 32, 64, 128, 256 and block_table
   (batch, max_pages) int32 page indices; dense (max_pages = 0, block_table NULL): (batch,
   page_size, heads_kv, head_dim), page_size being the cache's rows per sequence (num_pages =
   batch).  Sequence b sees its first cache_seqlens[b] keys (int32 on the device, never read on the
   host: lengths and page indices past the cache are the caller's contract).  Strides: q/o [0]
   batch, [1] token, [2] head; caches [0] page (or batch), [1] row, [2] head; head_dim contiguous.
   Bottom-right causal; window_left/right -1 unbounded; softcap 0 off; sinks: heads_q float32
   logits or NULL.  A window, softcap or sinks selects the build with all three switches, which
   reads sinks: pass -inf logits where the model has none (sinks NULL with a window or softcap is
   FX_ERR_INPUT).  kv_descale: e4m3 caches, required there.
   Packed q (varlen_q 1, chunked prefill of several sequences in one call, FlashAttention's
   cu_seqlens_q): q/o (seqlen_q, heads_q, head_dim) hold every sequence's query tokens back to
   back, seqlen_q being their total; cu_seqlens_q (batch + 1) int32 offsets on the device
   (sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1, bottom-right causal
   against its cache_seqlens[b] keys); max_seqlen_q >= the longest query sequence; q/o strides
   [1] token, [2] head ([0] unused); lse (heads_q, seqlen_q) with lse_stride[1] between heads
   ([0] unused).  The offsets are the caller's contract, as FlashAttention trusts them. */
typedef struct {
    fx_dtype_t dtype;       /* q and o: BF16 or F16 */
    fx_dtype_t kv_dtype;    /* the caches: dtype or E4M3 */
    int64_t batch, seqlen_q, heads_q, heads_kv, head_dim;
    int64_t num_pages, page_size, max_pages;
    const void *q;
    int64_t q_stride[3];
    const void *k_cache, *v_cache;
    int64_t k_stride[3], v_stride[3];
    void *o;
    int64_t o_stride[3];
    float *lse;             /* NULL: written into the workspace */
    int64_t lse_stride[2];
    const int32_t *block_table;
    int64_t block_table_stride; /* elements between rows */
    const int32_t *cache_seqlens;
    const float *sinks;
    const float *kv_descale; /* (2, heads_kv) float32: row 0 k, row 1 v; e4m3 caches only, required there */
    int32_t causal;
    int32_t window_left, window_right;
    float softcap;
    float softmax_scale;    /* 0: 1/sqrt(head_dim); else > 0 and finite */
    int32_t varlen_q;       /* 1: packed q (cu_seqlens_q; seqlen_q = query tokens) */
    int32_t max_seqlen_q;   /* varlen_q: >= the longest query sequence */
    const int32_t *cu_seqlens_q; /* varlen_q: (batch + 1) int32 offsets */
} fx_attention_kvcache_problem_t;

/* Grouped GEMM for mixture-of-experts layers (Python: bundle.grouped_gemm, runtime/grouped.py):
   the rows of group g times the transpose of b[g], b (groups, N, K) K-contiguous, b_stride {n, k, group}.
   Contiguous (masked 0): a (M, K) holds the rows sorted by group, offs (groups,) int32 the
   cumulative end rows (group g owns rows offs[g-1] .. offs[g]-1, offs[-1] = 0), c (M, N).
   Masked (masked 1): a (groups, M, K), masked_m (groups,) int32 row counts (group g owns its first
   masked_m[g] rows), c (groups, M, N); rows past a group's count are not written.
   offs / masked_m live on the device and are never read on the host; rows past M (or past
   max(offs)) are neither read nor written.  groups <= 1024; K > 0.  a_stride {m, k, group},
   c_stride {m, n, group} (the group strides unused when contiguous).  expected_m: the rows per
   group the choice plans for (0: M / groups when contiguous, M when masked).
   fp8 (ab_dtype E4M3, c_dtype BF16) takes float32 scales, scale_mode FX_SCALE_ROW or FX_SCALE_BLOCK
   (FX_SCALE_TENSOR = 0: no scales, bf16/f16); kb = ceil(k/128), nb = ceil(n/128), strides in
   elements, scale_a_stride {m, kb, group}, scale_b_stride {n or nb, kb, group}:
   - row: scale_a one per row of a (contiguous (m,), masked (groups, m)), unit stride along m;
     scale_b (groups, n), unit stride along n: c = sa[row]·sb[g][col]·Σ_k a·b.
   - block (DeepSeek-V3): scale_a one per row and k-block, M-major: contiguous (m, kb), masked
     (groups, m, kb), stride 1 along m, the kb and group strides multiples of 4 (16-byte rows, read
     by TMA), the kb stride >= m, data 16-byte aligned; scale_b (groups, nb, kb) K-contiguous:
     c = Σ_kb sa[row][kb]·sb[g][col/128][kb]·Σ_{k in block kb} a·b. */
typedef struct {
    fx_dtype_t ab_dtype;     /* a and b: BF16, F16 or E4M3 */
    fx_dtype_t c_dtype;      /* BF16 */
    int32_t masked;
    int64_t m, n, k, groups;
    const void *a;
    int64_t a_stride[3];
    const void *b;
    int64_t b_stride[3];
    void *c;
    int64_t c_stride[3];
    const int32_t *offs;     /* contiguous */
    const int32_t *masked_m; /* masked */
    int64_t expected_m;
    int32_t scale_mode;      /* fx_scale_mode_t: TENSOR (none) for bf16/f16, ROW or BLOCK for e4m3 */
    const float *scale_a;
    int64_t scale_a_stride[3];
    const float *scale_b;
    int64_t scale_b_stride[3];
} fx_gemm_grouped_problem_t;

/* fp8 (e4m3) attention forward (Python: bundle.attention with float8_e4m3fn q/k/v,
   runtime/attention_fp8.py): q (batch, seqlen_q, heads_q, head_dim), k (batch, seqlen_k, heads_kv,
   head_dim) e4m3; v e4m3 as k (v_layout 0) or pre-transposed (batch, heads_kv, head_dim,
   seqlen_k) (v_layout 1); o bfloat16 as q; lse float32 (batch, heads_q, seqlen_q); q/k/v descales
   float32 (batch, heads_kv), any strides.  Selection only (the launch goes through the Python
   runtime): the chosen variant takes v in its own layout (fx_variant_v_layout): v_layout 0 may
   get a variant that takes v pre-transposed where the bundle has no in-kernel transpose for the
   problem. */
typedef struct {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t v_layout;       /* 0: v as k; 1: v pre-transposed */
    int32_t causal;
    float softmax_scale;    /* 0: 1/sqrt(head_dim); else > 0 and finite */
    int32_t varlen;         /* 1: packed sequences (cu_seqlens; batch = sequences, seqlen_q/k = tokens) */
} fx_attention_fp8_problem_t;

/* RMSNorm over each row (runtime/fused.py rms_norm): y = x / sqrt(mean(x²) + eps) · weight, float32
   arithmetic.  residual_add: first residual += x in place (rounded to dtype), and the norm is of
   that sum (vLLM's fused_add_rms_norm).  quantize: y is e4m3 and scale[row] (float32, unit stride)
   receives max(amax(|y|) / 448, 1/(448·512)) of the row's y rounded to dtype, y holding y / scale.
   Rows are contiguous along n; the *_stride fields are row strides in elements (>= n).  Outputs
   (y, scale, and residual when added) must not overlap each other or the inputs. */
typedef struct {
    fx_dtype_t dtype;       /* x, weight, residual: BF16 or F16 */
    int64_t m, n;           /* rows; the hidden size, a positive multiple of 8 */
    const void *x;
    int64_t x_stride;
    const void *weight;     /* (n,), contiguous */
    int32_t residual_add;   /* 0 / 1 */
    void *residual;
    int64_t residual_stride;
    int32_t quantize;       /* 0: y in dtype; 1: y e4m3 with per-row scales */
    void *y;
    int64_t y_stride;
    float *scale;           /* quantize: (m,) float32 */
    float eps;              /* finite, >= 0 */
} fx_rms_norm_problem_t;

/* e4m3 codes with a scale per row and 128 columns re-expressed with one scale per row
   (runtime/fused.py fp8_rows; the GEMM's fp8_groups output feeds it): scale[r] = max(max_g
   group_scale[r][g], 1/(448·512)), out[r][c] = e4m3(codes[r][c] · group_scale[r][c / 128] / scale[r]).
   codes / out rows contiguous, row strides >= n and multiples of 16; group_scale (m, ceil(n/128))
   M-major: element [r][g] at r + g · group_scale_stride (>= m).  out may be codes itself (same
   pointer and stride: in place); otherwise outputs must not overlap each other or the inputs. */
typedef struct {
    int64_t m, n;            /* rows; row length, a positive multiple of 16 */
    const void *codes;
    int64_t codes_stride;
    const float *group_scale;
    int64_t group_scale_stride;
    void *out;
    int64_t out_stride;
    float *scale;            /* (m,) float32 */
} fx_fp8_rows_problem_t;

/* Rotary embedding of q and k in place and the write of the new k (rotated) and v into a paged KV
   cache (runtime/fused.py rope_kvcache): per token t at position pos, the first rotary_dim columns
   of each head rotated by cos_sin_cache[pos] (rotary_dim/2 cosines then sines, float32; positions
   past the table read its last row); neox: element i pairs with i + rotary_dim/2, else 2j with 2j+1.
   Slot form (table 0): pos = positions[t], the cache row slot_mapping[t] (page slot / page_size, row
   slot % page_size; a slot outside the cache writes nothing).  Table form (table 1): tokens = batch ·
   seqlen_q, token (b, s) at pos = cache_seqlens[b] + s, page block_table[b][pos / page_size].
   E4M3 caches receive e4m3(x / scale[h]) (k_scale / v_scale: heads_kv floats, stride 0 for one per
   tensor).  head_dim contiguous everywhere; q, k, v may be slices of one qkv tensor; the caches must
   not overlap each other or any input. */
typedef struct {
    fx_dtype_t dtype;          /* q, k, v: BF16 or F16 */
    fx_dtype_t cache_dtype;    /* dtype, or E4M3 */
    int32_t neox, table;       /* 0 / 1 each */
    int64_t tokens, heads_q, heads_kv, head_dim, rotary_dim, max_position, num_pages, page_size;
    int64_t batch, max_pages;  /* table form */
    void *q;                   /* may be NULL with heads_q 0 (k only) */
    int64_t q_stride[2];       /* token, head */
    void *k;
    int64_t k_stride[2];
    const void *v;
    int64_t v_stride[2];
    const int64_t *positions;     /* slot form: (tokens,) */
    const int64_t *slot_mapping;  /* slot form: (tokens,) */
    const int32_t *cache_seqlens; /* table form: (batch,) */
    const int32_t *block_table;   /* table form: (batch, max_pages) */
    int64_t block_table_stride;
    const float *cos_sin_cache;   /* (max_position, rotary_dim) */
    int64_t cos_sin_stride;
    void *k_cache;
    int64_t k_cache_stride[3];    /* page, row, head */
    void *v_cache;
    int64_t v_cache_stride[3];
    const float *k_scale;         /* E4M3 caches */
    int64_t k_scale_stride;
    const float *v_scale;
    int64_t v_scale_stride;
} fx_rope_kvcache_problem_t;

typedef struct {
    int32_t variant;          /* index (fx_variant_name); -1: nothing to launch (an empty problem) */
    const char *name;         /* the variant's name, NULL for -1 */
    uint64_t workspace_bytes; /* device memory the launch needs (split-K / split-KV partials, lse
                                 scratch); 0: none */
    int32_t max_clusters;     /* persistent GEMM variants: the grid cap without the driver,
                                 max(1, sm_count / cluster CTAs); fx_gemm lowers it to what
                                 cudaOccupancyMaxActiveClusters says fits.  0 otherwise */
    int32_t splits;           /* attention: KV splits (1: none); GEMM: split-K */
} fx_selection_t;

int32_t fx_gemm_select(const fx_device_t *dev, const fx_gemm_problem_t *p, fx_selection_t *out);
int32_t fx_attention_select(const fx_device_t *dev, const fx_attention_problem_t *p, fx_selection_t *out);
int32_t fx_attention_kvcache_select(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p,
                                    fx_selection_t *out);
/* fx_gemm_select / fx_gemm_scaled_select (scales may be NULL: per-tensor) of a GEMM with a fused
   epilogue (ep must not be NULL); only variants built with exactly those epilogue flags qualify. */
int32_t fx_gemm_epilogue_select(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                                const fx_gemm_epilogue_t *ep, fx_selection_t *out);
int32_t fx_gemm_scaled_select(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                              fx_selection_t *out);
int32_t fx_attention_fp8_select(const fx_device_t *dev, const fx_attention_fp8_problem_t *p, fx_selection_t *out);
/* The v layout variant `variant` takes (fp8 attention: 0 as k, 1 pre-transposed; -1: no such variant). */
int32_t fx_variant_v_layout(int32_t variant);
int32_t fx_gemm_packed_select(const fx_device_t *dev, const fx_gemm_packed_problem_t *p, fx_selection_t *out);
int32_t fx_gemm_blockscaled_select(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p,
                                   fx_selection_t *out);
int32_t fx_gemm_grouped_select(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p, fx_selection_t *out);
int32_t fx_rms_norm_select(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_selection_t *out);
int32_t fx_fp8_rows_select(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_selection_t *out);
int32_t fx_rope_kvcache_select(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p, fx_selection_t *out);

/* Select, then launch on `stream` (loading the variant's module on first use: do one call before
   capturing a CUDA graph).  The launch runs on the current device (cudaSetDevice): `stream` must
   be one of its streams and every pointer device (or managed) memory of it, else FX_ERR_INPUT
   and nothing is launched.  workspace: at least fx_*_select's workspace_bytes, 16-byte aligned,
   valid until the kernels have run (NULL with 0 when none is needed); launches that may run at the
   same time (other streams) need workspaces of their own (a GEMM split over the grid keeps
   semaphores there, which fx_gemm zeroes with cudaMemsetAsync on `stream` before its kernel; an
   attention_kvcache split whose last split merges the others keeps its arrival counters there,
   which fx_attention_kvcache zeroes likewise, as fx_attention does for the tile counters of a
   dynamic-schedule attention variant).
   Empty problems launch nothing (fx_gemm with K = 0 zeroes c with cudaMemset2DAsync).  *out (may
   be NULL) receives the selection. */
int32_t fx_gemm(const fx_device_t *dev, const fx_gemm_problem_t *p, void *workspace,
                uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out);
int32_t fx_gemm_scaled(const fx_device_t *dev, const fx_gemm_problem_t *p, const fx_gemm_scales_t *scales,
                       void *workspace, uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out);
int32_t fx_attention(const fx_device_t *dev, const fx_attention_problem_t *p, void *workspace,
                     uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out);
int32_t fx_attention_kvcache(const fx_device_t *dev, const fx_attention_kvcache_problem_t *p, void *workspace,
                             uint64_t workspace_bytes, fx_stream_t stream, fx_selection_t *out);
int32_t fx_gemm_packed(const fx_device_t *dev, const fx_gemm_packed_problem_t *p, fx_stream_t stream,
                       fx_selection_t *out);
int32_t fx_gemm_blockscaled(const fx_device_t *dev, const fx_gemm_blockscaled_problem_t *p, fx_stream_t stream,
                            fx_selection_t *out);
int32_t fx_gemm_grouped(const fx_device_t *dev, const fx_gemm_grouped_problem_t *p, fx_stream_t stream,
                        fx_selection_t *out);
int32_t fx_rms_norm(const fx_device_t *dev, const fx_rms_norm_problem_t *p, fx_stream_t stream, fx_selection_t *out);
int32_t fx_fp8_rows(const fx_device_t *dev, const fx_fp8_rows_problem_t *p, fx_stream_t stream, fx_selection_t *out);
int32_t fx_rope_kvcache(const fx_device_t *dev, const fx_rope_kvcache_problem_t *p, fx_stream_t stream,
                        fx_selection_t *out);

/* The GEMM cost model's predicted time (us) of a variant (index) on an (m, n, k, l) problem: the
   sm90 and sm100 families' models the selection ranks by. */
int32_t fx_gemm_estimate_us(const fx_device_t *dev, int32_t variant, int64_t m, int64_t n, int64_t k, int64_t l,
                            double *us);
/* For fitting tools only: replace the cost models' constants (NULL: the compiled-in ones). */
int32_t fx_cost_model_set(const double *sm90, int32_t n90, const double *sm100, int32_t n100);

/* The reason of this thread's last failed fx_* call ("" if none). */
const char *fx_last_error_message(void);
int32_t fx_variant_count(void);
const char *fx_variant_name(int32_t variant); /* NULL out of range */
/* What the selection tables hold: variant counts and the tuning table's device, one line. */
const char *fx_selection_info(void);
