"""The model's fused paths: the chunked linear + cross-entropy (loss), and Triton kernels used on a CUDA GPU where
Triton is present (dispatch says where, and alone imports them): the cross-entropy loss and its gradient over a
chunk's logits (cross_entropy), QK-norm and rotary embeddings in one pass (fused_qk)."""
from gpt.kernels.dispatch import compile_ahead, precompile  # noqa: F401 - train.py's, before the first step
