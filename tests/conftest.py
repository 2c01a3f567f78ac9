import pytest
import torch

# Equivalence tests compare float64 runs to 1e-12; keep torch single-threaded so that
# reductions are not split differently between the engines' differently shaped calls.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def no_orphans():
    """Processes a test started with cli_harness.popen_cli never outlive it."""
    yield
    from cli_harness import stop_started

    stop_started()
