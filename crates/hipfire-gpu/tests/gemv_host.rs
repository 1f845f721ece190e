//! `kernels/gemv.cu` compiled for the host (g++) and run on emulated thread blocks
//! (tests/host/gemv_host.cpp: a block's threads are fibers switched at the barriers and shuffles):
//! every column of the multi-column GEMV kernel against the general kernel on that column alone,
//! bit for bit, and against the f64 reference, with poisoned outputs, for every format, load width
//! and form, on the default shape and a k-split shape. Runs on any machine with g++ (skips, saying
//! so, without it); the GPU tier (`tests/gpu_gemv.rs`) runs the same comparison on the device.

mod common;

use common::{check_rows, random_weights, random_x, rng, uses_int8_activation};
use hipfire_gpu::{GemvForm, RowRange, GEMV_MAX_COLS, GEMV_SOURCE, QX_BLOCK};
use hipfire_quant::Format;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Quiet NaN bit pattern of the outputs' poison (any value left unwritten keeps exactly these bits).
const POISON: u32 = 0x7FC0_0000;
/// Elements per kernel block of the float formats (`hipfire_gpu::gemv::FLOAT_KERNEL_BLOCK`).
const FLOAT_BLOCK: usize = hipfire_gpu::gemv::FLOAT_KERNEL_BLOCK;
/// The kernel shapes compiled: (name, compiler options). The default shape
/// (`GemvConfig::default`: 4 warps x 2 rows) and the k-split shape of tests/gpu_gemv.rs
/// (`KSPLIT_CONFIG`: 4 warps sharing each row's tiles).
const SHAPES: [(&str, &[&str]); 2] = [
    ("4x2x1", &["-DHF_WARPS=4", "-DHF_ROWS=2", "-DHF_KSPLIT=1"]),
    ("4x1x4", &["-DHF_WARPS=4", "-DHF_ROWS=1", "-DHF_KSPLIT=4"]),
];
/// Column counts: a partial group (3) and a full group plus a partial one (11).
const COLS: [usize; 2] = [3, 11];

/// The harness's source (embedded, like the kernels, so the test binary needs no source tree).
const HARNESS_CPP: &str = include_str!("host/gemv_host.cpp");

/// The harness for one shape, built into `dir` from the embedded gemv.cu (`GEMV_SOURCE`), whose
/// dynamic shared-memory declaration is made a plain `extern` there (the harness defines
/// `__shared__` as `static`), and its headers; `None` (after printing why) without g++.
fn harness(dir: &Path, name: &str, options: &[&str]) -> Option<PathBuf> {
    let src = GEMV_SOURCE.source;
    assert_eq!(
        src.matches("extern __shared__").count(),
        1,
        "gemv.cu's dynamic shared memory: the harness rewrites exactly one declaration"
    );
    let files = [
        ("gemv.cu", src.replace("extern __shared__", "extern")),
        ("gemv_host.cpp", HARNESS_CPP.to_string()),
    ];
    let headers = GEMV_SOURCE.headers.iter().map(|(n, t)| (*n, t.to_string()));
    for (file, text) in files.into_iter().chain(headers) {
        std::fs::write(dir.join(file), text).expect("harness source written");
    }
    let exe = dir.join(format!("gemv_host_{name}"));
    let status = Command::new("g++")
        .args(["-std=c++17", "-O1", "-w", "-ffp-contract=off"])
        .args(options)
        .arg(format!("-DHF_MAX_COLS={GEMV_MAX_COLS}"))
        .arg("-I")
        .arg(dir)
        .arg(dir.join("gemv_host.cpp"))
        .arg("-o")
        .arg(&exe)
        .status();
    match status {
        Ok(s) if s.success() => Some(exe),
        Ok(s) => panic!("g++ failed to build the GEMV harness: {s}"),
        Err(e) => {
            println!("skipped: g++ not runnable ({e})");
            None
        }
    }
}

