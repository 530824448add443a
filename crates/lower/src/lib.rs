//! lower: rewrites, autodiff, fusion/scheduling into kernels, and memory planning.
