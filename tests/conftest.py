import os

# No test may reach the network (Hub, dataset downloads); set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch

# Without CUDA, Triton kernels run in Triton's CPU interpreter (read when the kernels are built, on first use); with
# CUDA they are compiled for the GPU, and the attention tests also run on it (tests/test_attention_implementations.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny test models are dominated by thread hand-off on 2 shared cores; one thread is much faster.
torch.set_num_threads(1)
