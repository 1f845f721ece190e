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

// Q4_K: 4.5 bpw, 256 elements: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes.
struct block_q4_k { hf_u16 d; hf_u16 dmin; hf_u8 scales[12]; hf_u8 qs[128]; };
static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");

// Q6_K: 6.5625 bpw, 256 elements: 4 low bits in ql, 2 high bits in qh, 16 int8 scales (one per 16).
struct block_q6_k { hf_u8 ql[128]; hf_u8 qh[64]; signed char scales[16]; hf_u16 d; };
static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");

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

// Activation quantised per GEMV (like ggml's q8_1): per 32 elements, int8 qs and (d, d * sum(qs)).
#define HF_QX_BLOCK 32
