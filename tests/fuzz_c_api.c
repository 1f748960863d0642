/* Fuzzes the host library's C structs: fx_gemm(_select), fx_attention(_select), fx_device_query,
 * fx_error_string, fx_variant_name with random and hand-made problems, built with the sanitizers
 * (tests/test_fuzz.py compiles it with the bundle's own C sources).  Run on a machine without a
 * usable CUDA device: no call can do GPU work, so a call that returns FX_OK must have had nothing
 * to do.
 *
 * usage: fuzz_c_api SEED ITERATIONS   (the hand-made cases run first, then ITERATIONS random ones)
 * Writes nothing to stdout.  On stderr: each broken invariant (the first few of each), then one
 * JSON line {"iterations": n, "calls": n, "violations": {invariant: count, ...}}; exit status 0.
 * AddressSanitizer aborts the process at the first memory error; UndefinedBehaviorSanitizer
 * reports each place once ("runtime error:" on stderr; the test counts them) and goes on. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_bundle.h"

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static int64_t pick(const int64_t *v, int n) { return v[rnd() % (uint64_t)n]; }
#define PICK(arr) pick(arr, (int)(sizeof arr / sizeof arr[0]))
static int isalnum_ascii(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int chance(int percent) { return (int)(rnd() % 100) < percent; }

static const int64_t EDGE[] = {0, 1, -1, 2, 3, 7, 8, 9, 16, 64, 127, 128, 129, 256, 1000, 1024, 4096, 65535, 65536,
                               2147483647LL, 2147483648LL, 2147483649LL, 4294967296LL, 4294967297LL,
                               (int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX, INT64_MAX - 7, INT64_MIN, INT64_MIN + 8,
                               -2147483648LL, -8};
static const int64_t SMALL[] = {1, 8, 16, 24, 64, 72, 128, 136, 256, 512, 1000, 1024, 4096};
static const int64_t HEAD_DIMS[] = {64, 128, 256, 96, 0, -64, 32};
static const int64_t DTYPES[] = {FX_DTYPE_BF16, FX_DTYPE_F16, FX_DTYPE_F32, FX_DTYPE_E4M3, 0, -1, 5, 1000,
                                 INT32_MIN};
static const int64_t BOOLS[] = {0, 1, 0, 1, 2, -1, 255, INT32_MIN};
static const int64_t CCS[][2] = {{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {10, 3}, {12, 0}, {12, 1},
                                 {7, 5}, {0, 0}, {-1, 0}, {9, -1}, {1000, 0}, {INT32_MAX, INT32_MAX}, {INT32_MIN, 0}};
static const int64_t SMS[] = {132, 114, 148, 1, 0, -1, INT32_MAX, INT32_MIN};

/* a * b wrapping (the fuzzer's own arithmetic must not overflow; the sizes it builds may) */
static int64_t mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static int64_t dim(void) { return chance(80) ? PICK(SMALL) : PICK(EDGE); }
static int64_t any64(void) { return chance(50) ? PICK(EDGE) : (int64_t)rnd(); }

/* A device pointer that is never dereferenced (no device): aligned, misaligned, NULL or wild. */
static void *ptr(void) {
    static const uint64_t P[] = {0, 1u << 20, (1u << 20) + 16, (1u << 20) + 1, (1u << 20) + 2, (1u << 20) + 8,
                                 UINT64_MAX - 15, UINT64_MAX, 1ull << 47};
    return (void *)(uintptr_t)(chance(85) ? P[1 + rnd() % 2] : P[rnd() % (sizeof P / sizeof P[0])]);
}

/* ---- invariants ------------------------------------------------------------------------------- */
enum { INV_OK_WITHOUT_WORK, INV_BAD_CODE, INV_SELECTION, INV_EMPTY_MESSAGE, INV_NO_FIELD, INV_STALE_MESSAGE,
       INV_BOOL, INV_SM_COUNT, INV_MAX_SEQLEN, INV_CC, INV_COUNT };
static const char *INV_NAMES[INV_COUNT] = {
    "success_without_work", "unknown_return_code", "selection_inconsistent", "input_error_without_message",
    "message_names_no_field", "message_not_cleared_on_success", "boolean_not_0_or_1_accepted",
    "sm_count_not_positive_accepted", "negative_max_seqlen_accepted", "impossible_capability_accepted"};
static long violations[INV_COUNT];
static long calls;

