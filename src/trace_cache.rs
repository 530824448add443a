//! The realize cache: a lazy graph realized again with the structure of one realized before runs
//! the program loaded then, without building an air graph, checking it or looking it up again.
//!
//! [`crate::realize::walk`] visits the tensors to compute in trace order and hashes their
//! structure (ops with attributes, types, input positions, outputs) on the way. The cache maps
//! that hash to the programs realized from it, each kept with the air graph it was traced into
//! (node `i` of the walk is `ids[i]`). A walk is one of them when every step equals its node: the
//! same op (an `Input` of the same slot for a tensor that holds data), the same type, inputs at
//! the same positions, and the same outputs. Then `Walk::build` would build that very graph,
//! node for node in the same order, so the device would compile it into that very program (its
//! cache compares graphs by structure in topological order, which equal graphs share): running
//! the kept program on the walk's data and symbol values is what a full realize does, minus
//! building the graph, its topological order and its `air::GraphKey` hash and comparison.
//!
//! The cache is per thread (no lock on the hot path, and the kept graphs need not be shared) and
//! bounded ([`CAPACITY`] structures, least recently used evicted first, `KILN_REALIZE_CACHE=N`
//! changes it). It holds executables the device may have evicted since: they stay valid (an
//! `Arc` each), and stay alive until evicted here too. [`runtime::CpuDevice::clear_caches`]
//! empties it as well (through the device's generation), so that clearing still means the next
//! graph compiles.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use air::{Bindings, HostTensor, NodeId};
use runtime::lru::{Lru, capacity_from_env};
use smallvec::SmallVec;

use crate::backend::{self, Loaded};
use crate::device::Device;
use crate::error::Result;
use crate::realize::{SiteOf, Step, Walk, walk};
use crate::record::Recording;
use crate::tensor::{Site, Tensor};

/// How many distinct structures a thread's realize cache keeps by default.
pub const CAPACITY: usize = 64;

/// Environment variable that sets the capacity of each thread's realize cache.
pub const CAPACITY_ENV: &str = "KILN_REALIZE_CACHE";

/// The most programs kept for one structural hash (the oldest goes first).
const BUCKET_MAX: usize = 8;

/// One realized structure: the program loaded from its graph (which keeps what the graph's nodes
/// are, see `backend::Loaded`).
struct Entry {
    /// The device's cache generation when the program was loaded.
    generation: u64,
    /// The node of each step of the walk it was built from.
    ids: Vec<NodeId>,
    /// The position of each step's node in the graph's topological order ([`Loaded::node`]).
    at: Vec<u32>,
    /// The input positions of every step of that walk, one after another: step `k`'s are
    /// `inputs[ends[k - 1]..ends[k]]` (node `ids[k]`'s inputs are the nodes at those positions,
    /// and no two steps share a node, so a walk's inputs compare by position).
    inputs: Vec<u32>,
    ends: Vec<u32>,
    /// The position of each output of that walk.
    outputs: SmallVec<[u32; 2]>,
    loaded: Loaded,
    /// For each step that was a node of a recorded call, that node (empty when none was): a
    /// walk whose step is the same node has its op and type without comparing them.
    recorded: Vec<Option<NonNull<Tensor>>>,
    /// The recordings those nodes belong to, kept alive (and so never another node's address).
    _recordings: Vec<Arc<Recording>>,
}

impl Entry {
    /// Whether `walk` would build this entry's graph (see the module docs): `None` if not, else
    /// whether some step of the walk that is a node of a recorded call was compared op by op
    /// (this entry does not know that node: [`Entry::adopt`] pays then).
    fn matches(&self, walk: &Walk) -> Option<bool> {
        if walk.steps.len() != self.ids.len() || walk.outputs != self.outputs {
            return None;
        }
        let mut start = 0;
        let mut unknown = false;
        let same = walk.steps.iter().zip(&self.ends).enumerate().all(|(k, (step, &end))| {
            let inputs = &self.inputs[start..end as usize];
            start = end as usize;
            let mut same_node = || {
                let recorded = step.recorded();
                (recorded.is_some() && recorded == self.recorded.get(k).copied().flatten()) || {
                    unknown |= recorded.is_some();
                    self.loaded
                        .node(self.at[k] as usize)
                        .is_some_and(|(op, ty)| *ty == step.tensor().inner.ty && step.same_op(op))
                }
            };
            // Element by element: a slice `==` calls `memcmp`, a visible cost for 0 to 3 inputs.
            step.inputs.len() == inputs.len() && step.inputs.iter().zip(inputs).all(|(a, b)| a == b) && same_node()
        });
        same.then_some(unknown)
    }

