//! `kernels/dequant.cu` compiled for the host (g++) and run thread by thread over the grid the
//! launcher computes: every format's layout, arithmetic and launch geometry against
//! hipfire-quant's CPU dequantiser (bit for bit) and the independent f64 reference, with poisoned
//! outputs. Runs on any machine with g++ (skips, saying so, without it); the GPU tier
//! (`tests/gpu_dequant.rs`) runs the same checks on the device.

mod common;

use common::dequant::{
    check_against_f64, check_convert, check_strided, convert_inputs, expected_f16, formats, shapes,
    unstride, weight_sources, POISON,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The harness, built once per test into a private folder; `None` (after printing why) without g++.
fn harness(dir: &Path) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("dequant_host");
    let status = Command::new("g++")
        .args(["-std=c++17", "-O1", "-w", "-ffp-contract=off", "-I"])
        .arg(root.join("../../kernels"))
        .arg(root.join("tests/host/dequant_host.cpp"))
        .arg("-o")
        .arg(&exe)
        .status();
    match status {
        Ok(s) if s.success() => Some(exe),
        Ok(s) => panic!("g++ failed to build the dequant harness: {s}"),
        Err(e) => {
            println!("skipped: g++ not runnable ({e})");
            None
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hipfire-dequant-host-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn run(exe: &Path, args: &[String]) {
    let out = Command::new(exe).args(args).output().expect("harness runs");
    assert!(
        out.status.success(),
        "harness {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_u16(path: &Path) -> Vec<u16> {
    std::fs::read(path)
        .expect("harness output")
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

#[test]
fn host_compiled_dequant_matches_the_cpu_dequantiser_bit_for_bit() {
    let dir = scratch("dequant");
    let Some(exe) = harness(&dir) else { return };
    let (wpath, opath) = (dir.join("w.bin"), dir.join("out.bin"));
    for (fi, format) in formats().into_iter().enumerate() {
        for (si, s) in shapes(format).into_iter().enumerate() {
            // Packed rows, and on the first shape rows 8 and 24 values apart (gaps poisoned).
            let strides: &[usize] = if si == 0 {
                &[s.k, s.k + 8, s.k + 24]
            } else {
                &[s.k]
            };
            for (source, w) in weight_sources(format, s.m, s.k, (fi * 16 + si) as u64) {
                std::fs::write(&wpath, &w).expect("weights written");
                let rb = format.row_bytes(s.k).expect("k fits");
                let want = expected_f16(format, &w, s.k, s.rows);
                for &stride in strides {
                    run(
                        &exe,
                        &[
                            "dequant".into(),
                            format.name().into(),
                            rb.to_string(),
                            s.k.to_string(),
                            s.rows.start.to_string(),
                            s.rows.len().to_string(),
                            stride.to_string(),
                            wpath.display().to_string(),
                            opath.display().to_string(),
                        ],
                    );
                    let out = read_u16(&opath);
                    let what = format!(
                        "{format} {source} m={} k={} rows={:?} stride {stride}",
                        s.m, s.k, s.rows
                    );
                    let (off, worst) = check_strided(&out, &want, s.rows.len(), s.k, stride)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(
                        off, 0,
                        "{what}: {off} values differ, up to {worst} f16 ulps"
                    );
                    let rows = unstride(&out, s.rows.len(), s.k, stride);
                    check_against_f64(format, &w, s.k, s.rows, &rows)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn host_compiled_convert_rounds_as_half_does() {
    let dir = scratch("convert");
    let Some(exe) = harness(&dir) else { return };
    let (xpath, opath) = (dir.join("x.bin"), dir.join("out.bin"));
    // Whole vector chunks, a partial last chunk, and odd n (x off 16-byte alignment: scalar path).
    for (seed, n) in [4096usize, 2053 * 8 + 6, 3001, 1].into_iter().enumerate() {
        let x = convert_inputs(n, seed as u64);
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&xpath, bytes).expect("x written");
        run(
            &exe,
            &[
                "convert".into(),
                n.to_string(),
                xpath.display().to_string(),
                opath.display().to_string(),
            ],
        );
        let out = read_u16(&opath);
        check_convert(&x, &out[..n]).unwrap_or_else(|e| panic!("n = {n}: {e}"));
        assert!(
            out[n..].iter().all(|&v| v == POISON),
            "n = {n}: wrote past n"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