static void violate(int inv, const char *call, int32_t rc, const char *what) {
    if (violations[inv]++ < (getenv("FUZZ_VERBOSE") ? 100000 : 3))
        fprintf(stderr, "VIOLATION %s: %s rc=%d message=\"%s\" (%s)\n", INV_NAMES[inv], call, rc,
                fx_last_error_message(), what);
}

/* Whether `msg` names one of `fields` (a word of identifier characters equal to one); the
   operand "a", also an English word, counts only as a message's subject (first, or after ": "). */
static int names_field(const char *msg, const char *const *fields) {
    char word[64];
    const char *s = msg;
    while (*s) {
        while (*s && !(isalnum_ascii(*s) || *s == '_')) s++;
        if (s[0] == 'a' && !isalnum_ascii(s[1]) && s[1] != '_' && (s == msg || (s - msg >= 2 && s[-2] == ':')))
            return 1;
        int n = 0;
        while (*s && (isalnum_ascii(*s) || *s == '_')) {
            if (n < 63) word[n++] = *s;
            s++;
        }
        word[n] = 0;
        for (int i = 0; n && fields[i]; i++)
            if (!strcmp(word, fields[i])) return 1;
    }
    return 0;
}

static const char *const GEMM_FIELDS[] = {
    "dev", "fx_device_t", "problem", "cc_major", "cc_minor", "sm_count", "name", "ab_dtype", "c_dtype", "m", "n", "k", "l", "M", "N",
    "K", "L", "a_stride", "b", "b_stride", "c", "c_stride", "scale_a", "scale_b", "b_constant", "workspace",
    "workspace_bytes", "dtype", "mA", "mB", "mC", "out", NULL};
static const char *const ATTN_FIELDS[] = {
    "dev", "fx_device_t", "problem", "cc_major", "cc_minor", "sm_count", "name", "dtype", "varlen", "batch", "seqlen_q", "seqlen_k",
    "heads_q", "heads_kv", "head_dim", "q", "k", "v", "o", "q_stride", "k_stride", "v_stride", "o_stride", "lse",
    "lse_stride", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "causal", "softmax_scale", "workspace",
    "workspace_bytes", "heads", "out", NULL};

/* The checks every call gets; `empty`: the problem asks for no work; `select`: a select call. */
static void check(const char *call, int32_t rc, const fx_selection_t *sel, int empty, int select,
                  const char *const *fields) {
    calls++;
    const char *msg = fx_last_error_message();
    if (!(rc == FX_OK || rc == FX_ERR_INPUT || rc == FX_ERR_NO_VARIANT || rc == FX_ERR_WORKSPACE ||
          (rc > 0 && rc < 10000)))
        violate(INV_BAD_CODE, call, rc, "not FX_OK, an FX_ERR_* or a cudaError_t");
    if (rc == FX_OK && !select && !empty) violate(INV_OK_WITHOUT_WORK, call, rc, "no device, yet FX_OK");
    if (rc == FX_OK && sel) {
        if (sel->variant >= 0 && (sel->variant >= fx_variant_count() || !sel->name ||
                                  strcmp(sel->name, fx_variant_name(sel->variant))))
            violate(INV_SELECTION, call, rc, "variant index and name disagree");
        if (sel->variant < 0 && !empty) violate(INV_OK_WITHOUT_WORK, call, rc, "work asked, nothing selected");
    }
    if (rc == FX_OK && msg[0]) violate(INV_STALE_MESSAGE, call, rc, "FX_OK, an error message left");
    if (rc == FX_ERR_INPUT && !msg[0]) violate(INV_EMPTY_MESSAGE, call, rc, "FX_ERR_INPUT without a message");
    if (rc == FX_ERR_INPUT && msg[0] && !names_field(msg, fields)) violate(INV_NO_FIELD, call, rc, "");
}

/* An argument no valid call has (a boolean of 2, sm_count 0, ...) must give FX_ERR_INPUT: never a
   selection that read it some way.  (Which field the message names is for check(): the call may
   have stopped at another bad field first.) */
static void must_refuse(int inv, const char *call, int32_t rc, const char *field) {
    if (rc != FX_ERR_INPUT) violate(inv, call, rc, field);
}

/* ---- problems --------------------------------------------------------------------------------- */
static fx_device_t *device(void) {
    fx_device_t *d = malloc(sizeof *d); /* exactly its size: reading past it is caught */
    int i = (int)(rnd() % (sizeof CCS / sizeof CCS[0]));
    if (chance(70)) i = 3 + (int)(rnd() % 4);
    d->cc_major = (int32_t)CCS[i][0], d->cc_minor = (int32_t)CCS[i][1];
    d->sm_count = (int32_t)(chance(85) ? 132 : PICK(SMS));
    memset(d->name, 0, sizeof d->name);
    if (chance(10)) memset(d->name, 'H', sizeof d->name); /* no terminating NUL */
    else if (chance(50)) snprintf(d->name, sizeof d->name, "NVIDIA H100 80GB HBM3");
    return d;
}

