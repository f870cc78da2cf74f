"""Muse Spark Open: shapes, formats, synthetic weights, decode state, cases,
the formula-level reference, and the lowering to gpuvm's instruction set."""
from .config import CONFIGS, SHARD, SMALL, MuseConfig
from .lowering import LayerProgram, bind_layer, emit_layer, lower_layer
from .reference import RefOut, reference_layer
from .state import DecodeState, make_inputs, make_state
from .weights import LayerWeights, make_layer_weights

__all__ = [
    "CONFIGS", "SHARD", "SMALL", "MuseConfig", "LayerProgram", "bind_layer", "emit_layer", "lower_layer",
    "RefOut", "reference_layer", "DecodeState", "make_inputs", "make_state", "LayerWeights", "make_layer_weights",
]
