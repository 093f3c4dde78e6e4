//! NeuralCache: access events in, prefetch requests out. Pure: no I/O, no clocks of its own.