static void strides(int64_t *s, int64_t rows, int64_t cols, int64_t batch, int row_major) {
    s[0] = row_major ? cols : 1, s[1] = row_major ? 1 : rows, s[2] = batch > 1 ? mul(rows, cols) : 0;
    if (chance(10)) s[rnd() % 3] = any64();
}

static fx_gemm_problem_t *gemm_problem(void) {
    fx_gemm_problem_t *p = malloc(sizeof *p);
    memset(p, 0, sizeof *p);
    p->ab_dtype = (fx_dtype_t)(chance(90) ? (int64_t)(rnd() % 2) + 1 : PICK(DTYPES));
    if (chance(15)) p->ab_dtype = FX_DTYPE_E4M3;
    p->c_dtype = (fx_dtype_t)(chance(90) ? FX_DTYPE_BF16 : PICK(DTYPES));
    p->m = dim(), p->n = dim(), p->k = dim(), p->l = chance(80) ? 1 : dim();
    if (chance(5)) p->m = 0;
    if (chance(5)) p->k = 0;
    p->a = ptr(), p->b = ptr(), p->c = ptr();
    strides(p->a_stride, p->m, p->k, p->l, chance(90));
    strides(p->b_stride, p->n, p->k, p->l, chance(90));
    strides(p->c_stride, p->m, p->n, p->l, 1);
    if (p->ab_dtype == FX_DTYPE_E4M3 ? chance(90) : chance(3)) p->scale_a = ptr(), p->scale_b = ptr();
    p->b_constant = (int32_t)(chance(90) ? (int64_t)(rnd() % 2) : PICK(BOOLS));
    return p;
}

static fx_attention_problem_t *attention_problem(void) {
    fx_attention_problem_t *p = malloc(sizeof *p);
    memset(p, 0, sizeof *p);
    p->dtype = (fx_dtype_t)(chance(90) ? 1 + (int64_t)(rnd() % 2) : PICK(DTYPES));
    p->varlen = (int32_t)(chance(70) ? 0 : chance(80) ? 1 : PICK(BOOLS));
    p->batch = chance(85) ? 1 + (int64_t)(rnd() % 4) : PICK(EDGE);
    p->seqlen_q = dim(), p->seqlen_k = dim();
    p->heads_kv = chance(85) ? 1 + (int64_t)(rnd() % 8) : PICK(EDGE);
    p->heads_q = mul(p->heads_kv, chance(85) ? 1 + (int64_t)(rnd() % 4) : PICK(EDGE));
    p->head_dim = chance(85) ? 64 << (rnd() % 2) : PICK(HEAD_DIMS);
    int64_t S[3] = {p->seqlen_q, p->seqlen_k, p->seqlen_k};
    int64_t H[4] = {p->heads_q, p->heads_kv, p->heads_kv, p->heads_q};
    int64_t *st[4] = {p->q_stride, p->k_stride, p->v_stride, p->o_stride};
    for (int i = 0; i < 4; i++) {
        int64_t seq = i == 3 ? S[0] : S[i];
        st[i][2] = p->head_dim, st[i][1] = mul(H[i], p->head_dim), st[i][0] = mul(seq, st[i][1]);
        if (chance(8)) st[i][rnd() % 3] = any64();
    }
    p->q = ptr(), p->k = ptr(), p->v = ptr(), p->o = ptr();
    if (chance(50)) {
        p->lse = ptr();
        p->lse_stride[0] = mul(p->heads_q, p->seqlen_q), p->lse_stride[1] = p->seqlen_q;
        if (chance(10)) p->lse_stride[rnd() % 2] = any64();
    }
    if (p->varlen) {
        p->cu_seqlens_q = chance(95) ? ptr() : NULL, p->cu_seqlens_k = chance(95) ? ptr() : NULL;
        p->max_seqlen_q = (int32_t)(chance(80) ? (p->seqlen_q < 1 << 20 ? p->seqlen_q : 1) : PICK(EDGE));
    }
    p->causal = (int32_t)(chance(90) ? (int64_t)(rnd() % 2) : PICK(BOOLS));
    static const float SCALES[] = {0.0f, 0.125f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3e38f};
    p->softmax_scale = chance(80) ? 0.0f : SCALES[rnd() % (sizeof SCALES / sizeof SCALES[0])];
    return p;
}

