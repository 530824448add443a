//! nn: layers, models, losses and optimizers on the public `kiln` tensor API.
