"""ninfer.model.layers: the model's ops as plain functions (reference twins of future kernels)."""
