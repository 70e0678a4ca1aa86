"""The end-of-run weights verdict: NaN weights are named even when both sides hold the same bits."""

from arl_train.weights_check import weights_check_line


def check(**changes):
    base = {"equal": True, "problems": [], "probe_logprob_max_abs_diff": 0.0, "version": 7}
    return {**base, "finite": True, "nonfinite": [], **changes}


def test_equal_and_finite_weights_read_as_equal():
    assert weights_check_line(check()) == "arl: engine weights equal to the trainer's at version 7"


def test_nan_weights_are_named_before_equality():
    line = weights_check_line(check(finite=False, nonfinite=["model.norm.weight", "lm_head.weight"]))
    assert (
        line == "arl: the trainer's weights hold NaN or inf at version 7: model.norm.weight, lm_head.weight"
    )


def test_different_weights_name_the_tensors():
    line = weights_check_line(check(equal=False, problems=["replica0:mismatched:rank0:lm_head.weight"]))
    assert "differ from the trainer's at version 7: replica0:mismatched:rank0:lm_head.weight" in line
