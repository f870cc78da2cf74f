"""Scheduler model: a discrete-event simulation of the device scheduler."""
from .hardware import Hardware, OpTiming
from .model import DeadlockError, SimResult, check_lists, simulate
from .predict import layer_costs, predict_layer, skewed_expert_tokens
from .work import OpWork, op_work

__all__ = [
    "Hardware",
    "OpTiming",
    "DeadlockError",
    "SimResult",
    "check_lists",
    "simulate",
    "layer_costs",
    "predict_layer",
    "skewed_expert_tokens",
    "OpWork",
    "op_work",
]
