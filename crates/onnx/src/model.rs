//! `Model`: a decoded, validated ONNX model (initializers decoded, nodes in a topological order,
//! every name resolved), and `run`, which builds Kiln's lazy graph for given inputs.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::path::{Path, PathBuf};

use kiln::{DType, Device, Dim, HostTensor, Tensor};
use prost::Message;
use prost::bytes::Bytes;

use crate::data::{elem_type_name, from_tensor_proto, to_dtype};
use crate::error::{Error, Result, UnsupportedOp};
use crate::ops;
use crate::proto::{
    GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto, ValueInfoProto, tensor_shape_proto::dimension,
    type_proto,
};

/// A graph input or output: its name, element type and dims (`dim_param` names become symbolic
/// [`Dim`]s; a dim the file leaves unnamed and unsized is the symbol `"{name}:{axis}"`).
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    /// The value's name in the graph.
    pub name: String,
    /// ONNX's element type number (`1` is FLOAT); `0` when the file gives none.
    pub elem_type: i32,
    /// The Kiln dtype, `None` for element types Kiln lacks.
    pub dtype: Option<DType>,
    /// The dims, `None` when the file gives no shape.
    pub dims: Option<Vec<Dim>>,
}

impl ValueInfo {
    fn from_proto(v: &ValueInfoProto) -> ValueInfo {
        let name = v.name.clone().unwrap_or_default();
        let (mut elem_type, mut dims) = (0, None);
        if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            elem_type = t.elem_type.unwrap_or(0);
            dims = t.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .enumerate()
                    .map(|(axis, d)| match &d.value {
                        Some(dimension::Value::DimValue(v)) => Dim::from(*v),
                        Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::sym(p),
                        _ => Dim::sym(&format!("{name}:{axis}")),
                    })
                    .collect()
            });
        }
        ValueInfo { dtype: to_dtype(elem_type), name, elem_type, dims }
    }

    /// `"x: FLOAT [batch, 3, 224, 224]"`.
    pub fn describe(&self) -> String {
        let dims = match &self.dims {
            Some(d) => format!("[{}]", d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
            None => "(no shape)".into(),
        };
        format!("{}: {} {dims}", self.name, elem_type_name(self.elem_type))
    }
}

/// A decoded and validated ONNX model, ready to [`Model::run`].
#[derive(Debug)]
pub struct Model {
    graph: GraphProto,
    opsets: HashMap<String, i64>,
    dir: Option<PathBuf>,
    initializers: Vec<(String, HostTensor)>,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    order: Vec<usize>,
}

/// The domain a node's op belongs to, with ONNX's two spellings of the default one merged.
fn domain(node: &NodeProto) -> &str {
    match node.domain.as_deref() {
        None | Some("") | Some("ai.onnx") => "",
        Some(d) => d,
    }
}

