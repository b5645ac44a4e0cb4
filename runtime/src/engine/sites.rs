//! Sampling decisions and site identity.
//!
//! Sampling is decided on a cheap per-call key (the hook's `quick_key`) so that an unsampled
//! call costs a hash and a counter. A sampled call is decoded and mapped to its site: (entry
//! point, N, K, formats, scale scheme, weight pointer), numbered by first appearance among
//! sampled calls, optionally named from a map file of weight pointer -> parameter name.

use super::config::Sampling;
use crate::intercept::InterceptedGemm;
use crate::rng::mix64;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots of the lock-free counter table (a power of two); keys beyond share one counter.
const SAMPLER_SLOTS: usize = 1 << 14;
/// Probes before a key gives up on finding a slot of its own.
const SAMPLER_PROBES: usize = 16;

/// Per-key call counters and the sampling rule. Lock-free (an open-addressing table of
/// atomics): an unsampled call costs a hash, a few loads and one atomic add.
pub struct Sampler {
    rule: Sampling,
    keys: Box<[AtomicU64]>,
    counts: Box<[AtomicU64]>,
    overflow: AtomicU64,
}

impl Sampler {
    pub fn new(rule: Sampling) -> Sampler {
        let table = |_| AtomicU64::new(0);
        Sampler {
            rule,
            keys: (0..SAMPLER_SLOTS).map(table).collect(),
            counts: (0..SAMPLER_SLOTS).map(table).collect(),
            overflow: AtomicU64::new(0),
        }
    }

    /// Counts a call of `key` and says whether it is checked.
    pub fn take(&self, key: u64) -> bool {
        if self.rule == Sampling::ALL {
            return true;
        }
        // 0 marks an empty slot: keys are remapped away from it.
        let h = mix64(key).max(1);
        let mut counter = &self.overflow;
        for i in 0..SAMPLER_PROBES {
            let slot = (h as usize).wrapping_add(i) & (SAMPLER_SLOTS - 1);
            let k = self.keys[slot].load(Ordering::Acquire);
            if k == h {
                counter = &self.counts[slot];
                break;
            }
            if k == 0 {
                match self.keys[slot].compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        counter = &self.counts[slot];
                        break;
                    }
                    Err(other) if other == h => {
                        counter = &self.counts[slot];
                        break;
                    }
                    Err(_) => continue,
                }
            }
        }
        self.rule.takes(counter.fetch_add(1, Ordering::Relaxed))
    }
}

/// What a call needs to know of its site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteRef {
    pub id: u64,
    pub ordinal: u32,
    /// Checked calls of this site before this one.
    pub epoch: u64,
    /// Shared with the names map: a call copies no string.
    pub name: Option<std::sync::Arc<str>>,
}

struct SiteState {
    ordinal: u32,
    calls: u64,
}

/// The sites of this process.
pub struct Sites {
    map: Mutex<FxHashMap<u64, SiteState>>,
    /// Per shape (the identity without the weight pointer): the weight pointers seen, to spot
    /// shapes whose "weight" is a fresh temporary at every call.
    shapes: Mutex<FxHashMap<u64, ShapeState>>,
    names: FxHashMap<u64, std::sync::Arc<str>>,
}

#[derive(Default)]
struct ShapeState {
    /// Calls per distinct weight pointer (the first TRANSIENT_AFTER + 1 pointers only).
    pointers: FxHashMap<u64, u32>,
    /// Every pointer so far was seen once: the operand is not a weight, and the shape is one site.
    transient: bool,
}

/// Distinct weight pointers, each seen once, after which a shape's B operand is treated as a
/// per-call temporary (e.g. the rotary-embedding products of a Llama forward pass): its calls
/// then share one site instead of making a new site (and new device state) per call. Large
/// enough that the first forward pass of a deep model (one call per same-shaped layer, no
/// repeats yet) never trips it; pointers named in the names map are weights and never count.
const TRANSIENT_AFTER: usize = 256;
/// Shapes tracked for that purpose (bounded memory: at most this many x TRANSIENT_AFTER entries).
const MAX_SHAPES: usize = 4096;