static int valid_bool(int32_t b) { return b == 0 || b == 1; }
static int sane_device(const fx_device_t *d) { return d->cc_major >= 1 && d->cc_major < 100 && d->cc_minor >= 0 && d->cc_minor < 10; }

/* ---- the calls -------------------------------------------------------------------------------- */
static void fuzz_gemm(void) {
    fx_device_t *d = device();
    fx_gemm_problem_t *p = gemm_problem();
    fx_selection_t *sel = malloc(sizeof *sel);
    int empty = p->m == 0 || p->n == 0 || p->l == 0;
    int32_t rc = fx_gemm_select(d, p, sel);
    check("fx_gemm_select", rc, sel, empty || p->k == 0, 1, GEMM_FIELDS);
    if (d->sm_count <= 0) must_refuse(INV_SM_COUNT, "fx_gemm_select", rc, "sm_count");
    else if (!valid_bool(p->b_constant)) must_refuse(INV_BOOL, "fx_gemm_select", rc, "b_constant");
    else if (!sane_device(d) && rc == FX_OK && sel->variant >= 0) violate(INV_CC, "fx_gemm_select", rc, "");
    uint64_t ws_bytes = rc == FX_OK ? sel->workspace_bytes : 0;
    void *ws = chance(70) && ws_bytes ? (void *)(uintptr_t)(1u << 24) : ptr();
    if (chance(10)) ws_bytes = (uint64_t)any64();
    rc = fx_gemm(d, p, ws, ws_bytes, NULL, chance(80) ? sel : NULL);
    check("fx_gemm", rc, NULL, empty, 0, GEMM_FIELDS);
    free(sel), free(p), free(d);
}

static void fuzz_attention(void) {
    fx_device_t *d = device();
    fx_attention_problem_t *p = attention_problem();
    fx_selection_t *sel = malloc(sizeof *sel);
    int empty = p->batch == 0 || p->seqlen_q == 0 || p->heads_q == 0;
    int32_t rc = fx_attention_select(d, p, sel);
    char what[160];
    snprintf(what, sizeof what, "fx_attention_select B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld varlen=%d",
             (long long)p->batch, (long long)p->seqlen_q, (long long)p->seqlen_k, (long long)p->heads_q,
             (long long)p->heads_kv, (long long)p->head_dim, p->varlen);
    check(what, rc, sel, empty, 1, ATTN_FIELDS);
    if (d->sm_count <= 0) must_refuse(INV_SM_COUNT, "fx_attention_select", rc, "sm_count");
    else if (!valid_bool(p->causal)) must_refuse(INV_BOOL, "fx_attention_select", rc, "causal");
    else if (!valid_bool(p->varlen)) must_refuse(INV_BOOL, "fx_attention_select", rc, "varlen");
    else if (p->varlen == 1 && p->max_seqlen_q < 0 && p->cu_seqlens_q && p->cu_seqlens_k && !empty)
        must_refuse(INV_MAX_SEQLEN, "fx_attention_select", rc, "max_seqlen_q");
    else if (!sane_device(d) && rc == FX_OK && sel->variant >= 0) violate(INV_CC, "fx_attention_select", rc, "");
    uint64_t ws_bytes = rc == FX_OK ? sel->workspace_bytes : 0;
    void *ws = chance(70) && ws_bytes ? (void *)(uintptr_t)(1u << 24) : ptr();
    if (chance(10)) ws_bytes = (uint64_t)any64();
    rc = fx_attention(d, p, ws, ws_bytes, NULL, chance(80) ? sel : NULL);
    check("fx_attention", rc, NULL, empty, 0, ATTN_FIELDS);
    free(sel), free(p), free(d);
}

