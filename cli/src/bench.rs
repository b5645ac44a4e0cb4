//! `quantshadow bench`: throughput of the collector and the report on this machine.
//!
//! Benchmarks, not tests: they print a table to paste into docs/measurements/ and never fail
//! on a number. Synthetic records are real encoded observations (about 400 bytes, with metrics,
//! scales and a 16-probe sketch), so decoding and validation cost what they cost in production.

use crate::collect::{CollectOptions, Collector};
use crate::report;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::{MetricSums, WorstRow};
use quantshadow_runtime::problem::{GemmProblem, ScaleGranularity, ScaleSpec};
use quantshadow_runtime::record::{
    self, CheckMode, ClosingRecord, GemmObservation, ProblemSummary, Record, SessionRecord,
};
use quantshadow_runtime::rng::SplitMix64;
use quantshadow_runtime::runfile::RunWriter;
use quantshadow_runtime::transport::{push_frame, Address};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub which: Which,
    /// Scratch directory (default: a new directory under the system temp dir, removed after).
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// Collector ingest: concurrent clients stream observations over a unix socket.
    Collector {
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
        clients: u16,
        #[arg(long, default_value_t = 250_000, value_parser = clap::value_parser!(u64).range(1..))]
        records_per_client: u64,
        /// Store frames without decoding them (the transport and run file alone).
        #[arg(long)]
        no_validate: bool,
    },
    /// The reference kernels on the present GPU (full GEMM, sketch, compare).
    Gpu {
        /// Only these sections (comma-separated: copy, reference, sketch, compare).
        #[arg(long, value_delimiter = ',', default_value = "copy,reference,sketch,compare",
              value_parser = ["copy", "reference", "sketch", "compare"])]
        only: Vec<String>,
        /// Slots of the results ring in mapped host memory.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
        ring_slots: u32,
        /// Sketch probes k, comma-separated for tables side by side (default: the shim's).
        #[arg(long, value_delimiter = ',', default_values_t = [quantshadow_runtime::sketch::DEFAULT_PROBES],
              value_parser = clap::value_parser!(u32).range(1..=32))]
        probes: Vec<u32>,
        /// Sketch section: only these M values (comma-separated), e.g. to profile one case.
        #[arg(long = "m", value_delimiter = ',', default_values_t = [1u64, 16, 256, 4096],
              value_parser = clap::value_parser!(u64).range(1..))]
        sketch_m: Vec<u64>,
    },
    /// Report generation from a run file of this many observations.
    Report {
        #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
        records: u64,
        /// Distinct sites per configuration.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
        sites: u32,
        /// Configurations (session labels).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        configurations: u32,
    },
}

pub fn main(args: Args) -> ExitCode {
    let scratch = match scratch_dir(args.dir.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quantshadow bench: cannot create a scratch directory: {e}");
            return ExitCode::from(crate::exit::BAD_INPUT);
        }
    };
    let result = match args.which {
        Which::Collector { clients, records_per_client, no_validate } => {
            bench_collector(&scratch.path, clients as usize, records_per_client, !no_validate)
        }
        // Printed as it goes; nothing more to print at the end.
        Which::Gpu { only, ring_slots, probes, sketch_m } => {
            crate::bench_gpu::run(&only, ring_slots, &probes, &sketch_m).map(|_| String::new())
        }
        Which::Report { records, sites, configurations } => {
            bench_report(&scratch.path, records, sites, configurations)
        }
    };
    match result {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quantshadow bench: {e}");
            ExitCode::from(crate::exit::FAILED)
        }
    }
}

