"""specdec: speculative decoding of HuggingFace causal LMs on top of the specdec_kernels ops."""