static void fuzz_misc(void) {
    int32_t code = (int32_t)(chance(50) ? (int64_t)(rnd() % 2000) - 1000 : PICK(EDGE));
    const char *s = fx_error_string(code);
    if (!s) violate(INV_BAD_CODE, "fx_error_string", code, "NULL");
    int32_t i = (int32_t)(chance(50) ? (int64_t)(rnd() % 100) - 10 : PICK(EDGE));
    const char *n = fx_variant_name(i);
    if ((n != NULL) != (i >= 0 && i < fx_variant_count())) violate(INV_SELECTION, "fx_variant_name", i, "");
    fx_device_t *d = malloc(sizeof *d);
    int32_t rc = fx_device_query((int32_t)PICK(EDGE), chance(80) ? d : NULL);
    check("fx_device_query", rc, NULL, 0, 0, GEMM_FIELDS);
    free(d);
    if (chance(5)) { /* NULL device / problem */
        fx_selection_t sel;
        check("fx_gemm(NULL)", fx_gemm(NULL, NULL, NULL, 0, NULL, &sel), NULL, 0, 0, GEMM_FIELDS);
        check("fx_attention_select(NULL)", fx_attention_select(NULL, NULL, NULL), NULL, 0, 1, ATTN_FIELDS);
    }
    (void)fx_selection_info();
}

/* ---- hand-made cases: each must give `want` with a message containing `field` ------------------ */
static int handmade_failures;

static void expect(const char *what, int32_t rc, int32_t want, const char *field) {
    calls++;
    const char *msg = fx_last_error_message();
    if (rc != want || (field && !strstr(msg, field))) {
        handmade_failures++;
        fprintf(stderr, "HANDMADE %s: rc=%d (want %d) message=\"%s\" (want it to name %s)\n", what, rc, want, msg,
                field ? field : "-");
    }
}

/* Without a usable driver or device: a refusal that gives the driver's reason (cudaGetErrorString
   of cudaErrorInsufficientDriver or cudaErrorNoDevice), whichever check meets it first. */
static void expect_no_device(const char *what, int32_t rc) {
    const char *msg = fx_last_error_message();
    calls++;
    if (rc == FX_OK || !(strstr(msg, "CUDA driver version is insufficient") || strstr(msg, "no CUDA-capable device"))) {
        handmade_failures++;
        fprintf(stderr, "HANDMADE %s: rc=%d message=\"%s\" (want a refusal naming the missing driver or device)\n",
                what, rc, msg);
    }
}

static fx_gemm_problem_t gemm_ok(void) {
    fx_gemm_problem_t p;
    memset(&p, 0, sizeof p);
    p.ab_dtype = FX_DTYPE_BF16, p.c_dtype = FX_DTYPE_BF16, p.m = 256, p.n = 256, p.k = 256, p.l = 1;
    p.a = (void *)(uintptr_t)(1u << 20), p.b = (void *)(uintptr_t)(2u << 20), p.c = (void *)(uintptr_t)(3u << 20);
    int64_t row[3] = {256, 1, 0};
    memcpy(p.a_stride, row, sizeof row), memcpy(p.b_stride, row, sizeof row), memcpy(p.c_stride, row, sizeof row);
    return p;
}

static fx_attention_problem_t attn_ok(void) {
    fx_attention_problem_t p;
    memset(&p, 0, sizeof p);
    p.dtype = FX_DTYPE_BF16, p.batch = 2, p.seqlen_q = 128, p.seqlen_k = 128, p.heads_q = 8, p.heads_kv = 8;
    p.head_dim = 64;
    int64_t st[3] = {128 * 8 * 64, 8 * 64, 64};
    memcpy(p.q_stride, st, sizeof st), memcpy(p.k_stride, st, sizeof st), memcpy(p.v_stride, st, sizeof st),
        memcpy(p.o_stride, st, sizeof st);
    p.q = (void *)(uintptr_t)(1u << 24), p.k = (void *)(uintptr_t)(2u << 24), p.v = (void *)(uintptr_t)(3u << 24),
    p.o = (void *)(uintptr_t)(4u << 24);
    p.lse = (float *)(uintptr_t)(6u << 24), p.lse_stride[0] = 8 * 128, p.lse_stride[1] = 128;
    return p;
}

