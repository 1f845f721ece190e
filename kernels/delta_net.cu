// The hybrid models' layers (Qwen3.5, Qwen3-Next) on the GPU: the Gated DeltaNet between its
// projections — the causal conv with its window, the gated delta rule over the per-head state, the
// gated RMSNorm, and the fused projections' splits — and the gated attention's query/gate split and
// output gate. The arithmetic is hipfire-model's delta_net.rs (the CPU engine's, itself llama.cpp's
// build_delta_net_autoregressive), operation for operation; only reduction orders differ.
//
// A sequence's recurrent state is one f32 buffer per DeltaNet layer: the conv window (the last
// conv_kernel - 1 inputs, oldest first, conv_dim values each), then per value head the
// head_dim x head_dim matrix S[value][key] (key contiguous), as DeltaNetState lays them out on the
// host. The kernels update it in place. A kernel reads the state of sequence s at `states[s]`, or,
// for a run of one sequence (`states` null), at `state0`: a batched decode step stages the table per
// step (so a captured graph serves any slots), a run passes its slot's address.
//
// Rows are tokens. A run of one sequence is n_seq = 1 sequence of t tokens (a prompt chunk, one
// decode token); a batched decode step is n_seq rows of t = 1 token each. Tokens of one sequence
// are applied in order inside each kernel.

#include "platform.cuh"

// Most conv taps the window kernel keeps in registers (Qwen3.5 / Qwen3-Next use 4); the decoder
// refuses more (gpu/delta_net.rs DN_MAX_TAPS).
#define DN_MAX_TAPS 8
// Warps (rows of S) per block of the delta rule; the decoder's DN_RULE_WARPS.
#define DN_RULE_WARPS 4
// Most keys a lane holds: head_dim <= DN_MAX_KEYS_PER_LANE * HF_WARP (the decoder refuses wider).
#define DN_MAX_KEYS_PER_LANE 8

