// blocks.cuh — byte layouts of every weight format hipfire multiplies on the GPU.
//
// Mirrors crates/hipfire-quant (Rust) and ggml/src/ggml-common.h (GGUF layouts). The kernels never
// dereference these structs directly (blocks of 18, 34 or 210 bytes are only 2-byte aligned inside a
// row); they index bytes with the offsets below. The structs and static_asserts exist so the Rust and
// CUDA/HIP views of each layout are pinned in one place and a layout change fails to compile.
#pragma once

typedef unsigned char hf_u8;
typedef unsigned short hf_u16;

// Q8_0: 8.5 bits per weight. value = d * qs[j]
struct block_q8_0 { hf_u16 d; signed char qs[32]; };
static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");

// Q4_0: 4.5 bpw. qs[j] low nibble = element j, high nibble = element j+16; value = d * (q - 8)
struct block_q4_0 { hf_u16 d; hf_u8 qs[16]; };
static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");

// Q4_1: 5.0 bpw. nibbles as Q4_0; value = d * q + m
struct block_q4_1 { hf_u16 d; hf_u16 m; hf_u8 qs[16]; };
static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");

// Q5_0: 5.5 bpw. Element j's fifth bit is bit j of qh (j+16: bit j+16); value = d * (q - 16)
struct block_q5_0 { hf_u16 d; hf_u8 qh[4]; hf_u8 qs[16]; };
static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");

// Q5_1: 6.0 bpw. bits as Q5_0; value = d * q + m
struct block_q5_1 { hf_u16 d; hf_u16 m; hf_u8 qh[4]; hf_u8 qs[16]; };
static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");

// IQ4_NL: 4.5 bpw. nibbles as Q4_0, each an index into the 16-entry non-linear grid kvalues_iq4nl;
// value = d * kvalues[q]
struct block_iq4_nl { hf_u16 d; hf_u8 qs[16]; };
static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");
// The IQ4_NL / IQ4_XS grid (ggml kvalues_iq4nl: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 |
// 53 69 89 113) as four little-endian words of int8 (the GEMV and the dequantiser decode from them).
#define HF_IQ4NL_W0 0xBFAD9881u
#define HF_IQ4NL_W1 0xF6EADDCFu
#define HF_IQ4NL_W2 0x26190D01u
#define HF_IQ4NL_W3 0x71594535u

// Q4_K: 4.5 bpw, 256 elements: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes.
struct block_q4_k { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; hf_u8 qs[128]; };
static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");

// Q6_K: 6.5625 bpw, 256 elements: 4 low bits in ql, 2 high bits in qh, 16 int8 scales (one per 16).
struct block_q6_k { hf_u8 ql[128]; hf_u8 qh[64]; signed char scales[16]; hf_u16 d; };
static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");

// Q5_K: 5.5 bpw, 256 elements: Q4_K's scales and nibbles plus one high bit per element in qh (bit j
// of qh[l] belongs to element 32j + l).
struct block_q5_k { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; hf_u8 qh[32]; hf_u8 qs[128]; };
static_assert(sizeof(block_q5_k) == 176, "Q5_K block is 176 bytes");

