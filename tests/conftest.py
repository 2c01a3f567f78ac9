import os
import sys
from pathlib import Path

# This checkout's sources, not an installed copy, in this process and in every process it starts
# (a sweep's workers, Ray's): the console script's subprocesses get them from cli_harness.cli_env,
# and the tests that call focusfl.cli.main in this process must test the same code.
SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

import pytest  # noqa: E402
import torch  # noqa: E402

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