__device__ __forceinline__ float dn_warp_sum(float v) {
    for (int o = HF_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float dn_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// ln(1 + e^x), linear above 20 as ggml_softplus and delta_net.rs (SOFTPLUS_LINEAR_ABOVE).
__device__ __forceinline__ float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float* dn_state(unsigned long long state0, const unsigned long long* states,
                                           int s) {
    return (float*)(states ? states[s] : state0);
}

// Causal depthwise conv + SiLU, in place over qkv (rows of cd channels: t tokens of each of n_seq
// sequences, sequence s at rows s*t ..). taps: n_taps per channel, channel-major. Thread = one
// channel of one sequence (blocks_per_seq blocks a sequence, sequences one after another): it walks the tokens in order with the window in
// registers and writes the last n_taps - 1 inputs back as the new window.
extern "C" __global__ void dn_conv_silu_f32(float* __restrict__ qkv, const float* __restrict__ taps,
                                            unsigned long long state0,
                                            const unsigned long long* __restrict__ states, int cd,
                                            int n_taps, int t, int blocks_per_seq) {
    const int s = blockIdx.x / blocks_per_seq;
    const int ch = (blockIdx.x % blocks_per_seq) * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    float* win_g = dn_state(state0, states, s);
    const int w = n_taps - 1;
    const float* tap = taps + (size_t)ch * n_taps;
    float win[DN_MAX_TAPS];
#pragma unroll
    for (int j = 0; j < DN_MAX_TAPS - 1; ++j)
        if (j < w) win[j] = win_g[(size_t)j * cd + ch];
    float* row = qkv + (size_t)s * t * cd + ch;
    for (int ti = 0; ti < t; ++ti) {
        const float x = row[(size_t)ti * cd];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < DN_MAX_TAPS - 1; ++j)
            if (j < w) acc += win[j] * tap[j];
        acc += x * tap[w];
        row[(size_t)ti * cd] = dn_silu(acc);
#pragma unroll
        for (int j = 0; j < DN_MAX_TAPS - 2; ++j)
            if (j + 1 < w) win[j] = win[j + 1];
#pragma unroll
        for (int j = 0; j < DN_MAX_TAPS - 1; ++j)
            if (j == w - 1) win[j] = x;
    }
#pragma unroll
    for (int j = 0; j < DN_MAX_TAPS - 1; ++j)
        if (j < w) win_g[(size_t)j * cd + ch] = win[j];
}

// The gated delta rule. qkv: the conv's output rows (cd = 2 kd + vd: every q head, every k head,
// every v head); beta, alpha: n_v values a row (the logits of the write strength and the decay's
// input); o: vd values a row. One warp per row r of value head h's S: blocks_per_seq = n_v * hd /
// DN_RULE_WARPS blocks cover a sequence's heads' rows, sequences one after another; the warp keeps its row of S in registers
// (lane holds keys lane, lane + HF_WARP, ..) across the sequence's t tokens. Per token, as
// delta_net.rs `prepare` and `head`:
//   q, k of the value head's key head L2-normalised (q also scaled by 1/sqrt(hd)),
//   b = sigmoid(beta), g = softplus(alpha + dt_bias[h]) * a[h],
//   S_r <- e^g S_r;  d = b (v_r - S_r.k);  S_r <- S_r + k d;  o_r = S_r.q.
// grouped: value head h reads key head h / (n_v / n_k) (qwen3next), else h % n_k (qwen35).
// s_off: where S starts in the state (after the conv window).
extern "C" __global__ void __launch_bounds__(DN_RULE_WARPS * HF_WARP)
    dn_rule_f32(const float* __restrict__ qkv, const float* __restrict__ beta, const float* __restrict__ alpha,
                const float* __restrict__ dt_bias, const float* __restrict__ a, float* __restrict__ o,
                unsigned long long state0, const unsigned long long* __restrict__ states, int n_k, int n_v,
                int hd, int grouped, int s_off, int t, float eps, int blocks_per_seq) {
    const int lane = threadIdx.x % HF_WARP;
    const int s = blockIdx.x / blocks_per_seq;
    const int gr = (blockIdx.x % blocks_per_seq) * DN_RULE_WARPS + threadIdx.x / HF_WARP;
    const int h = gr / hd, r = gr % hd;
    if (h >= n_v) return;
    const int kh = grouped ? h / (n_v / n_k) : h % n_k;
    const int kd = n_k * hd, vd = n_v * hd, cd = 2 * kd + vd;
    const int per_lane = hd / HF_WARP;
    float* srow = dn_state(state0, states, s) + s_off + ((size_t)h * hd + r) * hd;
    float st[DN_MAX_KEYS_PER_LANE];
#pragma unroll
    for (int i = 0; i < DN_MAX_KEYS_PER_LANE; ++i)
        if (i < per_lane) st[i] = srow[lane + i * HF_WARP];
    const float q_scale = 1.0f / sqrtf((float)hd);
    const float dtb = dt_bias[h], ah = a[h];
    for (int ti = 0; ti < t; ++ti) {
        const size_t tok = (size_t)s * t + ti;
        const float* row = qkv + tok * cd;
        const float* q = row + (size_t)kh * hd;
        const float* k = row + kd + (size_t)kh * hd;
        float qv[DN_MAX_KEYS_PER_LANE], kv[DN_MAX_KEYS_PER_LANE];
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int i = 0; i < DN_MAX_KEYS_PER_LANE; ++i)
            if (i < per_lane) {
                qv[i] = q[lane + i * HF_WARP];
                kv[i] = k[lane + i * HF_WARP];
                sq += qv[i] * qv[i];
                sk += kv[i] * kv[i];
            }
        sq = dn_warp_sum(sq);
        sk = dn_warp_sum(sk);
        const float qn = 1.0f / fmaxf(sqrtf(sq), eps), kn = 1.0f / fmaxf(sqrtf(sk), eps);
        const float b = dn_sigmoid(beta[tok * n_v + h]);
        const float decay = expf(dn_softplus(alpha[tok * n_v + h] + dtb) * ah);
        const float v = row[2 * kd + (size_t)h * hd + r];
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < DN_MAX_KEYS_PER_LANE; ++i)
            if (i < per_lane) {
                qv[i] = qv[i] * qn * q_scale;
                kv[i] = kv[i] * kn;
                st[i] *= decay;
                dot += st[i] * kv[i];
            }
        dot = dn_warp_sum(dot);
        const float d = b * (v - dot);
        float out = 0.0f;
#pragma unroll
        for (int i = 0; i < DN_MAX_KEYS_PER_LANE; ++i)
            if (i < per_lane) {
                st[i] += kv[i] * d;
                out += st[i] * qv[i];
            }
        out = dn_warp_sum(out);
        if (lane == 0) o[tok * vd + (size_t)h * hd + r] = out;
    }