impl Model {
    /// Reads and validates the model at `path`; external data is read relative to its folder.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        let dir = path.parent().map(|p| if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() });
        Model::decode(Bytes::from(bytes), dir)
    }

    /// Decodes and validates a model from its bytes (external data is an error: it needs a folder).
    pub fn from_bytes(bytes: &[u8]) -> Result<Model> {
        Model::decode(Bytes::copy_from_slice(bytes), None)
    }

    /// Decodes `bytes`: each initializer's `raw_data` is a slice of that one buffer (no copy),
    /// read once into its host tensor and then let go, so after decoding the file's bytes are
    /// freed and the weights are held once.
    fn decode(bytes: Bytes, dir: Option<PathBuf>) -> Result<Model> {
        let proto = ModelProto::decode(bytes).map_err(|e| Error::Decode(e.to_string()))?;
        let mut graph = proto.graph.ok_or_else(|| Error::Invalid("the model has no graph".into()))?;
        let mut opsets = HashMap::default();
        for o in &proto.opset_import {
            let d = match o.domain.as_deref() {
                None | Some("ai.onnx") => "",
                Some(d) => d,
            };
            opsets.insert(d.to_string(), o.version.unwrap_or(1));
        }
        let mut initializers = Vec::with_capacity(graph.initializer.len());
        for t in &mut graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(Error::Invalid("an initializer has no name".into()));
            }
            initializers.push((name, from_tensor_proto(t, dir.as_deref())?));
            t.raw_data = None;
        }
        own_tensor_data(&mut graph);
        if !graph.sparse_initializer.is_empty() {
            return Err(Error::Invalid("sparse initializers are not supported".into()));
        }
        let init_names: HashSet<&str> = initializers.iter().map(|(n, _)| n.as_str()).collect();
        let inputs: Vec<ValueInfo> =
            graph.input.iter().map(ValueInfo::from_proto).filter(|v| !init_names.contains(v.name.as_str())).collect();
        let outputs: Vec<ValueInfo> = graph.output.iter().map(ValueInfo::from_proto).collect();
        let order = topo_order(&graph, inputs.iter().map(|v| v.name.as_str()).chain(init_names.iter().copied()))?;
        for o in &outputs {
            let produced = graph.node.iter().any(|n| n.output.contains(&o.name));
            if !produced && !init_names.contains(o.name.as_str()) && !inputs.iter().any(|i| i.name == o.name) {
                return Err(Error::Invalid(format!("graph output {:?} is produced by nothing", o.name)));
            }
        }
        drop(init_names);
        Ok(Model { graph, opsets, dir, initializers, inputs, outputs, order })
    }

    /// The graph's inputs that the caller supplies (initializers listed as inputs excluded).
    pub fn inputs(&self) -> &[ValueInfo] {
        &self.inputs
    }

    /// The graph's outputs, in order.
    pub fn outputs(&self) -> &[ValueInfo] {
        &self.outputs
    }

    /// The opset version imported for `domain` (`""` is the default ONNX domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        self.opsets.get(domain).copied()
    }

    /// The nodes, in the order the import runs them.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeProto> {
        self.order.iter().map(|&i| &self.graph.node[i])
    }

    /// The initializers (weights): name and data.
    pub fn initializers(&self) -> &[(String, HostTensor)] {
        &self.initializers
    }

    fn node_opset(&self, node: &NodeProto) -> i64 {
        self.opsets.get(domain(node)).copied().unwrap_or(1)
    }

    /// Every node whose op the importer does not know, in node order (an `If`'s branches'
    /// nodes after the `If`).
    pub fn unsupported(&self) -> Vec<UnsupportedOp> {
        let mut out = Vec::new();
        self.collect_unsupported(self.nodes(), &mut out);
        out
    }

    fn collect_unsupported<'a>(&self, nodes: impl Iterator<Item = &'a NodeProto>, out: &mut Vec<UnsupportedOp>) {
        for n in nodes {
            if !ops::is_supported(domain(n), n.op_type.as_deref().unwrap_or(""), self.node_opset(n)) {
                out.push(UnsupportedOp {
                    node: n.name.clone().unwrap_or_default(),
                    op_type: match domain(n) {
                        "" => n.op_type.clone().unwrap_or_default(),
                        d => format!("{d}.{}", n.op_type.as_deref().unwrap_or("")),
                    },
                    opset: self.node_opset(n),
                });
            } else if control_flow(n).is_some() {
                for g in subgraphs(n) {
                    self.collect_unsupported(g.node.iter(), out);
                }
            }
        }
    }

    /// Builds the lazy graph of the model for `inputs` (one per [`Model::inputs`], in order) and
    /// returns its outputs, unrealized. Initializers become tensors on the first input's device
    /// (the default device without inputs). Inputs keep their own dims: pass tensors with
    /// symbolic dims (see [`Model::input_tensor`]) for one program to serve every size.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let unsupported = self.unsupported();
        if !unsupported.is_empty() {
            return Err(Error::Unsupported(unsupported));
        }
        if inputs.len() != self.inputs.len() {
            return Err(Error::Inputs(format!("the model takes {} inputs, {} given", self.inputs.len(), inputs.len())));
        }
        let device = match inputs.first() {
            Some(t) => t.device(),
            None => Device::default_device()?,
        };
        let mut env: HashMap<&str, Tensor> = HashMap::default();
        for (info, t) in self.inputs.iter().zip(inputs) {
            check_input(info, t)?;
            env.insert(&info.name, t.clone());
        }
        // Shape values known at import (see `ops::known`): small integer constants, `Shape`
        // outputs and what is computed from them.
        let mut known: HashMap<&str, ops::known::Known> = HashMap::default();
        for (name, host) in &self.initializers {
            env.insert(name, Tensor::from_host_on(host.clone(), device));
            if let Some(k) = ops::known::Known::of_host(host) {
                known.insert(name, k);
            }
        }
        let nodes: Vec<&NodeProto> = self.nodes().collect();
        self.eval(&nodes, &mut env, &mut known, device)?;
        self.outputs
            .iter()
            .map(|o| {
                env.get(o.name.as_str())
                    .cloned()
                    .ok_or_else(|| Error::Invalid(format!("output {:?} was not computed", o.name)))
            })
            .collect()
    }

    /// Imports `nodes` (in a topological order) into `env`, the tensors by name, and `known`,
    /// the shape values known at import.
    fn eval<'a>(
        &'a self,
        nodes: &[&'a NodeProto],
        env: &mut HashMap<&'a str, Tensor>,
        known: &mut HashMap<&'a str, ops::known::Known>,
        device: Device,
    ) -> Result<()> {
        // Names whose values do not depend on the graph's inputs: initializers, and the outputs
        // of nodes whose inputs all are (or are concrete known values).
        let mut constant: HashSet<&str> = self.initializers.iter().map(|(n, _)| n.as_str()).collect();
        for &node in nodes {
            let node_constant = control_flow(node).is_none()
                && node.input.iter().all(|n| {
                    n.is_empty()
                        || constant.contains(n.as_str())
                        || known.get(n.as_str()).is_some_and(|k| k.consts().is_some())
                });
            let fail = |message: String| Error::Node {
                node: node.name.clone().unwrap_or_default(),
                op_type: node.op_type.clone().unwrap_or_default(),
                opset: self.node_opset(node),
                message,
            };
            let args = node
                .input
                .iter()
                .map(|name| if name.is_empty() { None } else { env.get(name.as_str()).cloned() })
                .collect();
            let known_args = node.input.iter().map(|name| known.get(name.as_str()).cloned()).collect();
            let ctx = ops::Ctx {
                node,
                opset: self.node_opset(node),
                inputs: args,
                known: known_args,
                device,
                dir: self.dir.as_deref(),
            };
            let result = match control_flow(node) {
                Some(run) => run(self, &ctx, env, known),
                None => ops::import(&ctx).map(|outs| (outs, ops::known::propagate(&ctx))),
            };
            let (mut outs, mut known_outs) = result.map_err(|e| match e {
                ops::OpError::Message(m) => fail(m),
                ops::OpError::Other(e) => e,
            })?;
            // A Constant's tensor holds its data already: reading it back realizes nothing.
            if node.op_type.as_deref() == Some("Constant")
                && let Some(t) = outs.first()
                && matches!(t.dtype(), DType::I64 | DType::I32)
                && let Ok(host) = t.to_host()
            {
                known_outs = vec![ops::known::Known::of_host(&host)];
            }
            // A small integer computed from constants alone (a size through float arithmetic:
            // MobileViT's `ceil(h / patch) * patch`): its value, computed now.
            if node_constant {
                known_outs.resize(outs.len(), None);
                for (k, t) in known_outs.iter_mut().zip(&outs) {
                    if k.is_none() && is_small_integer(t) {
                        *k = t.to_host().ok().and_then(|h| ops::known::Known::of_host(&h));
                    }
                }
            }
            // An integer output whose values are all known is that constant: a size read off a
            // symbolic shape (`Shape(x)[2]` of `[batch, 8, 8]`) no longer reads `x`, so what is
            // computed from it is constant too.
            for (t, k) in outs.iter_mut().zip(&known_outs) {
                if let Some(values) = k.as_ref().and_then(|k| k.consts())
                    && matches!(t.dtype(), DType::I64 | DType::I32)
                    && t.ndim() <= 1
                    && t.shape().iter().all(|d| d.as_const() == Some(values.len() as i64))
                {
                    let shape = t.shape().iter().map(|_| values.len()).collect::<Vec<_>>();
                    let dtype = t.dtype();
                    *t = Tensor::from_vec_on(values, &shape, device).cast(dtype);
                }
            }
            for (name, k) in node.output.iter().zip(&known_outs) {
                if !name.is_empty() && (node_constant || k.as_ref().is_some_and(|k| k.consts().is_some())) {
                    constant.insert(name);
                }
            }
            for (name, k) in node.output.iter().zip(known_outs) {
                if let Some(k) = k
                    && !name.is_empty()
                {
                    known.insert(name, k);
                }
            }
            for (i, name) in node.output.iter().enumerate() {
                if name.is_empty() {
                    continue;
                }
                let Some(t) = outs.get(i) else {
                    return Err(fail(format!(
                        "the importer gives {} outputs, the node names {}",
                        outs.len(),
                        node.output.len()
                    )));
                };
                if let Some(e) = t.error() {
                    return Err(fail(e.to_string()));
                }
                env.insert(name, t.clone());
            }
        }
        Ok(())
    }

    /// An `If`: the branch its condition picks where the condition is known at import (a shape
    /// test, as exporters write them), else both branches and, per output, `where(cond, then,
    /// else)`, which needs outputs of one type. Outputs with the shape values known in the
    /// branch taken.
    fn run_if<'a>(
        &'a self,
        ctx: &ops::Ctx<'a>,
        env: &HashMap<&'a str, Tensor>,
        known: &HashMap<&'a str, ops::known::Known>,
    ) -> ops::OpResult<IfOutputs> {
        let (then_g, else_g) = (ctx.graph("then_branch")?, ctx.graph("else_branch")?);
        let cond_known = ctx.known(0).and_then(|k| k.consts()).filter(|v| v.len() == 1).map(|v| v[0] != 0);
        if let Some(c) = cond_known {
            return self
                .run_branch(if c { then_g } else { else_g }, env, known, ctx.device)
                .map_err(ops::OpError::Other);
        }
        let cond = ctx.input(0)?;
        if cond.shape().iter().any(|d| d.as_const() != Some(1)) {
            return Err(format!("the condition {} must hold one element", ops::show(cond)).into());
        }
        let cond = cond.reshape(&[] as &[usize]).cast(DType::Bool);
        let (then_out, _) = self.run_branch(then_g, env, known, ctx.device).map_err(ops::OpError::Other)?;
        let (else_out, _) = self.run_branch(else_g, env, known, ctx.device).map_err(ops::OpError::Other)?;
        if then_out.len() != else_out.len() {
            return Err(format!("the branches give {} and {} outputs", then_out.len(), else_out.len()).into());
        }
        let mut outs = Vec::with_capacity(then_out.len());
        for (i, (t, e)) in then_out.iter().zip(&else_out).enumerate() {
            if t.dtype() != e.dtype() || t.shape() != e.shape() {
                return Err(format!(
                    "output {i} is {} {} in one branch and {} {} in the other: a condition known only when \
                     the model runs needs outputs of one type",
                    t.dtype(),
                    ops::show(t),
                    e.dtype(),
                    ops::show(e)
                )
                .into());
            }
            outs.push(cond.where_cond(t, e));
        }
        let unknown = vec![None; outs.len()];
        Ok((outs, unknown))
    }

    /// A `Scan` (opset 9 on), unrolled over its concrete scan length: the body imported once per
    /// step with the state and each scan input's slice at that step (from the end for a reverse
    /// direction), its new state carried on, its per-step outputs stacked along their axes.
    fn run_scan<'a>(
        &'a self,
        ctx: &ops::Ctx<'a>,
        env: &HashMap<&'a str, Tensor>,
        known: &HashMap<&'a str, ops::known::Known>,
    ) -> ops::OpResult<IfOutputs> {
        if ctx.opset < 9 {
            return Err("Scan before opset 9 (a batch axis and sequence_lens) is not supported".into());
        }
        let body = ctx.graph("body")?;
        let inputs: Vec<Tensor> = ctx
            .inputs
            .iter()
            .map(|t| t.clone().ok_or("Scan's inputs are all required"))
            .collect::<std::result::Result<_, _>>()?;
        let m = usize::try_from(ctx.int("num_scan_inputs", 0)?)
            .ok()
            .filter(|&m| m >= 1 && m <= inputs.len())
            .ok_or("num_scan_inputs must be between 1 and the input count")?;
        let n = inputs.len() - m;
        let list = |name: &str, len: usize| -> ops::OpResult<Vec<i64>> {
            match ctx.ints(name)? {
                Some(v) if v.len() == len => Ok(v),
                Some(v) => Err(format!("{name} {v:?} does not have {len} entries").into()),
                None => Ok(vec![0; len]),
            }
        };
        let (in_axes, in_dirs) = (list("scan_input_axes", m)?, list("scan_input_directions", m)?);
        let scans: Vec<(Tensor, usize, bool)> = inputs[n..]
            .iter()
            .zip(in_axes.iter().zip(&in_dirs))
            .map(|(t, (&a, &d))| ops::axis(a, t.ndim()).map(|a| (t.clone(), a, d != 0)))
            .collect::<ops::OpResult<_>>()?;
        let steps = scans[0].0.shape()[scans[0].1].as_const().ok_or("the scan axis must be concrete")?;
        if scans.iter().any(|(t, a, _)| t.shape()[*a].as_const() != Some(steps)) {
            return Err("the scan inputs differ in length along their scan axes".into());
        }
        let k = body.output.len().checked_sub(n).ok_or("the body gives fewer outputs than the state has")?;
        let (out_axes, out_dirs) = (list("scan_output_axes", k)?, list("scan_output_directions", k)?);
        let mut state: Vec<Tensor> = inputs[..n].to_vec();
        let mut per_step: Vec<Vec<Tensor>> = vec![Vec::new(); k];
        for t in 0..steps {
            let mut args = state.clone();
            for (x, a, reverse) in &scans {
                let at = if *reverse { steps - 1 - t } else { t };
                args.push(x.narrow(*a, at, 1).squeeze(*a));
            }
            let (outs, _) = self.run_subgraph(body, &args, env, known, ctx.device).map_err(ops::OpError::Other)?;
            let mut outs = outs.into_iter();
            state = outs.by_ref().take(n).collect();
            for (j, o) in outs.enumerate() {
                per_step[j].push(o);
            }
        }
        let mut results = state;
        for ((mut slices, &axis), &dir) in per_step.into_iter().zip(&out_axes).zip(&out_dirs) {
            if dir != 0 {
                slices.reverse();
            }
            let rank = slices.first().map_or(0, |s| s.ndim()) + 1;
            let a = ops::axis(axis, rank)?;
            let refs: Vec<&Tensor> = slices.iter().collect();
            results.push(Tensor::stack(&refs, a));
        }
        let unknown = vec![None; results.len()];
        Ok((results, unknown))
    }

    /// A `Loop`, unrolled: its trip count and its condition are read when the model is imported
    /// (known shape values, else realized: `Model::run` has the inputs' data, a `Session`'s trace
    /// does not and reports it), the body imported once per iteration with the iteration number,
    /// the condition and the carried values; it stops at the trip count or when the body's
    /// condition is false (read after each iteration), at most [`LOOP_MAX_ITERATIONS`].
    fn run_loop<'a>(
        &'a self,
        ctx: &ops::Ctx<'a>,
        env: &HashMap<&'a str, Tensor>,
        known: &HashMap<&'a str, ops::known::Known>,
    ) -> ops::OpResult<IfOutputs> {
        let body = ctx.graph("body")?;
        let read = |i: usize| -> ops::OpResult<Option<i64>> {
            if let Some(v) = ctx.known(i).and_then(|k| k.consts()) {
                return Ok(v.first().copied());
            }
            match ctx.opt(i) {
                None => Ok(None),
                Some(t) => Ok(Some(ctx.scalar_f64(t)? as i64)),
            }
        };
        let trips = read(0)?;
        let mut going = read(1)?.is_none_or(|c| c != 0);
        let mut carried: Vec<Tensor> = ctx
            .inputs
            .iter()
            .skip(2)
            .map(|t| t.clone().ok_or("a Loop's carried values are all required"))
            .collect::<std::result::Result<_, _>>()?;
        let n = carried.len();
        let k = body.output.len().checked_sub(1 + n).ok_or("the body gives fewer outputs than the loop carries")?;
        let mut per_step: Vec<Vec<Tensor>> = vec![Vec::new(); k];
        let mut cond = Tensor::from_vec(vec![going], &[] as &[usize]).to_device(ctx.device)?;
        let mut i = 0i64;
        while going && trips.is_none_or(|m| i < m) {
            if i >= LOOP_MAX_ITERATIONS {
                return Err(format!("the loop ran {LOOP_MAX_ITERATIONS} iterations without stopping").into());
            }
            let mut args = vec![Tensor::from_vec(vec![i], &[] as &[usize]).to_device(ctx.device)?, cond.clone()];
            args.extend(carried.iter().cloned());
            let (outs, _) = self.run_subgraph(body, &args, env, known, ctx.device).map_err(ops::OpError::Other)?;
            let mut outs = outs.into_iter();
            cond = outs.next().ok_or("the body gives no condition")?;
            carried = outs.by_ref().take(n).collect();
            for (j, o) in outs.enumerate() {
                per_step[j].push(o);
            }
            going = ctx.scalar_f64(&cond)? != 0.0;
            i += 1;
        }
        let mut results = carried;
        for slices in per_step {
            if slices.is_empty() {
                return Err("a Loop that ran no iteration has scan outputs of unknown shape".into());
            }
            let refs: Vec<&Tensor> = slices.iter().collect();
            results.push(Tensor::stack(&refs, 0));
        }
        let unknown = vec![None; results.len()];
        Ok((results, unknown))
    }

    /// Imports the subgraph `g` in the scope of `env` and `known` (its own initializers added):
    /// its outputs, with their known shape values.
    fn run_branch<'a>(
        &'a self,
        g: &'a GraphProto,
        env: &HashMap<&'a str, Tensor>,
        known: &HashMap<&'a str, ops::known::Known>,
        device: Device,
    ) -> Result<IfOutputs> {
        self.run_subgraph(g, &[], env, known, device)
    }

    /// Imports the subgraph `g` with its inputs bound to `args` (in order), in the scope of `env`
    /// and `known`: its outputs, with their known shape values.
    fn run_subgraph<'a>(
        &'a self,
        g: &'a GraphProto,
        args: &[Tensor],
        env: &HashMap<&'a str, Tensor>,
        known: &HashMap<&'a str, ops::known::Known>,
        device: Device,
    ) -> Result<IfOutputs> {
        let (mut env, mut known) = (env.clone(), known.clone());
        if args.len() != g.input.len() {
            return Err(Error::Invalid(format!("a subgraph of {} inputs given {} values", g.input.len(), args.len())));
        }
        for (input, t) in g.input.iter().zip(args) {
            let name = input.name.as_deref().unwrap_or("");
            known.remove(name);
            env.insert(name, t.clone());
        }
        for t in &g.initializer {
            let name = t.name.as_deref().unwrap_or("");
            let host = from_tensor_proto(t, self.dir.as_deref())?;
            if let Some(k) = ops::known::Known::of_host(&host) {
                known.insert(name, k);
            }
            env.insert(name, Tensor::from_host_on(host, device));
        }
        let order = topo_order(g, env.keys().copied())?;
        let nodes: Vec<&NodeProto> = order.iter().map(|&i| &g.node[i]).collect();
        self.eval(&nodes, &mut env, &mut known, device)?;
        let mut outs = Vec::with_capacity(g.output.len());
        let mut shapes = Vec::with_capacity(g.output.len());
        for o in &g.output {
            let name = o.name.as_deref().unwrap_or("");
            let t = env
                .get(name)
                .cloned()
                .ok_or_else(|| Error::Invalid(format!("branch output {name:?} was not computed")))?;
            outs.push(t);
            shapes.push(known.get(name).cloned());
        }
        Ok((outs, shapes))
    }

    /// A tensor holding `host` for input `index`, typed with the input's declared dims where they
    /// are symbolic (`batch`, `seq`): programs built from it serve every value of those symbols.
    pub fn input_tensor(&self, index: usize, host: HostTensor, device: Device) -> Result<Tensor> {
        let info = self.inputs.get(index).ok_or_else(|| Error::Inputs(format!("no input {index}")))?;
        let t = Tensor::from_host_on(host.clone(), device);
        let Some(dims) = &info.dims else { return Ok(t) };
        if dims.len() != host.shape.len() || dims.iter().all(|d| d.as_const().is_some()) {
            return Ok(t);
        }
        // Keep only dims that are plain symbols; anything else takes the given size.
        let dims: Vec<Dim> = dims
            .iter()
            .zip(&host.shape)
            .map(|(d, &n)| if d.as_const().is_none() && !d.to_string().contains(':') { *d } else { Dim::from(n) })
            .collect();
        let t = t.with_dims(dims);
        match t.error() {
            Some(e) => Err(Error::Inputs(format!("input {:?}: {e}", info.name))),
            None => Ok(t),
        }
    }
}

