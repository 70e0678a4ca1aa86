"""Errors raised by arl-rollout. All derive from `RolloutError`."""


class RolloutError(Exception):
    """Base of every error arl-rollout raises."""


class UnknownAgentLoopError(RolloutError, KeyError):
    """A task named an agent loop that is not registered."""


class UnknownRewardError(RolloutError, KeyError):
    """A task named a reward function that is not registered."""


class DatasetError(RolloutError, ValueError):
    """A dataset file is missing, of an unknown format, or has a malformed row (the row is named)."""


class EngineConfigError(RolloutError, ValueError):
    """An engine config field (`VllmEngineConfig`, `TorchEngineConfig`) is out of range; the message
    starts with the field's name."""


class EngineError(RolloutError):
    """An inference engine failed or did not answer in time."""


class GenerateTimeoutError(EngineError):
    """An engine did not finish a request within the generate timeout (the rollouter drops that sample, counted)."""


class EngineDeadError(EngineError):
    """An engine replica is gone (its process or actor died); the server manager fails its requests over."""


class NoHealthyReplicaError(EngineError):
    """Every engine replica died: generation cannot go on."""


class WeightSyncError(RolloutError):
    """Weights could not be loaded into an engine; the engine keeps its previous weights."""
