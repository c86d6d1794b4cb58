"""What validation's table means for the export (optimum_dynamo/validate/gate.py): thresholds in proportion to an
output's size where its values exceed 10, since float32 rounding is relative."""

import pytest

from optimum_dynamo.validate import Discrepancy, GrossMismatch, gate


def test_large_logits_get_thresholds_in_proportion():
    gate([Discrepancy("logits", 7.03e-2, 7.4e-5, 1, 3, magnitude=950.0)], atol=None)  # SwiftFormer's rounding
    with pytest.raises(GrossMismatch) as refused:
        gate([Discrepancy("logits", 1.5, 1e-3, 1, 3, magnitude=950.0)], atol=None)
    assert str(refused.value) == ("output 'logits' differs from PyTorch by 1.500e+00 > 0.95 (call 1): the graph is "
                                  "wrong; an explicit --atol above the difference writes it anyway")


def test_small_outputs_keep_the_absolute_thresholds():
    with pytest.raises(GrossMismatch, match=r"^output 'logits' differs from PyTorch by 2\.000e-02 > 0\.01 \(call 0\)"):
        gate([Discrepancy("logits", 2e-2, 1e-2, 0, 2, magnitude=3.0)], atol=None)


def test_the_output_furthest_beyond_its_threshold_is_named():
    rows = [Discrepancy("logits", 5e-2, 1e-4, 0, 2, magnitude=900.0), Discrepancy("pred_boxes", 2e-2, 4e-2, 1, 2,
                                                                                  magnitude=1.0)]
    with pytest.raises(GrossMismatch, match=r"^output 'pred_boxes' differs from PyTorch by 2\.000e-02 > 0\.01 \(call 1\)"):
        gate(rows, atol=None)


def test_an_explicit_atol_stays_absolute():
    from optimum_dynamo.errors import ExportError

    with pytest.raises(ExportError, match=r"^output 'logits' differs from PyTorch by 7\.030e-02 > atol 0\.001 \(call 1\)$"):
        gate([Discrepancy("logits", 7.03e-2, 7.4e-5, 1, 3, magnitude=950.0)], atol=1e-3)