/// Whether `t` is an integer scalar or vector short enough to be tracked as a shape value
/// ([`ops::known::MAX_LEN`]).
fn is_small_integer(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::I64 | DType::I32)
        && t.ndim() <= 1
        && t.shape().iter().all(|d| d.as_const().is_some_and(|n| n as usize <= ops::known::MAX_LEN))
}

fn check_input(info: &ValueInfo, t: &Tensor) -> Result<()> {
    if let Some(dtype) = info.dtype
        && t.dtype() != dtype
    {
        return Err(Error::Inputs(format!(
            "input {:?} is {} where the model declares {}",
            info.name,
            t.dtype().name(),
            dtype.name()
        )));
    }
    if let Some(dims) = &info.dims {
        let ok = dims.len() == t.ndim()
            && dims.iter().zip(t.shape().iter()).all(|(d, g)| match (d.as_const(), g.as_const()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            });
        if !ok {
            let show = |s: &[Dim]| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
            return Err(Error::Inputs(format!(
                "input {:?} has shape [{}] where the model declares [{}]",
                info.name,
                show(t.shape()),
                show(dims)
            )));
        }
    }
    if let Some(e) = t.error() {
        return Err(Error::Inputs(format!("input {:?}: {e}", info.name)));
    }
    Ok(())
}