fn floats(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .expect("harness output")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn write_floats(path: &Path, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
    std::fs::write(path, bytes).expect("input written");
}

/// Column c's activation as the kernels multiplied it (x̂ = d·q for the int8 formats, x for the
/// float ones) and each element's quantisation step, from the harness's prepared activation.
fn effective_x(
    act: &[u8],
    x: &[f32],
    k: usize,
    cols: usize,
    c: usize,
    format: Format,
) -> (Vec<f64>, Vec<f64>) {
    if !uses_int8_activation(format) {
        return (x.iter().map(|&v| v as f64).collect(), vec![0.0; k]);
    }
    let (qs, ds) = act.split_at(cols * k);
    let d = |j: usize| {
        let o = 8 * ((c * k + j) / QX_BLOCK);
        f32::from_le_bytes([ds[o], ds[o + 1], ds[o + 2], ds[o + 3]]) as f64
    };
    let xhat = (0..k).map(|j| d(j) * qs[c * k + j] as i8 as f64).collect();
    (xhat, (0..k).map(d).collect())
}

#[test]
fn host_compiled_multi_column_gemv_matches_the_general_kernel_per_column() {
    let dir = std::env::temp_dir().join(format!("hipfire-gemv-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let mut r = rng(0x5EED_0010);
    for (shape, options) in SHAPES {
        let Some(exe) = harness(&dir, shape, options) else {
            return;
        };
        for format in Format::ALL.into_iter().filter(|f| f.has_gpu_kernel()) {
            let elems = if uses_int8_activation(format) {
                format.block_elems()
            } else {
                FLOAT_BLOCK
            };
            // Several tiles per row (k = 4096: two for the 256-element formats, so the k-split
            // shape has idle warps), and for 32-element and float formats k = 96 (rows only 2- or
            // 4-byte aligned: the narrow loads). m = 13, rows [2, 11): a partial last block and a
            // range starting inside the matrix (the emulation runs every thread of every block in
            // turn, so the shapes stay small).
            let mut ks = vec![4096];
            if format.block_elems() <= 32 {
                ks.push(96);
            }
            for k in ks {
                let (m, rows) = (13, RowRange::new(2, 11));
                let rb = format.row_bytes(k).expect("row bytes");
                let wbytes = random_weights(format, m, k, &mut r);
                std::fs::write(dir.join("w.bin"), &wbytes).expect("w");
                for (cols, form) in COLS
                    .into_iter()
                    .flat_map(|c| [GemvForm::Plain, GemvForm::Residual].map(|f| (c, f)))
                {
                    let ldy = m + 3;
                    let xs = random_x(cols * k, &mut r);
                    let y0: Vec<f32> = (0..(cols - 1) * ldy + m)
                        .map(|i| {
                            let written = (rows.start..rows.end).contains(&(i % ldy));
                            if form == GemvForm::Residual && written {
                                r_value(&mut r)
                            } else {
                                f32::from_bits(POISON)
                            }
                        })
                        .collect();
                    write_floats(&dir.join("x.bin"), &xs);
                    write_floats(&dir.join("y0.bin"), &y0);
                    // The width the launcher picks: the widest that divides the row stride.
                    if let Some(width) = [16, 4, 2].into_iter().find(|w| rb % w == 0) {
                        let what = format!("{shape} {format} k={k} cols={cols} {form:?} v{width}");
                        let form_name = if form == GemvForm::Plain {
                            "plain"
                        } else {
                            "residual"
                        };
                        let args: Vec<String> = vec![
                            format.name().into(),
                            width.to_string(),
                            form_name.into(),
                            k.to_string(),
                            elems.to_string(),
                            rb.to_string(),
                            m.to_string(),
                            rows.start.to_string(),
                            rows.end.to_string(),
                            cols.to_string(),
                            ldy.to_string(),
                        ];
                        let files = ["w.bin", "x.bin", "y0.bin", "out"].map(|f| dir.join(f));
                        let out = Command::new(&exe)
                            .args(&args)
                            .args(&files)
                            .output()
                            .expect("harness runs");
                        assert!(
                            out.status.success(),
                            "{what}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                        let single = floats(&dir.join("out.single"));
                        let multi = floats(&dir.join("out.cols"));
                        for (i, (s, c)) in single.iter().zip(&multi).enumerate() {
                            let (col, row) = (i / ldy, i % ldy);
                            assert_eq!(
                                c.to_bits(),
                                s.to_bits(),
                                "{what}: column {col} row {row}: multi-column != general kernel"
                            );
                            if !(rows.start..rows.end).contains(&row) {
                                assert_eq!(
                                    c.to_bits(),
                                    POISON,
                                    "{what}: wrote column {col} row {row} outside the range"
                                );
                            }
                        }
                        let act = std::fs::read(dir.join("out.act")).expect("activation");
                        let (a, b) = (rows.start, rows.end);
                        for c in 0..cols {
                            let x = &xs[c * k..(c + 1) * k];
                            let (xhat, dstep) = effective_x(&act, x, k, cols, c, format);
                            let col = |v: &[f32]| v[c * ldy + a..c * ldy + b].to_vec();
                            check_rows(
                                format,
                                &wbytes[a * rb..b * rb],
                                k,
                                x,
                                &xhat,
                                &dstep,
                                &col(&y0),
                                &col(&multi),
                                form,
                            );
                        }
                    }
                }
            }
        }
        println!("{shape}: every format, width and form bit-identical per column");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random starting value for the residual form.
fn r_value(r: &mut rand_chacha::ChaCha8Rng) -> f32 {
    random_x(1, r)[0]
}
