//! Sampling decisions and site identity.
//!
//! Sampling is decided on a cheap per-call key (the hook's `quick_key`) so that an unsampled
//! call costs a hash and a counter. A sampled call is decoded and mapped to its site: (entry
//! point, N, K, formats, scale scheme, weight pointer), numbered by first appearance among
//! sampled calls, optionally named from a map file of weight pointer -> parameter name.

use super::config::Sampling;
use crate::intercept::InterceptedGemm;
use crate::rng::mix64;
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
    pub name: Option<String>,
}

struct SiteState {
    ordinal: u32,
    calls: u64,
}

/// The sites of this process.
pub struct Sites {
    map: Mutex<HashMap<u64, SiteState>>,
    names: HashMap<u64, String>,
}

/// Sites remembered; beyond, calls of new sites share one ordinal (bounded memory).
const MAX_SITES: usize = 1 << 16;

impl Sites {
    pub fn new(names_file: Option<&std::path::Path>) -> Sites {
        let names = match names_file {
            None => HashMap::new(),
            Some(p) => match load_names(p) {
                Ok(n) => n,
                Err(e) => {
                    super::log::warn(&format!("QUANTSHADOW_NAMES: {e}; sites stay unnamed"));
                    HashMap::new()
                }
            },
        };
        Sites { map: Mutex::new(HashMap::new()), names }
    }

    /// Site identity of a decoded call.
    pub fn id_of(call: &InterceptedGemm) -> u64 {
        let p = &call.problem;
        let scale = |s: &Option<crate::problem::ScaleSpec>| {
            s.map_or(0, |s| mix64(s.granularity.short_name().len() as u64 ^ ((s.format as u64) << 8)))
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
            call.buffers.b,
        ] {
            h = mix64(h ^ v);
        }
        h
    }

    pub fn site_of(&self, call: &InterceptedGemm) -> SiteRef {
        let id = Sites::id_of(call);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let next = map.len() as u32;
        let (ordinal, epoch) = if map.len() >= MAX_SITES && !map.contains_key(&id) {
            (u32::MAX, 0)
        } else {
            let s = map.entry(id).or_insert(SiteState { ordinal: next, calls: 0 });
            s.calls += 1;
            (s.ordinal, s.calls - 1)
        };
        SiteRef { id, ordinal, epoch, name: self.names.get(&call.buffers.b).cloned() }
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
