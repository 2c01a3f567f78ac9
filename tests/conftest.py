import os

import pytest
import torch

# Equivalence tests compare float64 runs to 1e-12; keep torch single-threaded so that
# reductions are not split differently between the engines' differently shaped calls.
torch.set_num_threads(1)
# Where a GPU is, cuBLAS's deterministic workspace is set before any test starts CUDA, as a run
# sets it (focusfl/device.py: it cannot come later); the gpu-marked tests apply the policy itself.
if torch.cuda.is_available():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(autouse=True)
def no_orphans():
    """Processes a test started with cli_harness.popen_cli never outlive it."""
    yield
    from cli_harness import stop_started

    stop_started()
