"""Errors raised by arl-trainer. All derive from `TrainerError`."""


class TrainerError(Exception):
    """Base of every error arl-trainer raises."""


class AlgorithmError(TrainerError, ValueError):
    """An algorithm function got inputs it cannot use (mismatched shapes, bad config, missing tensor)."""


class TrainerConfigError(TrainerError, ValueError):
    """A `TrainerConfig` or `OptimConfig` field is out of range; the message starts with the field's name."""


class BatchError(TrainerError, ValueError):
    """Samples could not be assembled into a batch (e.g. mismatched lengths in a response)."""


class StarvedError(TrainerError, TimeoutError):
    """The trainer waited longer than its timeout for samples: the rollout side is stuck or dead."""


class RouterReplayError(TrainerError, ValueError):
    """MoE routing replay cannot run: no MoE router in the model, or routes of the wrong shape or range."""


class ReferencePolicyError(TrainerError, ValueError):
    """The frozen reference policy of KL regularisation cannot be built or used (no reference held,
    or a reference model whose parameters do not match the policy's)."""


class CheckpointError(TrainerError, OSError):
    """A checkpoint cannot be written where it was asked for (e.g. not enough free disk for it); the
    previous checkpoint in that place is left as it was."""


class NonFiniteGradientError(TrainerError, FloatingPointError):
    """Updates kept getting a NaN or inf gradient norm: more in a row than
    `OptimConfig.max_nonfinite_skips` (each was skipped; the weights are those before the first)."""


class GemmCorrectnessError(TrainerError, RuntimeError):
    """GEMMs on this device return wrong values (seen under an MPS SM cap) and no cuBLASLt SM target
    made them right (`arl.trainer.gemm_check`)."""
