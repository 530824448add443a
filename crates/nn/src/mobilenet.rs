//! A MobileNet-v1-style classifier: a strided 3x3 stem, depthwise-separable blocks (3x3
//! depthwise conv + BatchNorm + ReLU, then 1x1 pointwise conv + BatchNorm + ReLU), global average
//! pooling and a linear classifier.

use kiln::Tensor;

use crate::conv::Conv2d;
use crate::error::Result;
use crate::linear::Linear;
use crate::module::{Module, ParamKind, join, visit_child, visit_child_mut};
use crate::norm::BatchNorm2d;

/// A convolution (no bias), BatchNorm and ReLU.
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBn {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.bn.forward(&self.conv.forward(x)).relu()
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        visit_child(&self.conv, &join(prefix, "conv"), f);
        visit_child(&self.bn, &join(prefix, "bn"), f);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        visit_child_mut(&mut self.conv, &join(prefix, "conv"), f);
        visit_child_mut(&mut self.bn, &join(prefix, "bn"), f);
    }
}

/// MobileNet v1 (scaled down): names `stem.{conv,bn}`, `blocks.{i}.dw.{conv,bn}`,
/// `blocks.{i}.pw.{conv,bn}`, `fc`.
pub struct MobileNet {
    stem: ConvBn,
    blocks: Vec<(ConvBn, ConvBn)>,
    /// The classifier.
    pub fc: Linear,
}

impl MobileNet {
    /// A network for `in_channels`-channel images: a stem of `stem_channels` with stride 2, then
    /// one depthwise-separable block per `(out_channels, stride)` of `blocks`, and `classes`
    /// outputs. BatchNorm eps is `1e-5`.
    pub fn new(
        in_channels: usize,
        stem_channels: usize,
        blocks: &[(usize, usize)],
        classes: usize,
    ) -> Result<MobileNet> {
        let conv_bn = |cin: usize, cout: usize, k: usize, stride: usize, groups: usize| -> Result<ConvBn> {
            let pad = k / 2;
            Ok(ConvBn {
                conv: Conv2d::new(cin, cout, (k, k), (stride, stride), (pad, pad), groups, false)?,
                bn: BatchNorm2d::new(cout, 1e-5),
            })
        };
        let stem = conv_bn(in_channels, stem_channels, 3, 2, 1)?;
        let mut c = stem_channels;
        let mut list = Vec::with_capacity(blocks.len());
        for &(out, stride) in blocks {
            list.push((conv_bn(c, c, 3, stride, c)?, conv_bn(c, out, 1, 1, 1)?));
            c = out;
        }
        Ok(MobileNet { stem, blocks: list, fc: Linear::new(c, classes, true) })
    }
}

impl Module for MobileNet {
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut x = self.stem.forward(x);
        for (dw, pw) in &self.blocks {
            x = pw.forward(&dw.forward(&x));
        }
        self.fc.forward(&x.mean(&[2, 3], false))
    }

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        self.stem.visit("stem", f);
        for (i, (dw, pw)) in self.blocks.iter().enumerate() {
            let prefix = format!("blocks.{i}");
            dw.visit(&join(&prefix, "dw"), f);
            pw.visit(&join(&prefix, "pw"), f);
        }
        visit_child(&self.fc, "fc", f);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        self.stem.visit_mut("stem", f);
        for (i, (dw, pw)) in self.blocks.iter_mut().enumerate() {
            let prefix = format!("blocks.{i}");
            dw.visit_mut(&join(&prefix, "dw"), f);
            pw.visit_mut(&join(&prefix, "pw"), f);
        }
        visit_child_mut(&mut self.fc, "fc", f);
    }
}