/// Sites remembered; beyond, calls of new sites share one ordinal (bounded memory).
const MAX_SITES: usize = 1 << 16;

impl Sites {
    pub fn new(names_file: Option<&std::path::Path>) -> Sites {
        let names = match names_file {
            None => FxHashMap::default(),
            Some(p) => match load_names(p) {
                Ok(n) => n.into_iter().map(|(ptr, name)| (ptr, std::sync::Arc::from(name))).collect(),
                Err(e) => {
                    super::log::warn(&format!("QUANTSHADOW_NAMES: {e}; sites stay unnamed"));
                    FxHashMap::default()
                }
            },
        };
        Sites { map: Mutex::new(FxHashMap::default()), shapes: Mutex::new(FxHashMap::default()), names }
    }

    /// Identity of a decoded call without its weight pointer: entry, N, K, formats, scales.
    pub fn shape_of(call: &InterceptedGemm) -> u64 {
        let p = &call.problem;
        let scale = |s: &Option<crate::problem::ScaleSpec>| {
            s.map_or(0, |s| mix64(fnv(s.granularity.short_name().as_bytes()) ^ ((s.format as u64) << 8)))
        };
        let mut h = mix64(call.entry.len() as u64 ^ fnv(call.entry.as_bytes()));
        for v in [
            p.n,
            p.k,
            p.a.format as u64,
            p.b.format as u64,
            p.d.format as u64,
            scale(&p.a_scale),
            scale(&p.b_scale),
        ] {
            h = mix64(h ^ v);
        }
        h
    }

    /// Site identity of a decoded call: its shape and weight pointer.
    pub fn id_of(call: &InterceptedGemm) -> u64 {
        mix64(Sites::shape_of(call) ^ call.buffers.b)
    }

    /// The call's site id, folding shapes whose B operand is a per-call temporary.
    fn identity(&self, call: &InterceptedGemm) -> (u64, bool) {
        let shape = Sites::shape_of(call);
        let mut shapes = self.shapes.lock().unwrap_or_else(|e| e.into_inner());
        if self.names.contains_key(&call.buffers.b)
            || (shapes.len() >= MAX_SHAPES && !shapes.contains_key(&shape))
        {
            return (Sites::id_of(call), false);
        }
        let st = shapes.entry(shape).or_default();
        if st.transient {
            return (mix64(shape ^ 0x7472_616e_7369_656e), true);
        }
        let b = call.buffers.b;
        if st.pointers.len() <= TRANSIENT_AFTER || st.pointers.contains_key(&b) {
            *st.pointers.entry(b).or_insert(0) += 1;
        }
        if st.pointers.len() > TRANSIENT_AFTER && st.pointers.values().all(|&n| n == 1) {
            st.transient = true;
            st.pointers.clear();
            return (mix64(shape ^ 0x7472_616e_7369_656e), true);
        }
        (Sites::id_of(call), false)
    }

