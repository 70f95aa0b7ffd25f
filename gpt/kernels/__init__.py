"""The model's fused paths: the chunked linear + cross-entropy (loss), and Triton kernels used on a CUDA GPU where
Triton is present (dispatch says where, and alone imports them): the cross-entropy loss and its gradient over a
chunk's logits (cross_entropy), QK-norm and rotary embeddings in one pass (fused_qk), LayerNorm (layer_norm); and
the processes that compile them while train.py starts (ahead). Nothing here imports torch at the package's import:
ahead's compilers load the kernels without it."""