/// A control-flow op's (or a subgraph's) outputs with their shape values known at import.
type IfOutputs = (Vec<Tensor>, Vec<Option<ops::known::Known>>);

/// How `Model` imports one control-flow node (its bodies are graphs in the model's scope).
type ControlFlow = for<'a> fn(
    &'a Model,
    &ops::Ctx<'a>,
    &HashMap<&'a str, Tensor>,
    &HashMap<&'a str, ops::known::Known>,
) -> ops::OpResult<IfOutputs>;

/// The most iterations a `Loop` is unrolled to.
const LOOP_MAX_ITERATIONS: i64 = 100_000;

/// The importer of `node` if it is ONNX's `If`, `Scan` or `Loop`.
fn control_flow(node: &NodeProto) -> Option<ControlFlow> {
    if !domain(node).is_empty() {
        return None;
    }
    match node.op_type.as_deref()? {
        "If" => Some(Model::run_if),
        "Scan" => Some(Model::run_scan),
        "Loop" => Some(Model::run_loop),
        _ => None,
    }
}

/// The graphs among `node`'s attributes (an `If`'s branches, a `Loop`'s body).
fn subgraphs(node: &NodeProto) -> impl Iterator<Item = &GraphProto> {
    node.attribute.iter().flat_map(|a| a.g.iter().chain(a.graphs.iter()))
}