#pragma unroll
    for (int i = 0; i < DN_MAX_KEYS_PER_LANE; ++i)
        if (i < per_lane) srow[lane + i * HF_WARP] = st[i];
}

// o_h <- rms_norm(o_h) * w * silu(z_h) for each of n_heads heads of hd values (rows of heads
// back to back; o and z alike): one warp a head, DN_RULE_WARPS heads a block.
extern "C" __global__ void __launch_bounds__(DN_RULE_WARPS * HF_WARP)
    dn_gated_norm_f32(float* __restrict__ o, const float* __restrict__ w, const float* __restrict__ z,
                      int hd, int n_heads, float eps) {
    const int lane = threadIdx.x % HF_WARP;
    const int head = blockIdx.x * DN_RULE_WARPS + threadIdx.x / HF_WARP;
    if (head >= n_heads) return;
    float* oh = o + (size_t)head * hd;
    const float* zh = z + (size_t)head * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += HF_WARP) ss += oh[i] * oh[i];
    ss = dn_warp_sum(ss);
    const float inv = rsqrtf(ss / (float)hd + eps);
    for (int i = lane; i < hd; i += HF_WARP) oh[i] = oh[i] * inv * w[i] * dn_silu(zh[i]);
}

// qwen3next's fused ssm_in product (rows of cd + vd) into the conv's input qkv (rows of cd) and z
// (rows of vd), as delta_net.rs `split_qkvz`: per key head kh the fused row holds its q (hd), its k
// (hd), then the v and the z of its `group` = vd / n_k values. One thread per fused value; n: rows *
// (cd + vd).
extern "C" __global__ void dn_split_qkvz_f32(const float* __restrict__ fused, float* __restrict__ qkv,
                                             float* __restrict__ z, int n_k, int hd, int group, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int kd = n_k * hd, vd = n_k * group, cd = 2 * kd + vd, width = cd + vd;
    const int per_head = 2 * hd + 2 * group;
    const int row = i / width, e = i % width;
    const int kh = e / per_head, off = e % per_head;
    const float x = fused[i];
    float* q = qkv + (size_t)row * cd;
    if (off < hd)
        q[kh * hd + off] = x;
    else if (off < 2 * hd)
        q[kd + kh * hd + off - hd] = x;
    else if (off < 2 * hd + group)
        q[2 * kd + kh * group + off - 2 * hd] = x;
    else
        z[(size_t)row * vd + kh * group + off - 2 * hd - group] = x;
}

// qwen3next's fused ssm_ba product (rows of 2 n_v) into beta and alpha (rows of n_v), as
// delta_net.rs `split_ba`: per key head the fused row holds the beta of its `group` = n_v / n_k
// value heads, then their alpha. One thread per fused value; n: rows * 2 n_v.
extern "C" __global__ void dn_split_ba_f32(const float* __restrict__ fused, float* __restrict__ beta,
                                           float* __restrict__ alpha, int n_v, int group, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int row = i / (2 * n_v), e = i % (2 * n_v);
    const int kh = e / (2 * group), off = e % (2 * group);
    if (off < group)
        beta[(size_t)row * n_v + kh * group + off] = fused[i];
    else
        alpha[(size_t)row * n_v + kh * group + off - group] = fused[i];
}

// Gated attention (Qwen3.5): the query projection's rows hold [q_h, g_h] per head (2 hd values a
// head, qd = n_head * hd). The query heads into q (rows of qd); n: rows * qd.
extern "C" __global__ void ga_split_q_f32(const float* __restrict__ qg, float* __restrict__ q, int hd, int qd,
                                          int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int row = i / qd, c = i % qd, h = c / hd, j = c % hd;
    q[i] = qg[(size_t)row * 2 * qd + (size_t)h * 2 * hd + j];
}

// att <- att * sigmoid(g): each head's output times its gate (the second half of the head's [q_h,
// g_h] in qg); n: rows * qd.
extern "C" __global__ void ga_gate_f32(float* __restrict__ att, const float* __restrict__ qg, int hd, int qd,
                                       int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int row = i / qd, c = i % qd, h = c / hd, j = c % hd;
    att[i] *= dn_sigmoid(qg[(size_t)row * 2 * qd + (size_t)h * 2 * hd + hd + j]);
}
