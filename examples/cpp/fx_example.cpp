// A C++ program calling a kernel-factory bundle through its host library: fx_gemm and fx_attention
// choose the variant (as the Python loader would) and launch it on device buffers; the results are
// checked against a float reference computed here on the host.
//
//   make BUNDLE=../../artifacts/default && ./fx_example
//
// Exit status 0 when every check passes.  Needs a GPU the bundle has kernels for (sm_80 to sm_90a).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fx_bundle.h"

namespace {

// --- errors: every fx_* call returns 0, a negative FX_ERR_* or a cudaError_t ------------------------
struct FxError : std::runtime_error {
    int32_t code;
    FxError(const std::string &what, int32_t c)
        : std::runtime_error(what + ": " + fx_error_string(c) + (*fx_last_error_message() ? std::string(" (") + fx_last_error_message() + ")" : "")),
          code(c) {}
};

void fx_check(int32_t err, const char *what) {
    if (err != FX_OK) throw FxError(what, err);
}

void cuda_check(cudaError_t err, const char *what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// --- bf16 on the host ---------------------------------------------------------------------------------
uint16_t to_bf16(float x) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return uint16_t(u >> 16);
}

float from_bf16(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// A device buffer of T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
    T *ptr = nullptr;
    size_t count = 0;
    explicit DeviceBuffer(size_t n) : count(n) {
        if (n) cuda_check(cudaMalloc(&ptr, n * sizeof(T)), "cudaMalloc");
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    void upload(const std::vector<T> &h) { cuda_check(cudaMemcpy(ptr, h.data(), count * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
    std::vector<T> download() const {
        std::vector<T> h(count);
        cuda_check(cudaMemcpy(h.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
        return h;
    }
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937 &rng, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = to_bf16(d(rng));
    return v;
}

// max |got - want| / max |want|, the tolerance of a bf16 output with fp32 accumulation
bool close(const std::vector<float> &got, const std::vector<float> &want, double tol, const char *what) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < want.size(); i++) {
        if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {  // lse of a row with no key: -inf
            if (got[i] == want[i]) continue;
            std::printf("%s: %g at %zu, expected %g\n", what, double(got[i]), i, double(want[i]));
            return false;
        }
        err = std::fmax(err, std::fabs(double(got[i]) - want[i]));
        ref = std::fmax(ref, std::fabs(double(want[i])));
    }
    double rel = err / (ref > 0 ? ref : 1);
    std::printf("%s: max error %.3g (relative %.3g, tolerance %.3g) -> %s\n", what, err, rel, tol, rel <= tol ? "OK" : "FAIL");
    return rel <= tol;
}

// --- GEMM: c (M, N) = a (M, K) · b (N, K)ᵀ, bf16 in and out ------------------------------------------
bool run_gemm(const fx_device_t &dev, cudaStream_t stream, int64_t M, int64_t N, int64_t K, std::mt19937 &rng) {
    auto ha = random_bf16(size_t(M * K), rng), hb = random_bf16(size_t(N * K), rng);
    DeviceBuffer<uint16_t> a(ha.size()), b(hb.size()), c(size_t(M * N));
    a.upload(ha);
    b.upload(hb);

    fx_gemm_problem_t p{};
    p.ab_dtype = FX_DTYPE_BF16;
    p.c_dtype = FX_DTYPE_BF16;
    p.m = M, p.n = N, p.k = K, p.l = 1;
    p.a = a.ptr, p.a_stride[0] = K, p.a_stride[1] = 1, p.a_stride[2] = 0;  // row-major (M, K)
    p.b = b.ptr, p.b_stride[0] = K, p.b_stride[1] = 1, p.b_stride[2] = 0;  // row-major (N, K): weights
    p.c = c.ptr, p.c_stride[0] = N, p.c_stride[1] = 1, p.c_stride[2] = 0;

    // Ask first: which variant, and how much workspace it needs (split-K partials).
    fx_selection_t sel;
    fx_check(fx_gemm_select(&dev, &p, &sel), "fx_gemm_select");
    DeviceBuffer<uint8_t> ws(sel.workspace_bytes);
    fx_check(fx_gemm(&dev, &p, ws.ptr, sel.workspace_bytes, stream, &sel), "fx_gemm");
    cuda_check(cudaStreamSynchronize(stream), "gemm");
    std::printf("gemm %lldx%lldx%lld: %s (workspace %llu bytes, max_clusters %d)\n", (long long)M, (long long)N,
                (long long)K, sel.name, (unsigned long long)sel.workspace_bytes, sel.max_clusters);

    std::vector<float> want(size_t(M * N)), got(size_t(M * N));
    std::vector<float> fa(ha.size()), fb(hb.size());
    for (size_t i = 0; i < ha.size(); i++) fa[i] = from_bf16(ha[i]);
    for (size_t i = 0; i < hb.size(); i++) fb[i] = from_bf16(hb[i]);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += fa[size_t(i * K + k)] * fb[size_t(j * K + k)];
            want[size_t(i * N + j)] = s;
        }
    auto hc = c.download();
    for (size_t i = 0; i < hc.size(); i++) got[i] = from_bf16(hc[i]);
    char what[96];
    std::snprintf(what, sizeof what, "gemm %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    return close(got, want, 2e-2, what);
}

// --- attention: o = softmax(q·kᵀ·scale, bottom-right causal)·v, GQA, dense (B, S, H, D) bf16 --------
bool run_attention(const fx_device_t &dev, cudaStream_t stream, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq,
                   int64_t Hkv, int64_t D, bool causal, std::mt19937 &rng) {
    auto hq = random_bf16(size_t(B * Sq * Hq * D), rng), hk = random_bf16(size_t(B * Sk * Hkv * D), rng),
         hv = random_bf16(size_t(B * Sk * Hkv * D), rng);
    DeviceBuffer<uint16_t> q(hq.size()), k(hk.size()), v(hv.size()), o(hq.size());
    DeviceBuffer<float> lse(size_t(B * Hq * Sq));
    q.upload(hq);
    k.upload(hk);
    v.upload(hv);

    fx_attention_problem_t p{};
    p.dtype = FX_DTYPE_BF16;
    p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.heads_q = Hq, p.heads_kv = Hkv, p.head_dim = D;
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr;
    int64_t qs[3] = {Sq * Hq * D, Hq * D, D}, ks[3] = {Sk * Hkv * D, Hkv * D, D};  // (batch, seq, head)
    std::memcpy(p.q_stride, qs, sizeof qs), std::memcpy(p.o_stride, qs, sizeof qs);
    std::memcpy(p.k_stride, ks, sizeof ks), std::memcpy(p.v_stride, ks, sizeof ks);
    p.lse = lse.ptr, p.lse_stride[0] = Hq * Sq, p.lse_stride[1] = Sq;
    p.causal = causal;
    p.softmax_scale = 0.0f;  // 1/sqrt(D)

    fx_selection_t sel;
    fx_check(fx_attention_select(&dev, &p, &sel), "fx_attention_select");
    DeviceBuffer<uint8_t> ws(sel.workspace_bytes);
    fx_check(fx_attention(&dev, &p, ws.ptr, sel.workspace_bytes, stream, &sel), "fx_attention");
    cuda_check(cudaStreamSynchronize(stream), "attention");
    std::printf("attention B%lld Sq%lld Sk%lld H%lld/%lld D%lld%s: %s (splits %d)\n", (long long)B, (long long)Sq,
                (long long)Sk, (long long)Hq, (long long)Hkv, (long long)D, causal ? " causal" : "", sel.name, sel.splits);

    std::vector<float> want(hq.size()), got(hq.size()), want_lse(size_t(B * Hq * Sq));
    double scale = 1.0 / std::sqrt(double(D));
    std::vector<double> s(static_cast<size_t>(Sk));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t g = h / (Hq / Hkv);
            for (int64_t i = 0; i < Sq; i++) {
                const uint16_t *qi = &hq[size_t(((b * Sq + i) * Hq + h) * D)];
                int64_t last = causal ? i + Sk - Sq : Sk - 1;  // keys j <= i + Sk - Sq
                double mx = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    const uint16_t *kj = &hk[size_t(((b * Sk + j) * Hkv + g) * D)];
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += double(from_bf16(qi[d])) * from_bf16(kj[d]);
                    s[size_t(j)] = j <= last ? dot * scale : -INFINITY;
                    mx = std::fmax(mx, s[size_t(j)]);
                }
                double sum = 0;
                for (int64_t j = 0; j < Sk; j++) sum += s[size_t(j)] == -INFINITY ? 0 : std::exp(s[size_t(j)] - mx);
                float *oi = &want[size_t(((b * Sq + i) * Hq + h) * D)];
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= last && j < Sk; j++)
                        acc += std::exp(s[size_t(j)] - mx) * from_bf16(hv[size_t(((b * Sk + j) * Hkv + g) * D + d)]);
                    oi[d] = sum > 0 ? float(acc / sum) : 0.0f;
                }
                want_lse[size_t((b * Hq + h) * Sq + i)] = sum > 0 ? float(mx + std::log(sum)) : -INFINITY;
            }
        }
    auto ho = o.download();
    for (size_t i = 0; i < ho.size(); i++) got[i] = from_bf16(ho[i]);
    auto got_lse = lse.download();
    bool ok = close(got, want, 2e-2, "attention o");
    return close(got_lse, want_lse, 1e-3, "attention lse") && ok;
}

}  // namespace

