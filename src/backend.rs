//! Running an air graph on a device: the single place that dispatches on [`Device`].

use air::{Bindings, Graph, HostTensor};

use crate::device::Device;
use crate::error::Result;

/// Runs `graph` on `device`. `inputs[slot]` feeds the `Input { slot }` node, `bindings` gives the
/// value of every symbol in the graph's shapes, and the result holds one host tensor per entry of
/// `graph.outputs()`, in order.
pub fn execute(device: Device, graph: &Graph, inputs: Vec<HostTensor>, bindings: &Bindings) -> Result<Vec<HostTensor>> {
    crate::stats::record_execution(graph.len());
    match device {
        Device::Interp => Ok(air::interp::eval(graph, &inputs, bindings)?),
    }
}
