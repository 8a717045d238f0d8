"""Iteration latency models: how long one engine step takes, given what the scheduler put in it."""

from sim.latency._base import PART_NAMES, LatencyModel, StepParts, StepShape
from sim.latency._constant import LinearStepModel
from sim.latency._profile_file import (PROFILE_KIND, LatencyProfile, add_client_latency, coefficients_from_mapping,
                                       describe_device, load_profile, machine_device, read_profile, same_device,
                                       with_client_timeouts)
from sim.latency._roofline import LatencyCoefficients, RooflineModel
from sim.latency._scaled import ScaledLatency

__all__ = ["LatencyCoefficients", "LatencyModel", "LatencyProfile", "LinearStepModel", "PART_NAMES", "PROFILE_KIND",
           "RooflineModel", "ScaledLatency", "StepParts", "StepShape", "add_client_latency",
           "coefficients_from_mapping", "describe_device", "load_profile", "machine_device", "read_profile",
           "same_device", "with_client_timeouts"]
