import torch

# Equivalence tests compare float64 runs to 1e-12; keep torch single-threaded so that
# reductions are not split differently between the engines' differently shaped calls.
torch.set_num_threads(1)