// IQ4_XS: 4.25 bpw, 256 elements: 8 sub-blocks of 32 (nibbles as IQ4_NL per 16 bytes), each with a
// 6-bit scale (4 low bits in scales_l, 2 high bits in scales_h); value = d * (ls - 32) * kvalues[q]
struct block_iq4_xs { hf_u16 d; hf_u16 scales_h; hf_u8 scales_l[4]; hf_u8 qs[128]; };
static_assert(sizeof(block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");

// Q3_K: 3.4375 bpw, 256 elements: 2 low bits in qs, the third bit in hmask (set: q, clear: q - 4),
// 16 6-bit scales (one per 16 elements, biased by 32) packed in 12 bytes. Element 128n + 32j + l:
// bits 2j of qs[32n + l], bit 4n + j of hmask[l].
struct block_q3_k { hf_u8 hmask[32]; hf_u8 qs[64]; hf_u8 scales[12]; hf_u16 d; };
static_assert(sizeof(block_q3_k) == 110, "Q3_K block is 110 bytes");

// Q2_K: 2.625 bpw, 256 elements: 2 bits in qs (placed as Q3_K's), per 16 elements a 4-bit scale (low
// nibble of scales[i]) and a 4-bit min (high nibble); value = d * sc * q - dmin * m.
struct block_q2_k { hf_u8 scales[16]; hf_u8 qs[64]; hf_u16 d; hf_u16 dmin; };
static_assert(sizeof(block_q2_k) == 84, "Q2_K block is 84 bytes");

// HFQ4G256 (hipfire): 4.25 bpw, 256 elements. byte j: low nibble = element 2j, high = 2j+1;
// value = scale * q + zero.
struct block_hfq4g256 { float scale; float zero; hf_u8 qs[128]; };
static_assert(sizeof(block_hfq4g256) == 136, "HFQ4G256 block is 136 bytes");

// Byte offsets used by the kernels (they match the structs above; asserted so they stay so).
#define HF_Q4K_SCALES 4
#define HF_Q4K_QS 16
#define HF_Q6K_QH 128
#define HF_Q6K_SC 192
#define HF_Q6K_D 208
#define HF_HFQ_QS 8
#define HF_Q5_0_QH 2
#define HF_Q5_0_QS 6
#define HF_Q5_1_QH 4
#define HF_Q5_1_QS 8
#define HF_Q5K_QH 16
#define HF_Q5K_QS 48
#define HF_IQ4XS_SL 4
#define HF_Q3K_QS 32
#define HF_Q3K_SC 96
#define HF_Q3K_D 108
#define HF_Q3K_SCALE_OFFSET 32 // s - 32: the 6-bit scale code is biased
#define HF_Q2K_QS 16
#define HF_Q2K_D 80
#define HF_IQ4XS_QS 8
#define HF_IQ4XS_SCALE_OFFSET 32 // ls - 32: the 6-bit scale code is biased
// NVRTC has no offsetof; each offset is pinned by the size of the block's leading fields instead.
struct q4k_head { hf_u16 d; hf_u16 dmin; };
struct q4k_head_sc { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; };
static_assert(sizeof(q4k_head) == HF_Q4K_SCALES, "q4_k scales offset");
static_assert(sizeof(q4k_head_sc) == HF_Q4K_QS, "q4_k qs offset");
struct q6k_head { hf_u8 ql[128]; };
struct q6k_head_qh { hf_u8 ql[128]; hf_u8 qh[64]; };
struct q6k_head_sc { hf_u8 ql[128]; hf_u8 qh[64]; signed char scales[16]; };
static_assert(sizeof(q6k_head) == HF_Q6K_QH, "q6_k qh offset");
static_assert(sizeof(q6k_head_qh) == HF_Q6K_SC, "q6_k scales offset");
static_assert(sizeof(q6k_head_sc) == HF_Q6K_D, "q6_k d offset");
struct hfq_head { float scale; float zero; };
static_assert(sizeof(hfq_head) == HF_HFQ_QS, "hfq4g256 qs offset");

struct q5_0_head { hf_u16 d; };
struct q5_0_head_qh { hf_u16 d; hf_u8 qh[4]; };
static_assert(sizeof(q5_0_head) == HF_Q5_0_QH, "q5_0 qh offset");
static_assert(sizeof(q5_0_head_qh) == HF_Q5_0_QS, "q5_0 qs offset");
struct q5_1_head { hf_u16 d; hf_u16 m; };
struct q5_1_head_qh { hf_u16 d; hf_u16 m; hf_u8 qh[4]; };
static_assert(sizeof(q5_1_head) == HF_Q5_1_QH, "q5_1 qh offset");
static_assert(sizeof(q5_1_head_qh) == HF_Q5_1_QS, "q5_1 qs offset");
struct q5k_head_sc { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; };
struct q5k_head_qh { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; hf_u8 qh[32]; };
static_assert(sizeof(q5k_head_sc) == HF_Q5K_QH, "q5_k qh offset");
static_assert(sizeof(q5k_head_qh) == HF_Q5K_QS, "q5_k qs offset");
struct iq4xs_head { hf_u16 d; hf_u16 scales_h; };
struct iq4xs_head_sl { hf_u16 d; hf_u16 scales_h; hf_u8 scales_l[4]; };
static_assert(sizeof(iq4xs_head) == HF_IQ4XS_SL, "iq4_xs scales_l offset");
static_assert(sizeof(iq4xs_head_sl) == HF_IQ4XS_QS, "iq4_xs qs offset");

struct q3k_head { hf_u8 hmask[32]; };
struct q3k_head_qs { hf_u8 hmask[32]; hf_u8 qs[64]; };
struct q3k_head_sc { hf_u8 hmask[32]; hf_u8 qs[64]; hf_u8 scales[12]; };
static_assert(sizeof(q3k_head) == HF_Q3K_QS, "q3_k qs offset");
static_assert(sizeof(q3k_head_qs) == HF_Q3K_SC, "q3_k scales offset");
static_assert(sizeof(q3k_head_sc) == HF_Q3K_D, "q3_k d offset");
struct q2k_head { hf_u8 scales[16]; };
struct q2k_head_qs { hf_u8 scales[16]; hf_u8 qs[64]; };
static_assert(sizeof(q2k_head) == HF_Q2K_QS, "q2_k qs offset");
static_assert(sizeof(q2k_head_qs) == HF_Q2K_D, "q2_k d offset");

// Activation quantised per GEMV (like ggml's q8_1): per 32 elements, int8 qs and (d, d * sum(qs)).
#define HF_QX_BLOCK 32