int main() {
    try {
        fx_device_t dev;
        int device = 0;
        cuda_check(cudaGetDevice(&device), "cudaGetDevice");
        fx_check(fx_device_query(device, &dev), "fx_device_query");
        std::printf("%s (compute capability %d.%d, %d SMs); %s\n", dev.name, dev.cc_major, dev.cc_minor, dev.sm_count,
                    fx_selection_info());
        cudaStream_t stream;
        cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
        std::mt19937 rng(15);
        bool ok = true;
        ok &= run_gemm(dev, stream, 300, 1024, 512, rng);   // odd M
        ok &= run_gemm(dev, stream, 4, 4096, 4096, rng);    // decode: split-K or a swapped tile
        ok &= run_attention(dev, stream, 2, 256, 256, 8, 2, 128, true, rng);  // GQA 8/2, causal
        ok &= run_attention(dev, stream, 1, 100, 300, 4, 4, 64, false, rng);  // Sq != Sk

        // The error path: K = 4100 breaks every variant's 16-byte row alignment (K % 8 != 0).
        fx_gemm_problem_t bad{};
        bad.ab_dtype = bad.c_dtype = FX_DTYPE_BF16;
        bad.m = 64, bad.n = 64, bad.k = 4100, bad.l = 1;
        bad.a_stride[0] = 4100, bad.a_stride[1] = 1, bad.b_stride[0] = 4100, bad.b_stride[1] = 1, bad.c_stride[0] = 64, bad.c_stride[1] = 1;
        int32_t err = fx_gemm_select(&dev, &bad, nullptr);
        std::printf("K = 4100 -> %s\n  %s\n", fx_error_string(err), fx_last_error_message());
        ok &= err == FX_ERR_NO_VARIANT;

        cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
        std::printf("%s\n", ok ? "ALL OK" : "FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