    /// Takes the recorded nodes of `walk`, which [`Entry::matches`] matched, as this entry's:
    /// a graph first realized from tensors computed directly (a model's first forward, before
    /// its blocks were recorded) is then compared with its recorded calls node by node, by
    /// address, instead of op by op on every later realize.
    /// An entry built from `walk` takes them the same way (none when the walk has none).
    fn adopt(&mut self, walk: &Walk) {
        let recordings = walk.recordings();
        self.recorded = match recordings.is_empty() {
            true => Vec::new(),
            false => walk.steps.iter().map(Step::recorded).collect(),
        };
        self._recordings = recordings;
    }

    /// The entry for the program loaded from the graph `walk` built (`Walk::build`'s node ids).
    fn new(walk: &Walk, generation: u64, ids: Vec<NodeId>, loaded: Loaded) -> Entry {
        let position = air::key::positions(loaded.order());
        let at = ids.iter().map(|id| position.get(id.index() as usize).copied().unwrap_or(u32::MAX)).collect();
        let mut inputs = Vec::new();
        let ends = walk
            .steps
            .iter()
            .map(|step| {
                inputs.extend_from_slice(&step.inputs);
                inputs.len() as u32
            })
            .collect();
        let mut entry = Entry {
            generation,
            ids,
            at,
            inputs,
            ends,
            outputs: walk.outputs.clone(),
            loaded,
            recorded: Vec::new(),
            _recordings: Vec::new(),
        };
        entry.adopt(walk);
        entry
    }
}

type Bucket = SmallVec<[Rc<Entry>; 1]>;

thread_local! {
    static CACHE: RefCell<Lru<(Device, u64), Bucket>> =
        RefCell::new(Lru::new(capacity_from_env(CAPACITY_ENV, CAPACITY)));
}

/// The generation of `device`'s program cache (see [`runtime::CpuDevice::generation`]).
fn generation(device: Device) -> Result<u64> {
    Ok(match device {
        Device::Cpu => backend::cpu_device()?.generation(),
        Device::Interp | Device::Wgpu => 0,
    })
}

/// Where the nodes of an entry's graph were built in this walk: the tensor of the node's step.
struct WalkSites<'a> {
    steps: &'a [Step],
    ids: &'a [NodeId],
}

impl SiteOf for WalkSites<'_> {
    fn site(&self, id: NodeId) -> Option<Site> {
        // Only a failed run asks, once: a scan is enough.
        let step = &self.steps[self.ids.iter().position(|&i| i == id)?];
        if step.slot.is_some() { None } else { step.tensor().inner.site }
    }
}

