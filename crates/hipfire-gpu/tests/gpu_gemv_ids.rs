//! GPU tier: the GEMV with expert ids (`GemvKernels::gemv_ids`, the routed experts of a MoE
//! layer) against plain one-column launches of the same expert on the same column: bit for bit,
//! for every pair, in both input forms (a token's row shared by its slots; a column per pair),
//! with experts in VRAM, in pinned host memory, and mixed in one set. The output is poisoned first
//! and its padding between pairs must stay poisoned. `#[ignore]`d, as it needs a GPU:
//! `--include-ignored` runs it.

mod common;

use common::{gpu, place, random_weights, random_x, rng, Placed};
use hipfire_gpu::{
    Activation, Context, ExpertSet, GemvForm, GemvKernels, IdsInput, IdsShape, KernelRegistry,
    RowRange, Stream, WeightRef,
};
use hipfire_quant::Format;
use std::sync::Arc;

/// Quiet NaN bit pattern used to poison outputs: anything left unwritten keeps exactly these bits.
const POISON: u32 = 0x7FC0_0000;
/// Experts in the set.
const EXPERTS: usize = 5;
/// Token rows and slots (experts used) a row.
const ROWS: usize = 3;
const USED: usize = 2;
/// Floats of padding between pairs' outputs (`ldy = m + PAD`): never written.
const PAD: usize = 3;

/// `cols` columns of `k` values (column-major) as one activation.
fn prepare(
    ctx: &Arc<Context>,
    stream: &Stream,
    kern: &GemvKernels,
    xs: &[f32],
    k: usize,
) -> Activation {
    let cols = xs.len() / k;
    let mut xd = ctx.alloc::<f32>(xs.len()).expect("x");
    xd.upload(stream, xs).expect("x upload");
    let mut act = Activation::with_columns(ctx, k, cols).expect("activation");
    kern.prepare_cols(stream, &xd, &mut act, cols)
        .expect("prepare_cols");
    stream.synchronize().expect("sync");
    act
}

/// Each pair's expert: repeats, both ends of the table, and one id out of range (clamped to the
/// last expert by the kernel, as documented).
fn ids() -> Vec<i32> {
    vec![4, 0, 2, 2, 1, EXPERTS as i32 + 7]
}

