"""Tagging-scheme constraints of the CRF (`jbert/model/tagging_schemes.py`): the transitions IOB2 and IOBES (and
BILOU read as IOBES) allow, the scheme recognised from label names, IO's plain tags, and bad labels or constraints
refused with the fix."""
import numpy as np
import pytest

from jbert.model import tagging_schemes


def test_iob2_and_iobes_constraints():
  allowed, start, end = tagging_schemes.constraints_for(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]).arrays()
  np.testing.assert_array_equal(allowed, [  # rows: previous tag; columns: next tag
      [1, 1, 0, 1, 0],
      [1, 1, 1, 1, 0],
      [1, 1, 1, 1, 0],
      [1, 1, 0, 1, 1],
      [1, 1, 0, 1, 1]])
  np.testing.assert_array_equal(start, [1, 1, 0, 1, 0])
  assert end.all()
  labels = ["O", "B-X", "I-X", "E-X", "S-X"]
  assert tagging_schemes.scheme_of(labels) == "iobes"
  assert tagging_schemes.scheme_of(["O", "B-X", "I-X", "L-X", "U-X"]) == "iobes"  # BILOU
  allowed, start, end = tagging_schemes.constraints_for(labels).arrays()
  np.testing.assert_array_equal(allowed, [
      [1, 1, 0, 0, 1],
      [0, 0, 1, 1, 0],
      [0, 0, 1, 1, 0],
      [1, 1, 0, 0, 1],
      [1, 1, 0, 0, 1]])
  np.testing.assert_array_equal(start, [1, 1, 0, 0, 1])
  np.testing.assert_array_equal(end, [1, 0, 0, 1, 1])
  # Labels that are no scheme's get no constraints by default, and a clear error when one is asked for.
  assert tagging_schemes.scheme_of(["O", "I-PER", "I-LOC", "B-LOC"]) is None  # IOB1: I-PER could never be entered
  assert tagging_schemes.constraints_for(["POS", "NEG"]) is None
  # Plain tags are IO: every transition allowed (no constraints), and prefixed labels are no IO tags.
  assert tagging_schemes.scheme_of(["O", "PER", "LOC"]) == tagging_schemes.scheme_of(["POS", "NEG"]) == "io"
  assert tagging_schemes.scheme_of(["O", "B-PER", "I-PER", "LOC"]) is None  # mixed: no scheme
  assert tagging_schemes.constraints_for(["O", "PER", "LOC"], "io") is None
  assert np.array(tagging_schemes.scheme_constraints(["O", "PER", "LOC"], "io").transitions).all()
  with pytest.raises(ValueError, match=r"Label 'B-X' is not an IO tag \(O or a plain TYPE such as PER\)"):
    tagging_schemes.constraints_for(["O", "B-X", "I-X"], "io")
  with pytest.raises(ValueError, match=r"Label 'PER' is not an IOB2 tag"):
    tagging_schemes.constraints_for(["O", "PER"], "iob2")
  assert tagging_schemes.constraints_for(["O", "B-X", "I-X"], "none") is None
  with pytest.raises(ValueError, match=r"Label 'E-X' is not an IOB2 tag .*turn the CRF's constraints off"):
    tagging_schemes.constraints_for(labels, "iob2")
  with pytest.raises(ValueError, match="Unknown tagging scheme 'bio'"):
    tagging_schemes.constraints_for(labels, "bio")
  with pytest.raises(ValueError, match="allow no start tag"):
    tagging_schemes.Constraints(np.ones((2, 2)), start=[0, 0])
  with pytest.raises(ValueError, match=r"non-empty \[C, C\] matrix"):
    tagging_schemes.Constraints(np.ones((2, 3)))
  assert hash(tagging_schemes.constraints_for(labels)) == hash(tagging_schemes.constraints_for(labels))