/// The names the nodes of `g` (and of their subgraphs) read from the scope around `g`.
fn free_names<'a>(g: &'a GraphProto, out: &mut Vec<&'a str>) {
    let mut defined: HashSet<&str> = g.input.iter().filter_map(|v| v.name.as_deref()).collect();
    defined.extend(g.initializer.iter().filter_map(|t| t.name.as_deref()));
    defined.extend(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)));
    for n in &g.node {
        let mut inner = Vec::new();
        for sub in subgraphs(n) {
            free_names(sub, &mut inner);
        }
        for name in n.input.iter().map(String::as_str).chain(inner) {
            if !name.is_empty() && !defined.contains(name) && !out.contains(&name) {
                out.push(name);
            }
        }
    }
}

/// The nodes of `graph` in a topological order (Kahn's algorithm, stable in file order), or the
/// error naming a dangling input, a value produced twice, or the nodes on a cycle.
fn topo_order<'a>(graph: &'a GraphProto, sources: impl Iterator<Item = &'a str>) -> Result<Vec<usize>> {
    let sources: HashSet<&str> = sources.collect();
    let mut producer: HashMap<&str, usize> = HashMap::default();
    for (i, n) in graph.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if sources.contains(o.as_str()) || producer.insert(o, i).is_some() {
                return Err(Error::Invalid(format!("value {o:?} is produced more than once")));
            }
        }
    }
    let mut pending = vec![0usize; graph.node.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); graph.node.len()];
    for (i, n) in graph.node.iter().enumerate() {
        // A subgraph's reads from this scope are inputs of its node too.
        let mut implicit = Vec::new();
        for sub in subgraphs(n) {
            free_names(sub, &mut implicit);
        }
        let explicit = n.input.iter().map(String::as_str).filter(|x| !x.is_empty());
        for name in explicit.chain(implicit) {
            if let Some(&p) = producer.get(name) {
                pending[i] += 1;
                users[p].push(i);
            } else if !sources.contains(name) {
                return Err(Error::Invalid(format!(
                    "node {:?} ({}) reads {name:?}, which no input, initializer or node provides",
                    n.name.as_deref().unwrap_or(""),
                    n.op_type.as_deref().unwrap_or("")
                )));
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..graph.node.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(graph.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != graph.node.len() {
        let stuck: Vec<String> = (0..graph.node.len())
            .filter(|&i| pending[i] > 0)
            .take(5)
            .map(|i| format!("{:?}", graph.node[i].name.as_deref().unwrap_or("")))
            .collect();
        return Err(Error::Invalid(format!("the graph has a cycle through node(s) {}", stuck.join(", "))));
    }
    Ok(order)
}

/// Gives every tensor left in `graph` (node attributes, subgraphs) its own copy of its raw
/// bytes: a slice of the model's buffer would keep the whole file alive.
fn own_tensor_data(graph: &mut GraphProto) {
    fn own(t: &mut TensorProto) {
        if let Some(raw) = &t.raw_data {
            t.raw_data = Some(Bytes::copy_from_slice(raw));
        }
    }
    fn own_sparse(s: &mut SparseTensorProto) {
        s.values.iter_mut().chain(s.indices.iter_mut()).for_each(own);
    }
    graph.initializer.iter_mut().for_each(own);
    graph.sparse_initializer.iter_mut().for_each(own_sparse);
    for a in graph.node.iter_mut().flat_map(|n| n.attribute.iter_mut()) {
        a.t.iter_mut().chain(a.tensors.iter_mut()).for_each(own);
        a.sparse_tensor.iter_mut().chain(a.sparse_tensors.iter_mut()).for_each(own_sparse);
        a.g.iter_mut().chain(a.graphs.iter_mut()).for_each(own_tensor_data);
    }
}

/// A model compiled once per input signature: [`Model::run`] traced by `kiln::jit` on the first
/// call with a new signature (device, dtypes, shapes with symbols kept), after which a call binds
/// the inputs and runs the compiled program, without rebuilding or tracing the imported graph.
/// The initializers are constants of the compiled program; the outputs come back realized,
/// without gradient history, so the model is traced under `kiln::no_grad` (inference: a max
/// pool is one reduce, with no winner kept for a backward pass).
pub struct Session<'m> {
    model: &'m Model,
    cache: kiln::JitCache,
}

impl Model {
    /// A [`Session`] over this model.
    pub fn session(&self) -> Session<'_> {
        Session { model: self, cache: kiln::JitCache::new() }
    }
}

impl Session<'_> {
    /// Runs the model on `inputs` (compiling it first for a new input signature); the outputs are
    /// realized. The same errors as [`Model::run`], plus a shape computed from an input's value
    /// at import time (a `Shape` whose dims are read), which a compiled function cannot know
    /// before it runs: [`Model::run`] handles such models.
    pub fn run(&mut self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let model = self.model;
        self.cache.call(inputs, |args: &[Tensor]| kiln::no_grad(|| model.run(args)))
    }

    /// How many signatures were traced (and compiled) so far.
    pub fn traces(&self) -> usize {
        self.cache.traces()
    }
}
