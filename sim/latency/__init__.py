"""Iteration latency models: how long one engine step takes, given what the scheduler put in it."""

from sim.latency._base import PART_NAMES, LatencyModel, StepParts, StepShape
from sim.latency._constant import LinearStepModel
from sim.latency._roofline import LatencyCoefficients, RooflineModel

__all__ = ["LatencyCoefficients", "LatencyModel", "LinearStepModel", "PART_NAMES", "RooflineModel", "StepParts", "StepShape"]