/// Computes `roots` (error-free, distinct, all on `device`): one host tensor per root, in order,
/// the symbol values they were computed with, and whether each keeps its inputs for autodiff
/// (`autograd::keeps_walked`).
pub(crate) fn realize_roots(
    roots: &[Tensor],
    device: Device,
) -> Result<(Vec<HostTensor>, Bindings, SmallVec<[bool; 4]>)> {
    let mut walk = walk(roots, device, &[])?;
    let generation = generation(device)?;
    let key = (device, walk.hash);
    let found = CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let bucket = cache.get_mut(&key)?;
        bucket.retain(|e| e.generation == generation);
        let (entry, unknown) = bucket.iter_mut().find_map(|e| {
            let unknown = e.matches(&walk)?;
            Some((e, unknown))
        })?;
        if unknown && let Some(entry) = Rc::get_mut(entry) {
            entry.adopt(&walk);
        }
        Some(entry.clone())
    });
    let entry = match found {
        Some(entry) => {
            crate::stats::record_realize_cache_hit();
            entry
        }
        None => {
            backend::expect_compile(device);
            let (graph, ids, sites) = walk.build()?;
            // The graph is the device's now: the entry keeps what the loaded program keeps of it.
            let loaded = backend::load(device, Cow::Owned(graph), &sites)?;
            let entry = Rc::new(Entry::new(&walk, generation, ids, loaded));
            CACHE.with(|cache| {
                let mut cache = cache.borrow_mut();
                match cache.get_mut(&key) {
                    Some(bucket) => {
                        // Structures sharing a hash are rare; a bucket never grows past a few.
                        if bucket.len() >= BUCKET_MAX {
                            bucket.remove(0);
                        }
                        bucket.push(entry.clone())
                    }
                    None => drop(cache.insert(key, SmallVec::from_elem(entry.clone(), 1))),
                }
            });
            entry
        }
    };
    let sites = WalkSites { steps: &walk.steps, ids: &entry.ids };
    let outputs = backend::run_loaded(&entry.loaded, &mut walk.inputs, &walk.bindings, &sites, Vec::new());
    let outputs = outputs?;
    let keep = crate::autograd::keeps_walked(&walk);
    let bindings = std::mem::take(&mut walk.bindings);
    walk.recycle();
    Ok((outputs, bindings, keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry a realize of `roots` on the interpreter would keep.
    fn entry(roots: &[Tensor]) -> Entry {
        let walk = walk(roots, Device::Interp, &[]).unwrap();
        let (graph, ids, sites) = walk.build().unwrap();
        let loaded = backend::load(Device::Interp, Cow::Owned(graph), &sites).unwrap();
        Entry::new(&walk, 0, ids, loaded)
    }

    fn matches(entry: &Entry, roots: &[Tensor]) -> bool {
        entry.matches(&walk(roots, Device::Interp, &[]).unwrap()).is_some()
    }

    /// The comparison alone, without the hash in front of it: every variant matches a rebuild of
    /// itself and none of the others.
    #[test]
    fn only_the_same_structure_matches() {
        let on = |data: Vec<f32>, shape: &[usize]| Tensor::from_vec(data, shape).to_device(Device::Interp).unwrap();
        let (x, y) = (on(vec![1.0, 2.0, 3.0, 4.0], &[4]), on(vec![5.0, 6.0, 7.0, 8.0], &[4]));
        let x2 = on(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let variants: Vec<Box<dyn Fn() -> Tensor>> = vec![
            Box::new(|| x.add(1.0)),
            Box::new(|| x.add(2.0)),
            Box::new(|| x.sub(&y)),
            // (`y.sub(&x)` is `x.sub(&y)`'s structure: its slots are numbered in order of discovery.)
            Box::new(|| x.sub(y.neg())),
            Box::new(|| x.sub(&x)),
            // The same nodes wired the other way round.
            Box::new(|| x.sub(x.neg())),
            Box::new(|| x.neg().sub(&x)),
            Box::new(|| x.mul(&y)),
            Box::new(|| x.maximum(&y)),
            Box::new(|| {
                let n = x.neg();
                n.add(&n)
            }),
            Box::new(|| x.neg().add(x.neg())),
            Box::new(|| x.cast(air::DType::F64).add(1.0)),
            Box::new(|| x2.add(1.0)),
            Box::new(|| x2.add(1.0).sum(1)),
        ];
        for (i, a) in variants.iter().enumerate() {
            let kept = entry(&[a()]);
            for (j, b) in variants.iter().enumerate() {
                assert_eq!(matches(&kept, &[b()]), i == j, "variant {i} against variant {j}");
            }
        }
        // Two outputs, one computed from the other: the same nodes, listed in either order.
        let pair = || {
            let n = x.neg();
            let m = n.mul(&y);
            (n, m)
        };
        let (n, m) = pair();
        let kept = entry(&[n, m]);
        let (n, m) = pair();
        assert!(matches(&kept, &[n.clone(), m.clone()]));
        assert!(!matches(&kept, &[m, n]));
    }

    /// An entry first realized from a function's direct outputs matches the function's recorded
    /// calls op by op, says so, and after adopting one walk's recorded nodes matches every later
    /// call of that recording by address; other structures still do not match.
    #[test]
    fn an_entry_adopts_the_recorded_nodes_it_matched() {
        let on = |data: Vec<f32>| Tensor::from_vec(data, &[2]).to_device(Device::Interp).unwrap();
        let (x, w) = (on(vec![1.0, 2.0]), on(vec![3.0, 4.0]));
        let recorder = crate::Recorder::new();
        let call = |scale: f64| {
            let out = recorder.call(&[&x, &w], |a| vec![a[0].neg().mul(&a[1]).add(scale)]);
            out.unwrap().remove(0)
        };
        let direct = call(1.0);
        let mut kept = entry(&[direct.add(2.0)]);
        assert!(kept.recorded.is_empty());
        // The second call records the function, the third is made from the recording.
        let _ = call(1.0);
        let recorded_walk = || walk(&[call(1.0).add(2.0)], Device::Interp, &[]).unwrap();
        let first = recorded_walk();
        assert!(first.steps.iter().any(|s| s.recorded().is_some()), "the third call is not a recorded one");
        assert_eq!(kept.matches(&first), Some(true));
        kept.adopt(&first);
        assert_eq!(kept.matches(&first), Some(false));
        assert_eq!(kept.matches(&recorded_walk()), Some(false));
        assert_eq!(kept.matches(&walk(&[call(1.0).add(3.0)], Device::Interp, &[]).unwrap()), None);
        assert_eq!(kept.matches(&walk(&[call(1.0).mul(2.0)], Device::Interp, &[]).unwrap()), None);
    }
}
