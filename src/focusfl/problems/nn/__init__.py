"""Neural networks as federated problems (problem.py), in three parts: the clients' data and their
keyed draws (data.py), the grouped formulation per device (formulation.py), evaluation
(evaluation.py)."""
from .data import (AUGMENT_PADDING, CROP_TABLE_BYTES, ClientData, carve_validation, channel_statistics, crop_flip,
                   split_test, standard_strides)
from .evaluation import Evaluation
from .formulation import DRAW_AHEAD_BYTES, GroupedFormulation
from .problem import MODEL_COPIES, NeuralNetwork, with_data_options

__all__ = ["AUGMENT_PADDING", "CROP_TABLE_BYTES", "DRAW_AHEAD_BYTES", "MODEL_COPIES", "ClientData", "Evaluation",
           "GroupedFormulation", "NeuralNetwork", "carve_validation", "channel_statistics", "crop_flip", "split_test",
           "standard_strides", "with_data_options"]