fn clamp(id: i32) -> usize {
    id.clamp(0, EXPERTS as i32 - 1) as usize
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn ids_gemv_is_bit_exact_with_plain_launches_per_pair() {
    let ctx = gpu();
    let stream = ctx.new_stream().expect("stream");
    let dir = std::env::temp_dir().join(format!("hipfire-gpu-ids-{}", std::process::id()));
    let registry = KernelRegistry::with_cache_dir(&ctx, dir);
    let kern = GemvKernels::new(&registry).expect("GEMV module");
    let mut r = rng(0x1d5);
    let pairs = ROWS * USED;
    let ids = ids();
    assert_eq!(ids.len(), pairs);
    let mut ids_dev = ctx.alloc::<i32>(pairs).expect("ids");
    ids_dev.upload(&stream, &ids).expect("ids upload");
    let mut failures = Vec::new();
    // Odd m (a partial row block); k a multiple of every format's block.
    let (m, k) = (97, 512);
    for format in [
        Format::F32,
        Format::F16,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
    ] {
        let bytes: Vec<Vec<u8>> = (0..EXPERTS)
            .map(|_| random_weights(format, m, k, &mut r))
            .collect();
        // All in VRAM, all host-mapped, and alternating.
        for (memory, host) in [
            ("vram", [false; EXPERTS]),
            ("host", [true; EXPERTS]),
            ("mixed", [false, true, false, true, false]),
        ] {
            let placed: Vec<Placed> = bytes
                .iter()
                .zip(host)
                .map(|(b, h)| place(&ctx, &stream, b, h))
                .collect();
            let refs: Vec<WeightRef<'_>> = placed
                .iter()
                .map(|p| WeightRef::new(p.mem(), 0, format, m, k).expect("weight"))
                .collect();
            // SAFETY: `placed` outlives every launch below (the stream is synchronised by each
            // download before it drops).
            let set = unsafe { ExpertSet::new(&ctx, &stream, &refs) }.expect("expert set");
            assert_eq!(set.host_mapped(), host.iter().filter(|&&h| h).count());
            for input in [IdsInput::TokenRow, IdsInput::Pair] {
                let cols = match input {
                    IdsInput::TokenRow => ROWS,
                    IdsInput::Pair => pairs,
                };
                let xs: Vec<f32> = (0..cols).flat_map(|_| random_x(k, &mut r)).collect();
                let act = prepare(&ctx, &stream, &kern, &xs, k);
                let ldy = m + PAD;
                let n = (pairs - 1) * ldy + m;
                let mut y = ctx.alloc::<f32>(n).expect("y");
                y.upload(&stream, &vec![f32::from_bits(POISON); n])
                    .expect("poison");
                let shape = IdsShape {
                    pairs,
                    n_used: USED,
                    input,
                };
                kern.gemv_ids(&stream, &set, &ids_dev, shape, &act, &mut y, ldy)
                    .expect("ids launch");
                let mut got = vec![0f32; n];
                y.download(&stream, &mut got).expect("y download");
                for (p, &id) in ids.iter().enumerate() {
                    let col = match input {
                        IdsInput::TokenRow => p / USED,
                        IdsInput::Pair => p,
                    };
                    let one = prepare(&ctx, &stream, &kern, &xs[col * k..(col + 1) * k], k);
                    let mut yr = ctx.alloc::<f32>(m).expect("y ref");
                    kern.gemv(
                        &stream,
                        &refs[clamp(id)],
                        &one,
                        &mut yr,
                        RowRange::all(m),
                        GemvForm::Plain,
                    )
                    .expect("plain launch");
                    let mut want = vec![0f32; m];
                    yr.download(&stream, &mut want).expect("y ref download");
                    let have = &got[p * ldy..p * ldy + m];
                    if let Some(i) = (0..m).find(|&i| have[i].to_bits() != want[i].to_bits()) {
                        failures.push(format!(
                            "{} {memory} {input:?} pair {p} (expert {id}) row {i}: {} vs {}",
                            format.name(),
                            have[i],
                            want[i]
                        ));
                    }
                    if p + 1 < pairs {
                        let gap = &got[p * ldy + m..(p + 1) * ldy];
                        if gap.iter().any(|v| v.to_bits() != POISON) {
                            failures.push(format!(
                                "{} {memory} {input:?}: the padding after pair {p} was written",
                                format.name()
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn ids_gemv_refuses_bad_shapes_with_typed_errors() {
    let ctx = gpu();
    let stream = ctx.new_stream().expect("stream");
    let dir = std::env::temp_dir().join(format!("hipfire-gpu-ids-bad-{}", std::process::id()));
    let kern = GemvKernels::new(&KernelRegistry::with_cache_dir(&ctx, dir)).expect("GEMV");
    let mut r = rng(7);
    let (m, k) = (16, 64);
    let a = place(
        &ctx,
        &stream,
        &random_weights(Format::Q8_0, m, k, &mut r),
        false,
    );
    let b = place(
        &ctx,
        &stream,
        &random_weights(Format::Q8_0, m, 2 * k, &mut r),
        false,
    );
    let wa = WeightRef::new(a.mem(), 0, Format::Q8_0, m, k).expect("a");
    let wb = WeightRef::new(b.mem(), 0, Format::Q8_0, m, 2 * k).expect("b");
    // SAFETY: a and b outlive the sets (nothing is launched over a refused set).
    assert!(unsafe { ExpertSet::new(&ctx, &stream, &[wa.clone(), wb]) }.is_err());
    assert!(unsafe { ExpertSet::new(&ctx, &stream, &[]) }.is_err());
    // SAFETY: as above; launches below are refused before they queue.
    let set = unsafe { ExpertSet::new(&ctx, &stream, &[wa]) }.expect("set");
    let ids = ctx.alloc::<i32>(4).expect("ids");
    let act = Activation::with_columns(&ctx, k, 2).expect("act");
    let mut y = ctx.alloc::<f32>(4 * m).expect("y");
    let shape = |pairs, input| IdsShape {
        pairs,
        n_used: 2,
        input,
    };
    // Pairs not a multiple of the slots; more columns than the activation holds; ids too short;
    // y too short.
    for (s, ldy) in [
        (shape(3, IdsInput::TokenRow), m),
        (shape(4, IdsInput::Pair), m),
        (shape(6, IdsInput::TokenRow), m),
        (shape(4, IdsInput::TokenRow), 2 * m),
    ] {
        let e = kern.gemv_ids(&stream, &set, &ids, s, &act, &mut y, ldy);
        assert!(e.is_err(), "{s:?} ldy {ldy} was accepted");
    }
    kern.gemv_ids(
        &stream,
        &set,
        &ids,
        shape(4, IdsInput::TokenRow),
        &act,
        &mut y,
        m,
    )
    .expect("a valid launch");
    stream.synchronize().expect("sync");
}
