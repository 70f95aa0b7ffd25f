"""Triton kernels, used on a CUDA GPU where Triton is present: the cross-entropy loss and its gradient over a
chunk's logits (cross_entropy), QK-norm and rotary embeddings in one pass (fused_qk)."""