    pub fn site_of(&self, call: &InterceptedGemm) -> SiteRef {
        let (id, transient) = self.identity(call);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let next = map.len() as u32;
        let (ordinal, epoch) = if map.len() >= MAX_SITES && !map.contains_key(&id) {
            (u32::MAX, 0)
        } else {
            let s = map.entry(id).or_insert(SiteState { ordinal: next, calls: 0 });
            s.calls += 1;
            (s.ordinal, s.calls - 1)
        };
        let name = if transient { None } else { self.names.get(&call.buffers.b).cloned() };
        SiteRef { id, ordinal, epoch, name }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Reads a names map: JSON object {"0x7f00...": "model.layers.0.mlp.up_proj.weight", ...}.
pub fn load_names(path: &std::path::Path) -> Result<HashMap<u64, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let obj = v.as_object().ok_or_else(|| format!("{}: expected a JSON object", path.display()))?;
    let mut out = HashMap::new();
    for (k, v) in obj {
        let addr = k
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .or_else(|| k.parse().ok())
            .ok_or_else(|| format!("{}: key {k:?} is not an address", path.display()))?;
        let name = v.as_str().ok_or_else(|| format!("{}: value of {k} is not a string", path.display()))?;
        out.insert(addr, name.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_counts_per_key() {
        let s = Sampler::new(Sampling { first: 1, every: 2 });
        let a: Vec<bool> = (0..5).map(|_| s.take(7)).collect();
        assert_eq!(a, vec![true, true, false, true, false]);
        assert!(s.take(8), "a new key starts from its own first call");
    }

    #[test]
    fn sampler_is_exact_under_threads() {
        let s = std::sync::Arc::new(Sampler::new(Sampling { first: 0, every: 10 }));
        let taken: usize = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || (0..10_000).filter(|i| s.take((i % 7) as u64)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        // 7 keys, 40000 calls: each key's calls are counted exactly, 1 in 10 taken.
        assert_eq!(
            taken,
            (0..7).map(|k| (40_000 / 7 + usize::from(k < 40_000 % 7)).div_ceil(10)).sum::<usize>()
        );
    }

    fn call_with_weight(b: u64) -> InterceptedGemm {
        use crate::formats::Format;
        InterceptedGemm {
            entry: "cublasGemmEx",
            problem: crate::problem::GemmProblem::row_major(
                4,
                64,
                32,
                Format::Bf16,
                Format::Bf16,
                Format::Bf16,
            ),
            buffers: crate::problem::GemmBuffers { b, ..Default::default() },
            stream: 0,
            pointer_arrays: None,
        }
    }

    #[test]
    fn weights_are_sites_and_per_call_temporaries_fold_into_one() {
        let sites = Sites::new(None);
        // A real weight: the same pointer at every call is one site, whose epoch counts calls.
        let w: Vec<SiteRef> = (0..20).map(|_| sites.site_of(&call_with_weight(0x1000))).collect();
        assert!(w.iter().all(|s| s.ordinal == w[0].ordinal));
        assert_eq!(w[19].epoch, 19);
        // Other layers of the same shape stay apart, also many of them seen once each (the
        // first forward pass of a deep model), and then repeated.
        let layers: Vec<u32> =
            (0..128u64).map(|l| sites.site_of(&call_with_weight(0x2000 + l * 0x100)).ordinal).collect();
        let again: Vec<u32> =
            (0..128u64).map(|l| sites.site_of(&call_with_weight(0x2000 + l * 0x100)).ordinal).collect();
        assert_eq!(layers, again);
        assert_eq!(layers.iter().collect::<std::collections::HashSet<_>>().len(), 128);
        assert!(!layers.contains(&w[0].ordinal));
        // A temporary operand of another shape (new pointer each call): after a few calls all
        // later calls share one site.
        let t: Vec<u32> = (0..(TRANSIENT_AFTER as u64 + 40))
            .map(|i| {
                let mut c = call_with_weight(0x10_0000 + i * 0x100);
                c.problem.k = 16;
                sites.site_of(&c).ordinal
            })
            .collect();
        let distinct: std::collections::HashSet<u32> = t.iter().copied().collect();
        assert!(distinct.len() <= TRANSIENT_AFTER + 1, "{} sites", distinct.len());
        assert!(t[TRANSIENT_AFTER..].iter().all(|&o| o == t[TRANSIENT_AFTER]), "{t:?}");
    }

    #[test]
    fn names_file_parses_and_rejects() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("names.json");
        std::fs::write(&p, r#"{"0x10": "l0.weight", "32": "l1.weight"}"#).unwrap();
        let n = load_names(&p).unwrap();
        assert_eq!(n[&16], "l0.weight");
        assert_eq!(n[&32], "l1.weight");
        std::fs::write(&p, r#"{"zz": "x"}"#).unwrap();
        assert!(load_names(&p).unwrap_err().contains("not an address"));
        std::fs::write(&p, "[1").unwrap();
        assert!(load_names(&p).unwrap_err().contains("not JSON"));
    }
}