/// A directory removed on drop when we made it.
struct Scratch {
    path: PathBuf,
    owned: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn scratch_dir(given: Option<&Path>) -> std::io::Result<Scratch> {
    match given {
        Some(p) => {
            std::fs::create_dir_all(p)?;
            Ok(Scratch { path: p.to_path_buf(), owned: false })
        }
        None => {
            let path = std::env::temp_dir().join(format!("quantshadow-bench-{}", std::process::id()));
            std::fs::create_dir_all(&path)?;
            Ok(Scratch { path, owned: true })
        }
    }
}

fn session(session_id: u64, label: &str) -> Record {
    Record::Session(SessionRecord {
        session_id,
        host: "bench".into(),
        pid: session_id as u32,
        rank: 0,
        device_name: "synthetic".into(),
        device_arch: "none".into(),
        library_versions: Vec::new(),
        label: label.into(),
        start_time_ns: 0,
        settings: Vec::new(),
    })
}

/// A realistic observation: an FP8 block-scaled site with metrics and a 16-probe sketch.
fn observation(session_id: u64, site: u32, call_seq: u64, rng: &mut SplitMix64) -> Record {
    let mut problem =
        GemmProblem::row_major(1 + rng.below(4096), 4096, 4096, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    problem.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
    problem.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
    let mut sums = MetricSums::default();
    for _ in 0..64 {
        let r = rng.normal();
        sums.add(r + 1e-3 * rng.normal(), r);
    }
    let mut metrics = sums.finish();
    metrics.worst_row = Some(WorstRow { index: rng.below(problem.m), cosine: 0.9995 });
    let sketch: Vec<f32> = (0..16).map(|_| rng.normal() as f32).collect();
    Record::Observation(GemmObservation {
        session_id,
        site_id: site as u64 * 0x9E37_79B9,
        site_ordinal: site,
        site_name: Some(format!("model.layers.{}.mlp.down_proj", site / 4)),
        call_seq,
        entry_point: "cublasLtMatmul".into(),
        backend: None,
        problem: ProblemSummary::from(&problem),
        mode: CheckMode::Sketch,
        metrics: Some(metrics),
        rows_checked: 256,
        sketch_seed: site as u64,
        sketch_prod: sketch.clone(),
        sketch_ref: sketch,
        logits: None,
        logits_rows: Vec::new(),
        flags: 0,
        timestamp_ns: call_seq,
    })
}

fn closing(session_id: u64, calls: u64) -> Record {
    Record::Closing(ClosingRecord {
        session_id,
        calls_seen: calls,
        sampled: calls,
        checked: calls,
        skipped: Vec::new(),
        dropped: 0,
        end_time_ns: 0,
    })
}

fn bench_collector(dir: &Path, clients: usize, per_client: u64, validate: bool) -> Result<String, String> {
    let socket = dir.join("bench.sock");
    let run_file = dir.join("bench-collector.qsr");
    let _ = std::fs::remove_file(&run_file);
    let options = CollectOptions { validate, ..CollectOptions::default() };
    let collector = Collector::start_with(&Address::Unix(socket.clone()), &run_file, options)
        .map_err(|e| format!("collector: {e}"))?;

    // Pre-encode a pool of distinct frames per client so the clients measure the collector,
    // not the encoder; each client cycles through its pool.
    const POOL: u64 = 512;
    let pools: Vec<(Vec<u8>, Vec<u8>)> = (0..clients)
        .map(|c| {
            let session_id = 1000 + c as u64;
            let mut rng = SplitMix64::new(session_id);
            let mut preamble = Vec::new();
            push_frame(&mut preamble, &record::encode(&session(session_id, "bench"))).expect("small frame");
            let mut frames = Vec::new();
            for i in 0..POOL {
                let payload = record::encode(&observation(session_id, (i % 64) as u32, i, &mut rng));
                push_frame(&mut frames, &payload).expect("small frame");
            }
            (preamble, frames)
        })
        .collect();
    let frame_bytes = pools[0].1.len() as f64 / POOL as f64;
    let total = clients as u64 * (per_client + 2);

    let started = Instant::now();
    let outcome: Result<(), String> = std::thread::scope(|scope| {
        let handles: Vec<_> = pools
            .iter()
            .enumerate()
            .map(|(c, (preamble, frames))| {
                let socket = &socket;
                scope.spawn(move || -> Result<(), String> {
                    let mut stream = UnixStream::connect(socket).map_err(|e| format!("client {c}: {e}"))?;
                    stream.write_all(preamble).map_err(|e| e.to_string())?;
                    let mut sent = 0u64;
                    while sent < per_client {
                        let n = (per_client - sent).min(POOL);
                        let bytes = frame_prefix(frames, n as usize);
                        stream.write_all(bytes).map_err(|e| e.to_string())?;
                        sent += n;
                    }
                    let mut tail = Vec::new();
                    push_frame(&mut tail, &record::encode(&closing(1000 + c as u64, per_client)))
                        .map_err(|e| e.to_string())?;
                    stream.write_all(&tail).map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("client panicked".into())))
    });
    outcome?;
    // Ingest is done when every record is in the run file's writer.
    let deadline = Instant::now() + Duration::from_secs(120);
    while collector.stats().records < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = started.elapsed();
    let summary = collector.shutdown();
    let stored = summary.stats.records;
    let rate = stored as f64 / elapsed.as_secs_f64();
    Ok(format!(
        "| clients | records | frame bytes | validate | seconds | records/s | MB/s | bad clients |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n\
         | {clients} | {stored} of {total} | {frame_bytes:.0} | {validate} | {:.3} | {:.0} | {:.1} | {} |",
        elapsed.as_secs_f64(),
        rate,
        rate * frame_bytes / 1e6,
        summary.stats.bad_clients
    ))
}

/// The first `n` frames of a buffer of back-to-back `[u32 len][payload]` frames.
fn frame_prefix(frames: &[u8], n: usize) -> &[u8] {
    let mut offset = 0usize;
    for _ in 0..n {
        let len = u32::from_le_bytes(frames[offset..offset + 4].try_into().expect("4 bytes")) as usize;
        offset += 4 + len;
    }
    &frames[..offset]
}

fn bench_report(dir: &Path, records: u64, sites: u32, configurations: u32) -> Result<String, String> {
    let run_file = dir.join("bench-report.qsr");
    let _ = std::fs::remove_file(&run_file);
    let write_started = Instant::now();
    {
        let (mut writer, _) = RunWriter::open_append(&run_file).map_err(|e| e.to_string())?;
        let per_config = records / configurations.max(1) as u64;
        let mut rng = SplitMix64::new(7);
        for c in 0..configurations {
            let session_id = 1 + c as u64;
            writer
                .append(&record::encode(&session(session_id, &format!("config-{c}"))))
                .map_err(|e| e.to_string())?;
            for i in 0..per_config {
                let payload =
                    record::encode(&observation(session_id, (i % sites as u64) as u32, i, &mut rng));
                writer.append(&payload).map_err(|e| e.to_string())?;
            }
            writer.append(&record::encode(&closing(session_id, per_config))).map_err(|e| e.to_string())?;
        }
        writer.flush().map_err(|e| e.to_string())?;
    }
    let write_seconds = write_started.elapsed().as_secs_f64();
    let file_mb = std::fs::metadata(&run_file).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);

    let args = report::Args {
        files: vec![run_file.clone()],
        out: Some(dir.join("bench-report.md")),
        json: None,
        thresholds: None,
    };
    let started = Instant::now();
    let built = report::run(&args).map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let sites_reported: usize = built.configurations.iter().map(|c| c.sites.len()).sum();
    Ok(format!(
        "| observations | run file MB | configurations | sites | write s | report s | records/s |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n\
         | {records} | {file_mb:.0} | {configurations} | {sites_reported} | {write_seconds:.2} | {seconds:.2} | {:.0} |",
        records as f64 / seconds
    ))
}