static void handmade(void) {
    fx_device_t h100;
    memset(&h100, 0, sizeof h100);
    h100.cc_major = 9, h100.cc_minor = 0, h100.sm_count = 132;
    fx_selection_t sel;
    fx_gemm_problem_t g = gemm_ok();
    expect("gemm valid", fx_gemm_select(&h100, &g, &sel), FX_OK, NULL);
    expect("gemm valid: no message left", fx_last_error_message()[0] != 0, 0, NULL);
    g.m = INT64_MAX, g.a_stride[2] = 0;
    expect("gemm M = INT64_MAX", fx_gemm_select(&h100, &g, &sel), FX_ERR_INPUT, "overflows");
    expect("gemm refused: selection zeroed", sel.variant, -1, NULL);
    g = gemm_ok(), g.a_stride[0] = INT64_MAX;
    expect("gemm a stride INT64_MAX", fx_gemm_select(&h100, &g, &sel), FX_ERR_INPUT, "a");
    g = gemm_ok(), g.c = (void *)(uintptr_t)g.a;
    expect("gemm c aliasing a", fx_gemm_select(&h100, &g, &sel), FX_ERR_INPUT, "c overlaps a");
    g = gemm_ok(), g.c_stride[0] = 0;
    expect("gemm c rows on one address", fx_gemm_select(&h100, &g, &sel), FX_ERR_INPUT, "c");
    g = gemm_ok(), g.b_constant = 2;
    expect("gemm b_constant 2", fx_gemm_select(&h100, &g, &sel), FX_ERR_INPUT, "b_constant");
    g = gemm_ok(), g.m = 0;
    expect("gemm M = 0: nothing to do", fx_gemm(&h100, &g, NULL, 0, NULL, &sel), FX_OK, NULL);
    g = gemm_ok(), g.k = 0;
    expect_no_device("gemm K = 0 zeroes c: no device", fx_gemm(&h100, &g, NULL, 0, NULL, &sel));
    g = gemm_ok();
    expect_no_device("gemm without a device", fx_gemm(&h100, &g, NULL, 0, NULL, &sel));

    fx_device_t d = h100;
    d.sm_count = 0;
    g = gemm_ok();
    expect("sm_count 0", fx_gemm_select(&d, &g, &sel), FX_ERR_INPUT, "sm_count");
    d = h100, d.cc_minor = -1;
    expect("capability 9.-1", fx_gemm_select(&d, &g, &sel), FX_ERR_INPUT, "compute capability");
    d = h100, memset(d.name, 'H', sizeof d.name);
    expect("name without NUL", fx_gemm_select(&d, &g, &sel), FX_ERR_INPUT, "name");
    expect("NULL problem", fx_gemm_select(&h100, NULL, &sel), FX_ERR_INPUT, "problem");

    fx_attention_problem_t a = attn_ok();
    expect("attention valid", fx_attention_select(&h100, &a, &sel), FX_OK, NULL);
    a.causal = 2;
    expect("attention causal 2", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "causal");
    a = attn_ok(), a.varlen = -1;
    expect("attention varlen -1", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "varlen");
    a = attn_ok(), a.o = (void *)(uintptr_t)a.q;
    expect("attention o aliasing q", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "o overlaps q");
    a = attn_ok(), a.batch = (int64_t)1 << 62;
    expect("attention batch 2^62", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "batch");
    a = attn_ok(), a.seqlen_k = 0;
    expect("attention without keys", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "seqlen_k");
    a = attn_ok(), a.softmax_scale = NAN;
    expect("attention softmax_scale NaN", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "softmax_scale");
    a = attn_ok(), a.varlen = 1, a.batch = 2, a.seqlen_q = 256, a.seqlen_k = 256, a.max_seqlen_q = -1;
    a.q_stride[0] = a.k_stride[0] = a.v_stride[0] = a.o_stride[0] = 0;
    a.cu_seqlens_q = a.cu_seqlens_k = (const int32_t *)(uintptr_t)(5u << 24), a.lse = NULL;
    expect("attention max_seqlen_q -1", fx_attention_select(&h100, &a, &sel), FX_ERR_INPUT, "max_seqlen_q");
    a = attn_ok();
    expect_no_device("attention without a device", fx_attention(&h100, &a, NULL, 0, NULL, &sel));
    fx_device_t q;
    expect_no_device("device query without a device", fx_device_query(0, &q));
    expect("device query NULL", fx_device_query(0, NULL), FX_ERR_INPUT, "out");
}

int main(int argc, char **argv) {
    rng_state = argc > 1 ? strtoull(argv[1], NULL, 0) * 0x9E3779B97F4A7C15ull + 1 : 1;
    long n = argc > 2 ? strtol(argv[2], NULL, 0) : 10000;
    handmade();
    for (long it = 0; it < n; it++) {
        uint64_t r = rnd() % 10;
        if (r < 5) fuzz_gemm();
        else if (r < 9) fuzz_attention();
        else fuzz_misc();
    }
    fprintf(stderr, "{\"iterations\": %ld, \"calls\": %ld, \"handmade_failures\": %d, \"violations\": {", n, calls,
            handmade_failures);
    for (int i = 0; i < INV_COUNT; i++) fprintf(stderr, "%s\"%s\": %ld", i ? ", " : "", INV_NAMES[i], violations[i]);
    fprintf(stderr, "}}\n");
    return 0;
}
