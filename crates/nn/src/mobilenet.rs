//! A MobileNet-v1-style classifier: a strided 3x3 stem, depthwise-separable blocks (3x3
//! depthwise conv + BatchNorm + ReLU, then 1x1 pointwise conv + BatchNorm + ReLU), global average
//! pooling and a linear classifier.

use kiln::Tensor;

use crate::Module;
use crate::conv::Conv2d;
use crate::error::Result;
use crate::linear::Linear;
use crate::norm::BatchNorm2d;

/// A convolution (no bias), BatchNorm and ReLU.
#[derive(Module)]
struct ConvBn {
    #[module]
    conv: Conv2d,
    #[module]
    bn: BatchNorm2d,
}

impl ConvBn {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.bn.forward(&self.conv.forward(x)).relu()
    }
}

/// One depthwise-separable block: a 3x3 depthwise `ConvBn`, then a 1x1 pointwise one.
#[derive(Module)]
struct Separable {
    #[module]
    dw: ConvBn,
    #[module]
    pw: ConvBn,
}

/// MobileNet v1 (scaled down): names `stem.{conv,bn}`, `blocks.{i}.dw.{conv,bn}`,
/// `blocks.{i}.pw.{conv,bn}`, `fc`.
#[derive(Module)]
pub struct MobileNet {
    #[module]
    stem: ConvBn,
    #[module]
    blocks: Vec<Separable>,
    /// The classifier.
    #[module]
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
            list.push(Separable { dw: conv_bn(c, c, 3, stride, c)?, pw: conv_bn(c, out, 1, 1, 1)? });
            c = out;
        }
        Ok(MobileNet { stem, blocks: list, fc: Linear::new(c, classes, true) })
    }
}

impl Module for MobileNet {
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut x = self.stem.forward(x);
        for block in &self.blocks {
            x = block.pw.forward(&block.dw.forward(&x));
        }
        self.fc.forward(&x.mean(&[2, 3]))
    }
}
